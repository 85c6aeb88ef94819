#!/usr/bin/env bash
# `athanor plan`'s memory and time model against real runs on this machine.
#   bench/plan_check.sh [BUILD_DIR] [--assert] [--only REGEX] [--repeats R] [--steps S]
# For each configuration below (a tiny GPT and a tiny Llama across dp/tp/pp, ZeRO stage,
# recompute, precision, micro-batch and schedule), runs `athanor train` under mpirun, then compares
#   predicted: athanor plan CONFIG OVERRIDES --cluster cpu --evaluate --world N --json
#              (each rank's pipeline stage's peak bytes)
#   measured:  runs/<name>/memory_ranks.json (each rank's allocator peak, the max over the steps)
# rank by rank in every run, and the predicted step time against the measured one.
# The step times of a shared 2-core machine drift with its load, so each configuration is run
# R times (default 3) in R rounds, every round running all configurations once, in an order
# rotated from round to round (a burst of load from elsewhere falls on different configurations
# each time); a run's time is the median of its steps after the first two (warm-up), the
# configuration's the median of its R runs. Each round first probes the CPU cluster afresh and
# predicts every configuration with that probe (the load moves between rounds; predictions and
# runs of a round see the same), and a configuration's predicted step is the median of its
# rounds'. Steps over twice their run's median are reported as outliers (counted, not dropped:
# the median already ignores them).
# Prints a markdown table and the ranking's Spearman rho; --assert exits 1 when any rank's
# predicted peak is off by more than 10% in any run.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
ASSERT=0
ONLY=""
REPEATS=3
STEPS=10
while [ $# -gt 0 ]; do
  case $1 in
    --assert) ASSERT=1 ;;
    --only) ONLY=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
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
common() {
  cat <<EOF
data: {type: text, corpus: $WORK/corpus.txt, tokenizer: byte, cache_dir: $WORK/data, num_workers: 0, val_fraction: 0.05}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1}
trainer: {max_steps: $STEPS, batch_size: 4, accum_steps: 1, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 4}
checkpoint: {every: 0}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
EOF
}
{ printf 'name: plan-check\nseed: 7\nmodel: {type: gpt, n_layer: 4, n_head: 4, n_embd: 64, block_size: 64, dropout: 0.0}\n'; common; } > "$WORK/gpt.yaml"
# A Llama of the same width and depth: 4 query heads sharing 2 key/value heads, SwiGLU width 176,
# untied lm_head (configurations named llama_*).
{ printf 'name: plan-check-llama\nseed: 7\nmodel: {type: llama, n_layer: 4, n_head: 4, n_kv_head: 2, n_embd: 64, intermediate_size: 176, block_size: 64, tie_embeddings: false, dropout: 0.0}\n'; common; } > "$WORK/llama.yaml"

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
  "llama_f32_mb4|1|"
  "llama_f32_mb8|1|trainer.batch_size=8"
  "llama_bf16_mb4|1|trainer.precision=bf16"
  "llama_recompute|1|model.gradient_checkpointing=true"
  "llama_tied|1|model.tie_embeddings=true"
  "llama_dp2_zero1|2|dist.zero_stage=1"
  "llama_dp2_zero3|2|dist.zero_stage=3"
  "llama_dp2_zero3_bf16|2|dist.zero_stage=3 trainer.precision=bf16"
)
SELECTED=()
for entry in "${CONFIGS[@]}"; do
  name=${entry%%|*}
  if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
  SELECTED+=("$entry")
done
[ ${#SELECTED[@]} -gt 0 ] || { echo "error: --only '$ONLY' selects no configuration" >&2; exit 1; }

base_of() { case $1 in llama_*) echo "$WORK/llama.yaml" ;; *) echo "$WORK/gpt.yaml" ;; esac; }

# One run of one configuration: its memory (every rank) and its steps, appended to runs.jsonl.
run_one() {
  local name=$1 np=$2 overrides=$3 round=$4 base out
  base=$(base_of "$name")
  out=$WORK/runs/r$round
  # shellcheck disable=SC2086
  if [ "$np" -eq 1 ]; then
    OMP_NUM_THREADS=1 "$CLI" train "$base" $overrides name="$name" out_dir="$out" > "$WORK/$name.r$round.out" 2>&1
  else
    OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS \
      -np "$np" "$CLI" train "$base" $overrides name="$name" out_dir="$out" > "$WORK/$name.r$round.out" 2>&1
  fi
  if [ $? -ne 0 ]; then echo "run $name (round $round) failed:"; tail -20 "$WORK/$name.r$round.out"; exit 1; fi
  python3 - "$name" "$round" "$out/$name/memory_ranks.json" "$out/$name/metrics.jsonl" >> "$WORK/runs.jsonl" <<'EOF'
import json, statistics, sys
name, rnd, mem_f, met_f = sys.argv[1:5]
mem = json.load(open(mem_f))
steps = [s["step_s"] for s in (json.loads(l) for l in open(met_f) if l.strip()) if "step_s" in s]
kept = steps[2:] if len(steps) > 3 else steps[1:] or steps
med = statistics.median(kept)
print(json.dumps({"name": name, "round": int(rnd), "step": med, "steps": kept,
                  "outliers": [round(s * 1000, 1) for s in kept if s > 2 * med],
                  "ranks": sorted(mem["ranks"], key=lambda r: r["rank"])}))
EOF
}

