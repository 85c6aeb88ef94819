#!/usr/bin/env bash
# Data-parallel scaling of `athanor train` on this machine: a small byte-level GPT on the
# Brown corpus, the same global batch (16 × 128 tokens) for every row:
#   1 process × 1 thread (batch 16), 1 process × 2 threads (batch 16),
#   2 processes × 1 thread each under mpirun (batch 8 per rank, DDP), and ZeRO-2.
# Prints tokens/s (median over the steps after warm-up), step time, and the
# communication wait per step (comm_s: the wait in finish_backward for the bucket
# reductions still in flight after backward). The facade does not time each all-reduce
# whole, so the hidden fraction is estimated against a run with one bucket for all
# gradients (dist.bucket_mb 1024): its all-reduce starts after the last gradient, so its
# wait is the whole all-reduce. The model has ~3.4 MB of gradients: the DDP rows use
# 0.5 MiB buckets so that reductions overlap backward (25 MiB would be one bucket).
#   usage: bench/dist_scaling.sh [BUILD_DIR] [STEPS]
set -euo pipefail
source "$(dirname "$0")/run_setup.sh" dist_scaling 30 "$@"
cat > "$WORK/gpt.yaml" <<EOF
seed: 1337
model: {type: gpt, n_layer: 4, n_head: 4, n_embd: 128, block_size: 128, dropout: 0.0}
data: {$DATA, num_workers: 1}
optimizer: {type: adamw, lr: 1.0e-3, grad_clip: 1.0}
trainer: {max_steps: $STEPS, batch_size: 16, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 1}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
EOF
MPI="mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS"

# summary RUN_DIR -> "tok/s step_s comm_s" (medians over steps > 5)
summary() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"throughput"' in l]
rows = [r for r in rows if r["step"] > 5] or rows
med = lambda k: statistics.median(r[k] for r in rows)
print(f'{med("throughput"):.0f} {med("step_s"):.4f} {med("comm_s"):.4f}')
PY
}

run() {  # name threads np overrides...
  local name=$1 threads=$2 np=$3; shift 3
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=$threads "$CLI" train "$WORK/gpt.yaml" out_dir="$WORK/runs" name="$name" dist.backend=none "$@" > "$WORK/$name.log" 2>&1
  else
    OMP_NUM_THREADS=$threads $MPI -np "$np" "$CLI" train "$WORK/gpt.yaml" out_dir="$WORK/runs" name="$name" "$@" > "$WORK/$name.log" 2>&1
  fi || { echo "run $name failed:"; tail -20 "$WORK/$name.log"; exit 1; }
  summary "$WORK/runs/$name"
}

echo "athanor dist scaling: GPT 4x128, T=128, global batch 16, AdamW, $STEPS steps (medians of steps > 5)"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-38s %10s %10s %12s\n' "configuration" "tok/s" "step s" "comm wait s"
read -r t1 s1 c1 < <(run p1_t1 1 1 trainer.batch_size=16)
printf '%-38s %10s %10s %12s\n' "1 process x 1 thread" "$t1" "$s1" "-"
read -r t2 s2 c2 < <(run p1_t2 2 1 trainer.batch_size=16)
printf '%-38s %10s %10s %12s\n' "1 process x 2 threads" "$t2" "$s2" "-"
read -r t3 s3 c3 < <(run p2_ddp 1 2 trainer.batch_size=8 dist.zero_stage=0 dist.bucket_mb=0.5)
printf '%-38s %10s %10s %12s\n' "2 processes x 1 thread (DDP, 0.5MiB)" "$t3" "$s3" "$c3"
read -r t4 s4 c4 < <(run p2_zero2 1 2 trainer.batch_size=8 dist.zero_stage=2 dist.bucket_mb=0.5)
printf '%-38s %10s %10s %12s\n' "2 processes x 1 thread (ZeRO-2)" "$t4" "$s4" "$c4"
# One bucket holding every gradient: its all-reduce starts only after the last gradient, so
# the wait is the whole all-reduce (nothing overlapped) — the reference for the hidden fraction.
read -r t5 s5 c5 < <(run p2_onebucket 1 2 trainer.batch_size=8 dist.zero_stage=0 dist.bucket_mb=1024)
printf '%-38s %10s %10s %12s\n' "2 processes, 1 bucket (no overlap)" "$t5" "$s5" "$c5"
python3 - "$t1" "$t3" "$c3" "$c5" <<'PY'
import sys
t1, t3, c3, c5 = map(float, sys.argv[1:])
print(f"speed-up 2 processes (DDP) vs 1 process x 1 thread: {t3 / t1:.2f}x")
if c5 > 0:
    print(f"comm wait per step: {c3*1e3:.1f} ms with 0.5 MiB buckets vs {c5*1e3:.1f} ms unoverlapped (one bucket): "
          f"~{max(0.0, 1 - c3 / c5) * 100:.0f}% of the all-reduce hidden behind backward")
PY
