#!/usr/bin/env bash
# `athanor plan`'s memory and time model against real runs on this machine.
#   bench/plan_check.sh [BUILD_DIR] [--assert] [--only REGEX]
# For each configuration below (a tiny GPT across dp/tp/pp, ZeRO stage, recompute, precision,
# micro-batch and schedule), runs `athanor train` under mpirun for a few steps, then compares
#   predicted: athanor plan CONFIG OVERRIDES --cluster cpu --evaluate --world N --json
#              (each rank's pipeline stage's peak bytes)
#   measured:  runs/<name>/memory_ranks.json (each rank's allocator peak, the max over the steps)
# rank by rank, and the predicted step time against the median measured step_s of the steps
# after the first (metrics.jsonl). Prints a markdown table and the ranking's Spearman rho;
# --assert exits 1 when any rank's predicted peak is off by more than 10%.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
ASSERT=0
ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --assert) ASSERT=1 ;;
    --only) ONLY=$2; shift ;;
    *) BUILD=$1 ;;
  esac
  shift
done
CLI=$BUILD/apps/athanor/athanor
[ -x "$CLI" ] || { echo "error: $CLI not found; build athanor_cli first" >&2; exit 1; }
WORK=$(mktemp -d /tmp/athanor_plan_check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for _ in 1 2 3 4 5 6 7 8; do cat "$ROOT/README.md" "$ROOT/bench/RESULTS.md"; done > "$WORK/corpus.txt"
# The CPU cluster, measured once into the scratch directory (not the user's cache).
export XDG_CACHE_HOME=$WORK/cache
STEPS=6
cat > "$WORK/base.yaml" <<EOF
name: plan-check
seed: 7
model: {type: gpt, n_layer: 4, n_head: 4, n_embd: 64, block_size: 64, dropout: 0.0}
data: {type: text, corpus: $WORK/corpus.txt, tokenizer: byte, cache_dir: $WORK/data, num_workers: 0, val_fraction: 0.05}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1}
trainer: {max_steps: $STEPS, batch_size: 4, accum_steps: 1, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 4}
checkpoint: {every: 0}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
EOF

# name | processes | overrides
CONFIGS=(
  "f32_mb4|1|"
  "f32_mb2|1|trainer.batch_size=2"
  "f32_mb8|1|trainer.batch_size=8"
  "bf16_mb4|1|trainer.precision=bf16"
  "f32_recompute|1|model.gradient_checkpointing=true"
  "f32_accum2|1|trainer.accum_steps=2"
  "dp2_zero0|2|"
  "dp2_zero1|2|dist.zero_stage=1"
  "dp2_zero2|2|dist.zero_stage=2"
  "dp2_zero3|2|dist.zero_stage=3"
  "dp2_zero1_bf16|2|dist.zero_stage=1 trainer.precision=bf16"
  "dp2_zero3_bf16|2|dist.zero_stage=3 trainer.precision=bf16"
  "dp4_zero2|4|dist.zero_stage=2"
  "tp2|2|dist.tp=2"
  "tp2_sp|2|dist.tp=2 dist.sequence_parallel=true"
  "tp2_bf16_recompute|2|dist.tp=2 trainer.precision=bf16 model.gradient_checkpointing=true"
  "pp2_1f1b_m4|2|dist.pp=2 trainer.accum_steps=4"
  "pp2_gpipe_m4|2|dist.pp=2 dist.pp_schedule=gpipe trainer.accum_steps=4"
  "pp2_zbh1_m4|2|dist.pp=2 dist.pp_schedule=zb-h1 trainer.accum_steps=4"
  "pp2_interleaved_m4|2|dist.pp=2 dist.pp_schedule=interleaved dist.virtual_stages=2 trainer.accum_steps=4"
  "pp4_1f1b_m8|4|dist.pp=4 trainer.accum_steps=8 trainer.batch_size=2"
  "dp2_tp2_zero1|4|dist.tp=2 dist.zero_stage=1"
  "tp2_pp2_m4|4|dist.tp=2 dist.pp=2 trainer.accum_steps=4"
  "dp2_pp2_zero1_m4|4|dist.pp=2 dist.zero_stage=1 trainer.accum_steps=4"
)