# Each round: the CPU cluster probed afresh (the first `athanor plan` of the round runs the
# mpirun probe), every configuration predicted with it, then every configuration run. The
# predictions and the runs of a round see the same load; a configuration's predicted step is the
# median of its rounds' predictions, as its measured step is the median of its runs.
predict_round() {
  local round=$1 entry name np overrides rc
  rm -f "$XDG_CACHE_HOME/athanor/cpu-cluster.yaml"
  for entry in "${SELECTED[@]}"; do
    IFS='|' read -r name np overrides <<< "$entry"
    # shellcheck disable=SC2086
    "$CLI" plan "$(base_of "$name")" $overrides --cluster cpu --evaluate --world "$np" --json > "$WORK/$name.plan.r$round.json" 2> "$WORK/$name.plan.err"
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 2 ]; then echo "plan $name failed:"; cat "$WORK/$name.plan.err"; exit 1; fi
  done
  mkdir -p "$WORK/probes"
  cp "$XDG_CACHE_HOME/athanor/cpu-cluster.yaml" "$WORK/probes/r$round.yaml"
}
n=${#SELECTED[@]}
for ((round = 0; round < REPEATS; round++)); do
  echo "round $((round + 1)) of $REPEATS ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
  predict_round "$round"
  for ((k = 0; k < n; k++)); do
    # Rotated by a third of the list each round.
    IFS='|' read -r name np overrides <<< "${SELECTED[$(( (k + round * (n / 3 + 1)) % n ))]}"
    run_one "$name" "$np" "$overrides" "$round"
  done
done

# The CPU cluster each round's predictions used (its probe's α and rank slowdown), for the record.
for ((round = 0; round < REPEATS; round++)); do
  echo "cpu cluster of round $((round + 1)) (measured by athanor plan):"
  grep -E "efficiency|latency|slowdown|cores|comm_probe" "$WORK/probes/r$round.yaml" | tr '\n' ';'; echo
done
printf '%s\n' "${SELECTED[@]}" > "$WORK/selected.txt"
python3 - "$WORK" "$ASSERT" "$REPEATS" <<'EOF'
import json, statistics, sys
work, assert_, repeats = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
configs = [l.rstrip("\n").split("|") for l in open(f"{work}/selected.txt") if l.strip()]
runs = {}
for l in open(f"{work}/runs.jsonl"):
    r = json.loads(l)
    runs.setdefault(r["name"], []).append(r)
print(f"\n| config | np | layout | rank (dp,tp,pp) | predicted | measured ({repeats} runs) | worst error | predicted step (median of {repeats} probes; rounds) | measured step (median of {repeats}; runs) |")
print("|---|---|---|---|---|---|---|---|---|")
errs, steps, outliers = [], {}, []
for name, np_, _ in configs:
    rs = sorted(runs[name], key=lambda r: r["round"])
    plans = [json.load(open(f"{work}/{name}.plan.r{r['round']}.json")) for r in rs]
    plan = plans[0]  # the memory prediction does not depend on the probe
    step = statistics.median(r["step"] for r in rs)
    predicted_step = statistics.median(p["step_s"] for p in plans)
    steps[name] = (predicted_step, step)
    for r in rs:
        if r["outliers"]:
            outliers.append("%s round %d: %d of %d steps over 2x the run's median %.1f ms (%s ms)" % (
                name, r["round"] + 1, len(r["outliers"]), len(r["steps"]), 1000 * r["step"], ", ".join(str(o) for o in r["outliers"])))
    for k, first in enumerate(rs[0]["ranks"]):
        st = plan["stages"][first["pp"]]
        pred = st["peak"]
        meas = [r["ranks"][k]["peak_total"] for r in rs]
        run_errs = [(pred - m) / m for m in meas]
        worst = max(run_errs, key=abs)
        errs.append((name, first["rank"], worst))
        per_run = ", ".join("%.1f" % (1000 * r["step"]) for r in rs)
        per_pred = ", ".join("%.1f" % (1000 * p["step_s"]) for p in plans)
        lo, hi = min(meas) / 1048576, max(meas) / 1048576
        m_txt = f"{lo:.2f} MiB" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f} MiB"
        cats = " ".join(f"{c}={first['peak'][c]/1048576:.2f}/{st[c]/1048576:.2f}"
                        for c in ("parameter", "gradient", "optimizer_state", "activation", "workspace", "packed_weights"))
        print(f"| {name} | {np_} | {plan['layout']} | {first['rank']} ({first['dp']},{first['tp']},{first['pp']}) | {pred/1048576:.2f} MiB | "
              f"{m_txt} | {100*worst:+.1f}% | {predicted_step*1000:.1f} ms ({per_pred}) | {step*1000:.1f} ms ("
              f"{per_run}) |  <!-- measured/predicted MiB: {cats} -->")
worst = max(errs, key=lambda e: abs(e[2]))
misses = [e for e in errs if abs(e[2]) > 0.10]
print(f"\nmemory: {len(configs)} configurations, {len(errs)} ranks, {repeats} runs each; worst {worst[0]} rank {worst[1]}: "
      f"{100 * worst[2]:+.1f}%; {len(misses)} ranks off by more than 10% in some run")
print(f"outlier steps: {len(outliers)} runs with some" + ("" if not outliers else ":\n  " + "\n  ".join(outliers)))
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
# The memory bar is asserted; the step-time ranking is reported (bench/RESULTS.md).
if assert_ and (misses or len(errs) < 20):
    sys.exit(1)
EOF
