#!/usr/bin/env bash
# `athanor plan` on a Llama config: the predicted peak bytes of a single-process run against the
# allocator's measured peak of the same config trained by `athanor train` (f32 and bf16, within
# 10%, as bench/plan_check.sh's table), and the Llama's bad inputs from the command line.
#   test_plan_llama.sh /path/to/athanor
set -u
ATHANOR=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export XDG_CACHE_HOME=$WORK/cache
source "$(dirname "${BASH_SOURCE[0]}")/../cli/expect_error.sh"

for _ in $(seq 40); do echo "The quick brown fox jumps over the lazy dog, again and again and again."; done > "$WORK/corpus.txt"
cat > "$WORK/llama.yaml" <<YAML
name: tiny-llama
seed: 7
model: {type: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, intermediate_size: 176, block_size: 64, tie_embeddings: false}
data: {type: text, corpus: $WORK/corpus.txt, tokenizer: byte, cache_dir: $WORK/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 1.0e-3}
trainer: {max_steps: 3, batch_size: 4, accum_steps: 1, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 2}
checkpoint: {every: 0}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
YAML
# This machine's kind of cluster (shared cores, so the CPU's packed GEMM copies count) without
# the mpirun probe the cpu preset runs once.
printf 'name: here\ndevices_per_node: 4\nmemory_gib: 1\npeak_tflops: {f32: 0.1}\nshared_compute: true\ncores: 2\n' > "$WORK/here.yaml"

for precision in f32 bf16; do
  if ! OMP_NUM_THREADS=1 "$ATHANOR" train "$WORK/llama.yaml" trainer.precision=$precision name=$precision out_dir="$WORK/runs" \
    > "$WORK/$precision.log" 2>&1; then
    echo "FAIL train $precision"; tail -20 "$WORK/$precision.log"; failures=$((failures + 1)); continue
  fi
  if ! "$ATHANOR" plan "$WORK/llama.yaml" trainer.precision=$precision --cluster "$WORK/here.yaml" --evaluate --world 1 --json \
    > "$WORK/$precision.json" 2> "$WORK/$precision.err"; then
    echo "FAIL plan $precision"; cat "$WORK/$precision.err"; failures=$((failures + 1)); continue
  fi
  python3 - "$WORK/$precision.json" "$WORK/runs/$precision/memory_ranks.json" "$precision" <<'PY' || failures=$((failures + 1))
import json, sys
plan, mem, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
pred, meas = plan["peak_bytes"], mem["ranks"][0]["peak_total"]
err = (pred - meas) / meas
print(f"{'ok  ' if abs(err) <= 0.10 else 'FAIL'} llama {what} single process: predicted {pred/1048576:.3f} MiB, "
      f"measured {meas/1048576:.3f} MiB ({100*err:+.1f}%)")
sys.exit(0 if abs(err) <= 0.10 else 1)
PY
done

expect_error llama-tp-does-not-divide-kv-heads 1 "n_kv_head 2 and tp 3 do not divide one another|key/value-head group|hint: choose tp dividing model.n_kv_head" \
  "$ATHANOR" plan "$WORK/llama.yaml" --cluster "$WORK/here.yaml" --evaluate --world 3 dist.tp=3
expect_error llama-kv-heads-do-not-divide-heads 1 "n_kv_head (3) must divide n_head (4)" \
  "$ATHANOR" plan "$WORK/llama.yaml" --cluster "$WORK/here.yaml" model.n_kv_head=3
expect_error llama-sequence-parallel 1 "does not model the Llama's sequence parallelism" \
  "$ATHANOR" plan "$WORK/llama.yaml" --cluster "$WORK/here.yaml" --evaluate --world 2 dist.tp=2 dist.sequence_parallel=true
expect_error llama-plan 0 "tiny-llama: llama|sharing 2 key/value heads|best: dp" \
  "$ATHANOR" plan "$WORK/llama.yaml" --cluster "$WORK/here.yaml"

[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