echo "| config | np | layout | rank (dp,tp,pp) | predicted | measured | error | predicted step | measured step |" > "$WORK/table.md"
echo "|---|---|---|---|---|---|---|---|---|" >> "$WORK/table.md"
for entry in "${CONFIGS[@]}"; do
  IFS='|' read -r name np overrides <<< "$entry"
  if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
  # shellcheck disable=SC2086
  if [ "$np" -eq 1 ]; then
    OMP_NUM_THREADS=1 "$CLI" train "$WORK/base.yaml" $overrides name="$name" out_dir="$WORK/runs" > "$WORK/$name.out" 2>&1
  else
    OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS \
      -np "$np" "$CLI" train "$WORK/base.yaml" $overrides name="$name" out_dir="$WORK/runs" > "$WORK/$name.out" 2>&1
  fi
  if [ $? -ne 0 ]; then echo "run $name failed:"; tail -20 "$WORK/$name.out"; exit 1; fi
  # shellcheck disable=SC2086
  "$CLI" plan "$WORK/base.yaml" $overrides --cluster cpu --evaluate --world "$np" --json > "$WORK/$name.plan.json" 2> "$WORK/$name.plan.err"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then echo "plan $name failed:"; cat "$WORK/$name.plan.err"; exit 1; fi
  python3 - "$name" "$np" "$WORK/$name.plan.json" "$WORK/runs/$name/memory_ranks.json" "$WORK/runs/$name/metrics.jsonl" >> "$WORK/table.md" <<'EOF'
import json, statistics, sys
name, np_, plan_f, mem_f, met_f = sys.argv[1:6]
plan = json.load(open(plan_f))
mem = json.load(open(mem_f))
steps = [s for s in (json.loads(l) for l in open(met_f) if l.strip()) if "step_s" in s]
measured_step = statistics.median([s["step_s"] for s in steps[1:]] or [steps[0]["step_s"]])
for r in sorted(mem["ranks"], key=lambda r: r["rank"]):
    st = plan["stages"][r["pp"]]
    pred, meas = st["peak"], r["peak_total"]
    err = (pred - meas) / meas
    cats = " ".join(f"{k}={r['peak'][k]/1048576:.2f}/{st[k]/1048576:.2f}" for k in ("parameter", "gradient", "optimizer_state", "activation", "workspace", "packed_weights"))
    print(f"| {name} | {np_} | {plan['layout']} | {r['rank']} ({r['dp']},{r['tp']},{r['pp']}) | {pred/1048576:.2f} MiB | {meas/1048576:.2f} MiB | {100*err:+.1f}% | {plan['step_s']*1000:.1f} ms | {measured_step*1000:.1f} ms |  <!-- measured/predicted MiB: {cats} -->")
EOF
done
cat "$WORK/table.md"
# The CPU cluster the predictions used (its probe's α and rank slowdown), for the record.
echo; echo "cpu cluster (measured by athanor plan):"
grep -E "efficiency|latency|slowdown|cores|comm_probe" "$WORK/cache/athanor/cpu-cluster.yaml" | tr '\n' ';'; echo
python3 - "$WORK/table.md" "$ASSERT" <<'EOF'
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| ") and not l.startswith("| config")]
errs, steps = [], {}
for l in rows:
    c = [x.strip() for x in l.split("|")]
    errs.append((c[1], c[4], float(c[7].rstrip("%"))))
    steps[c[1]] = (float(c[8].split()[0]), float(c[9].split()[0]))
worst = max(errs, key=lambda e: abs(e[2]))
misses = [e for e in errs if abs(e[2]) > 10]
print(f"\nmemory: {len(set(e[0] for e in errs))} configurations, {len(errs)} ranks; worst {worst[0]} rank {worst[1]}: {worst[2]:+.1f}%; "
      f"{len(misses)} ranks off by more than 10%")
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2
        i = j + 1
    return r
names = list(steps)
p = ranks([steps[n][0] for n in names]); m = ranks([steps[n][1] for n in names])
n = len(names)
mp, mm = sum(p) / n, sum(m) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(p, m))
rho = cov / ((sum((a - mp) ** 2 for a in p) * sum((b - mm) ** 2 for b in m)) ** 0.5 or 1)
print(f"step time: Spearman rho of predicted vs measured over {n} configurations = {rho:.3f}")
# The memory bar is asserted; the step-time ranking is reported (bench/RESULTS.md says why it
# misses 0.8 on this machine).
if sys.argv[2] == "1" and (misses or len(errs) < 20):
    sys.exit(1)
EOF
