#!/usr/bin/env bash
# What a new user hits trying the README's commands on a small run:
#  - export-hf on a run without checkpoints exports its final model.safetensors; with
#    checkpoints, the newest weights (final or checkpoint, by step);
#  - eval reports the step the run finished at, not 0;
#  - errors raised in apps/ name their source relative to the project (apps/athanor/…);
#  - a checkpoints/latest that names a missing checkpoint is said, not bypassed silently.
#   test_cli_papercuts.sh /path/to/athanor
set -u
ATHANOR=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL $1"; [[ $# -gt 1 ]] && echo "$2" | sed 's/^/    /'; failures=$((failures + 1)); }
ok() { echo "ok   $1"; }

for i in $(seq 1 300); do printf 'the quick brown fox jumps over the lazy dog %d. ' $((i % 17)); done > "$WORK/book.txt"
# run NAME STEPS CHECKPOINT_EVERY: trains a tiny GPT to STEPS.
run() {
  printf 'name: %s\nout_dir: %s/runs\nmodel: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n' "$1" "$WORK" > "$WORK/$1.yaml"
  printf 'data: {type: text, tokenizer: byte, corpus: %s/book.txt, cache_dir: %s/cache, num_workers: 0}\n' "$WORK" "$WORK" >> "$WORK/$1.yaml"
  printf 'optimizer: {type: adamw, lr: 0.01}\ntrainer: {max_steps: %d, batch_size: 4, eval_every: 0, eval_batches: 2, sample_tokens: 4}\n' "$2" >> "$WORK/$1.yaml"
  printf 'checkpoint: {every: %d, keep_last: 0}\nobserve: {tensorboard: false, report: false, peak_gflops: 1.0}\n' "$3" >> "$WORK/$1.yaml"
  "$ATHANOR" train "$WORK/$1.yaml" > "$WORK/$1.log" 2>&1 || { fail "train $1" "$(cat "$WORK/$1.log")"; return 1; }
}
# same_wte A B: the token embeddings of two safetensors files are the same bytes (f32 both).
same_wte() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, struct, sys
def wte(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        key = next(k for k in header if k.endswith("wte.weight"))
        begin, end = header[key]["data_offsets"]
        f.seek(8 + n + begin)
        return header[key]["dtype"], f.read(end - begin)
a, b = wte(sys.argv[1]), wte(sys.argv[2])
sys.exit(0 if a == b else 1)
EOF
}

# 1. No checkpoints, only the final weights (the README's demo run).
run plain 7 0 || exit 1
out=$("$ATHANOR" export-hf "$WORK/runs/plain" "$WORK/hf_plain" 2>&1)
if [[ $? -ne 0 ]]; then fail export-final-only "$out"
elif [[ ! -f "$WORK/hf_plain/model.safetensors" || ! -f "$WORK/hf_plain/config.json" ]]; then fail export-final-only "$out"
elif [[ "$out" != *"exported $WORK/runs/plain/model.safetensors to"* ]]; then fail export-final-only "$out"
elif ! same_wte "$WORK/runs/plain/model.safetensors" "$WORK/hf_plain/model.safetensors"; then fail "export-final-only: other weights" "$out"
else ok export-final-only; fi

# 2. eval says the step the run finished at.
out=$("$ATHANOR" eval "$WORK/runs/plain" 2>&1)
if [[ $? -ne 0 || "$out" != *"eval at step 7:"* ]]; then fail eval-step "$out"; else ok eval-step; fi

# 3. Checkpoints at 3, 6 and 7 (the last step's), final weights at 7: the final file (same
#    step). Without it: the newest checkpoint. A `latest` naming a missing checkpoint: a warning.
run ckpt 7 3 || exit 1
out=$("$ATHANOR" export-hf "$WORK/runs/ckpt" "$WORK/hf_ckpt" 2>&1)
if [[ $? -ne 0 || "$out" != *"exported $WORK/runs/ckpt/model.safetensors to"* ]]; then fail export-final-at-same-step "$out"
else ok export-final-at-same-step; fi
# A final file older than the newest checkpoint (the weights of a 4-step run of the same
# shapes): the checkpoint.
run short 4 0 || exit 1
cp "$WORK/runs/short/model.safetensors" "$WORK/runs/ckpt/model.safetensors"
out=$("$ATHANOR" export-hf "$WORK/runs/ckpt" "$WORK/hf_ckpt_newer" 2>&1)
if [[ $? -ne 0 || "$out" != *"exported $WORK/runs/ckpt/checkpoints/step-000007 to"* ]]; then fail export-checkpoint-newer "$out"
else ok export-checkpoint-newer; fi
rm "$WORK/runs/ckpt/model.safetensors"
out=$("$ATHANOR" export-hf "$WORK/runs/ckpt" "$WORK/hf_ckpt6" 2>&1)
if [[ $? -ne 0 || "$out" != *"exported $WORK/runs/ckpt/checkpoints/step-000007 to"* ]]; then fail export-checkpoint "$out"
elif ! same_wte "$WORK/runs/ckpt/checkpoints/step-000007/model.safetensors" "$WORK/hf_ckpt6/model.safetensors"; then
  fail "export-checkpoint: other weights" "$out"
else ok export-checkpoint; fi
printf 'step-000099\n' > "$WORK/runs/ckpt/checkpoints/latest"
out=$("$ATHANOR" export-hf "$WORK/runs/ckpt" "$WORK/hf_ckpt6b" 2>&1)
if [[ $? -ne 0 || "$out" != *"warning: $WORK/runs/ckpt/checkpoints/latest names 'step-000099', which is not in"* ||
      "$out" != *"exported $WORK/runs/ckpt/checkpoints/step-000007 to"* ]]; then fail export-stale-latest "$out"
else ok export-stale-latest; fi

# 4. Errors raised in apps/ name the file relative to the project, as those raised in src/ do.
out=$("$ATHANOR" export-hf "$WORK/nope" "$WORK/hf_nope" 2>&1)
if [[ $? -ne 1 || "$out" != *"config.yaml' does not exist"* || "$out" != *"  at apps/athanor/hf_command.cpp:"* ]]; then
  fail relative-path-apps "$out"
else ok relative-path-apps; fi
out=$("$ATHANOR" eval "$WORK" 2>&1)
if [[ $? -ne 1 || "$out" != *"  at apps/athanor/train_commands.cpp:"* ]]; then fail relative-path-eval "$out"; else ok relative-path-eval; fi
printf 'trainer:\n  max_stpes: 3\n' > "$WORK/bad.yaml"
out=$("$ATHANOR" train "$WORK/bad.yaml" 2>&1)
if [[ $? -ne 1 || "$out" != *"  at src/train/"* ]]; then fail relative-path-src "$out"; else ok relative-path-src; fi

if [[ $failures -eq 0 ]]; then echo "cli papercuts: all cases passed"; exit 0; fi
echo "cli papercuts: $failures case(s) failed"
exit 1
