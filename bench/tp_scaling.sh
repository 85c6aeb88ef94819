#!/usr/bin/env bash
# Tensor parallelism against data parallelism on this machine: `athanor train` of a small
# byte-level GPT on the Brown corpus, the same global batch (16 × 128 tokens) for every row:
#   1 process × 1 thread (batch 16); 2 processes × 1 thread: DDP (batch 8 per rank),
#   tp 2 (batch 16, each layer split), tp 2 with sequence parallelism.
# Prints tokens/s and the step time (medians over the steps after the 5th) and, from each
# step's communication ledger (metrics.jsonl "comm"), the wire bytes per step (what a ring
# implementation moves per rank: 0 on a one-rank group) and the summed posting-to-completion
# seconds per step of the dp and tp dimensions.
#   usage: bench/tp_scaling.sh [BUILD_DIR] [STEPS]
set -euo pipefail
source "$(dirname "$0")/run_setup.sh" tp_scaling 30 "$@"
cat > "$WORK/gpt.yaml" <<EOF2
seed: 1337
model: {type: gpt, n_layer: 4, n_head: 4, n_embd: 128, block_size: 128, dropout: 0.0}
data: {$DATA, num_workers: 1}
optimizer: {type: adamw, lr: 1.0e-3, grad_clip: 1.0}
trainer: {max_steps: $STEPS, batch_size: 16, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 1}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
EOF2
MPI="mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS"

# summary RUN_DIR -> "tok/s step_s dp_wire_MiB dp_s tp_wire_MiB tp_s" (medians over steps > 5)
summary() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"throughput"' in l]
rows = [r for r in rows if r["step"] > 5] or rows
med = lambda f: statistics.median(f(r) for r in rows)
comm = lambda r, d, k: r.get("comm", {}).get(d, {}).get(k, 0.0)
print(f'{med(lambda r: r["throughput"]):.0f} {med(lambda r: r["step_s"]):.4f} '
      f'{med(lambda r: comm(r, "dp", "wire_bytes")) / 2**20:.2f} {med(lambda r: comm(r, "dp", "s")):.4f} '
      f'{med(lambda r: comm(r, "tp", "wire_bytes")) / 2**20:.2f} {med(lambda r: comm(r, "tp", "s")):.4f}')
PY
}

run() {  # name np overrides...
  local name=$1 np=$2; shift 2
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=1 "$CLI" train "$WORK/gpt.yaml" out_dir="$WORK/runs" name="$name" dist.backend=none "$@" > "$WORK/$name.log" 2>&1
  else
    OMP_NUM_THREADS=1 $MPI -np "$np" "$CLI" train "$WORK/gpt.yaml" out_dir="$WORK/runs" name="$name" "$@" > "$WORK/$name.log" 2>&1
  fi || { echo "run $name failed:"; tail -20 "$WORK/$name.log"; exit 1; }
  summary "$WORK/runs/$name"
}

echo "athanor tp vs dp: GPT 4x128, T=128, global batch 16, AdamW, $STEPS steps (medians of steps > 5), 1 thread per process"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-34s %9s %8s %9s %8s %9s %8s\n' "configuration" "tok/s" "step s" "dp wire" "dp s" "tp wire" "tp s"
row() { printf '%-34s %9s %8s %9s %8s %9s %8s\n' "$@"; }
read -r a b c d e f < <(run p1 1 trainer.batch_size=16); row "1 process" "$a" "$b" "-" "-" "-" "-"
read -r a b c d e f < <(run ddp2 2 trainer.batch_size=8); row "2 processes, DDP" "$a" "$b" "$c" "$d" "-" "-"
read -r a b c d e f < <(run tp2 2 trainer.batch_size=16 dist.tp=2); row "2 processes, tp 2" "$a" "$b" "$c" "$d" "$e" "$f"
read -r a b c d e f < <(run tp2_sp 2 trainer.batch_size=16 dist.tp=2 dist.sequence_parallel=true); row "2 processes, tp 2 + sequence par." "$a" "$b" "$c" "$d" "$e" "$f"
