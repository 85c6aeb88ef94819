#!/usr/bin/env bash
# The pipeline bubble on this machine, measured from the pipeline executor's own clocks:
# `athanor train` of a byte-level GPT (8 layers, d 256, T 128, micro-batch 8: compute
# dominates the 1 MiB activation transfers) at pp 2, one process per core (no
# oversubscription), 1 OpenMP thread each, for every schedule with m = 4 and 8 micro-batches.
# Each step's metrics.jsonl record holds the measured bubble (idle / step time, mean over the
# pp ranks, "pipeline".bubble) next to the schedule's theory ("pipeline".theory: (p-1)/(m+p-1)
# for GPipe and 1F1B, (p-1)/(vm+p-1) for interleaved, ZB-H1's simulated with equal F, B, W).
# Prints the medians over the steps after the 2nd.
#   usage: bench/pp_bubble.sh [BUILD_DIR] [STEPS]
set -euo pipefail
source "$(dirname "$0")/run_setup.sh" pp_bubble 8 "$@"
cat > "$WORK/gpt.yaml" <<EOF2
seed: 1337
model: {type: gpt, n_layer: 8, n_head: 4, n_embd: 256, block_size: 128, dropout: 0.0}
data: {$DATA, num_workers: 0}
optimizer: {type: adamw, lr: 1.0e-3, grad_clip: 1.0}
schedule: {warmup_steps: 1}
trainer: {max_steps: $STEPS, batch_size: 8, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 1}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
dist: {pp: 2}
EOF2
# Open MPI's default shared-memory transport (single-copy CMA): a transfer completes when the
# receiver takes it, without the sender's help (see RESULTS.md for btl_vader_single_copy_mechanism none).
MPI="mpirun --allow-run-as-root --bind-to core -x OMP_NUM_THREADS"

summary() {  # RUN_DIR -> "bubble theory step_s recv_wait_s" (medians over steps > 2)
  python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"pipeline"' in l]
rows = [r for r in rows if r["step"] > 2] or rows
med = lambda f: statistics.median(f(r) for r in rows)
print(f'{100 * med(lambda r: r["pipeline"]["bubble"]):.1f}% {100 * med(lambda r: r["pipeline"]["theory"]):.1f}% '
      f'{med(lambda r: r["pipeline"]["schedule_s"]):.3f} {med(lambda r: r["pipeline"]["recv_wait_s"]):.3f}')
PY
}

echo "athanor pipeline bubble: GPT 8x256, T=128, micro-batch 8, pp 2 (1 process per core, 1 thread), $STEPS steps (medians of steps > 2)"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-14s %3s %10s %10s %12s %14s\n' "schedule" "m" "bubble" "theory" "schedule s" "rank 0 wait s"
for m in 4 8; do
  for s in gpipe 1f1b interleaved zb-h1; do
    extra=""
    [ "$s" = interleaved ] && extra="dist.virtual_stages=2"
    OMP_NUM_THREADS=1 $MPI -np 2 "$CLI" train "$WORK/gpt.yaml" out_dir="$WORK/runs" name="$s-$m" trainer.accum_steps=$m \
      dist.pp_schedule=$s $extra > "$WORK/$s-$m.log" 2>&1 || { echo "run $s m $m failed:"; tail -20 "$WORK/$s-$m.log"; exit 1; }
    read -r b t st w < <(summary "$WORK/runs/$s-$m")
    printf '%-14s %3s %10s %10s %12s %14s\n' "$s" "$m" "$b" "$t" "$st" "$w"
  done
done
