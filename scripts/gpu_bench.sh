#!/usr/bin/env bash
# The GPU benchmark of issue 22 in one device call: athanor against torch.compile on GPT-2.
#
#   bash scripts/gpu_bench.sh pack     here: scripts/gpu_check.sh's pack (the same archive carries
#                                      bench/compare_pytorch_gpu.py, the bench/configs/gpt2-*.yaml
#                                      and the tokenized Brown shards the configs read)
#   bash scripts/gpu_bench.sh run      on the GPU machine, from the repository root with gpu_pack/
#                                      carried: unpack, then bench/compare_pytorch_gpu.py on
#                                      gpt2-124m-gpu, gpt2-350m-gpu and (when the budget still
#                                      holds it) gpt2-124m-gpu-ckpt, with a torch.profiler run of 3
#                                      more torch.compile steps after gpt2-124m-gpu's repeats (its
#                                      device time by kernel category: bench/torch_profile.py);
#                                      writes $OUT/gpu_bench.json (the raw results), $OUT/gpu_bench.md
#                                      (the tables for bench/RESULTS.md) and $OUT/gpu_bench.log
#
# Budget, as measured on an H200 (2026-11-27, bench/RESULTS.md): the machine's start and the
# carried archive (~37 MiB) ~35 s; unpack 5 s; per config, compare_pytorch_gpu.py (2 paired
# repeats of 20 timed steps after 3 warm-up), with athanor's batch probe, PyTorch's import and
# eager probe, and torch.compile of the whole model + 3 warm-up steps (never timed: 28-43 s for
# 124M, 38-58 s for 350M): gpt2-124m-gpu 72 s in all, gpt2-350m-gpu 105 s (athanor at 0.61x /
# 0.65x of torch.compile; at 0.14x a 350M repeat took ~55 s). The script gives
# compare_pytorch_gpu.py a budget of GPU_BENCH_BUDGET_S (default 230 s): it starts no repeat
# (after a config's first) and no config that the time left cannot hold, and reports what it
# skipped; a hard timeout (budget + 20 s) ends it regardless, the configs finished before that
# kept in the JSON (written after every config). The ckpt variant runs only with time left.
# The profile (not yet timed on a GPU: 3 steps of ~130 ms under the profiler, then the reading of
# its records) is inside gpt2-124m-gpu's time and the budget: it starts only with 30 s of the
# budget left, and the estimate that decides whether a later config starts leaves it out (the
# later configs are not profiled).
# GPU_BENCH_CONFIGS overrides the list (e.g. "gpt2-350m-gpu" for a second call); GPU_BENCH_ARGS adds
# arguments to compare_pytorch_gpu.py and GPU_BENCH_PYTHON names its interpreter (the plumbing's
# dry run here: GPU_BENCH_PYTHON=/usr/bin/python3 GPU_BENCH_ARGS="--device cpu --tiny --steps 2
# --warmup 1 --batches 2").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/gpu_check.sh
source "$ROOT/scripts/gpu_check.sh"  # cmd_pack, cuda_lib_dirs, ARCHIVE

cmd_run_bench() {
  local out=${OUT:-$ROOT/gpu_bench_out}
  mkdir -p "$out"
  local log=$out/gpu_bench.log json=$out/gpu_bench.json
  local budget=${GPU_BENCH_BUDGET_S:-230}
  local configs=${GPU_BENCH_CONFIGS:-gpt2-124m-gpu gpt2-350m-gpu gpt2-124m-gpu-ckpt}
  local py=${GPU_BENCH_PYTHON:-python3}
  local work=/tmp/athanor-gpu-bench
  [[ -f "$ARCHIVE" ]] || { echo "gpu_bench: $ARCHIVE is missing: run 'bash scripts/gpu_bench.sh pack' here and carry gpu_pack" >&2; exit 1; }
  local t0
  t0=$(date +%s)
  rm -rf "$work"
  mkdir -p "$work"
  xz -dc "$ARCHIVE" | tar -C "$work" -xf -
  local d=$work/athanor-gpu
  export LD_LIBRARY_PATH="$d/lib:$(cuda_lib_dirs)"
  {
    echo "== gpu_bench $(date -u +%FT%TZ): unpacked in $(($(date +%s) - t0)) s"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || true
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
    "$d/bin/athanor" --version 2>&1 | head -3 || true
    echo "configs: $configs; budget ${budget} s"
  } >>"$log"
  local rc=0
  # shellcheck disable=SC2086  # the config list splits into arguments
  timeout $((budget + 20)) "$py" "$d/bench/compare_pytorch_gpu.py" --configs $configs --athanor "$d/bin/athanor" --cwd "$d" \
    --repeats 2 --steps 20 --warmup 3 --budget-s "$budget" --timeout 90 --out "$json" \
    --torch-profile-steps 3 --torch-profile-configs gpt2-124m-gpu ${GPU_BENCH_ARGS:-} \
    >"$out/gpu_bench.md" 2>>"$log" || rc=$?
  if [[ $rc -eq 124 && -f "$json" ]]; then  # killed: the table of the configs that finished
    "$py" "$d/bench/compare_pytorch_gpu.py" --table "$json" >"$out/gpu_bench.md" 2>>"$log" || true
  fi
  {
    echo "== exit $rc after $(($(date +%s) - t0)) s"
    cat "$out/gpu_bench.md"
  } | tee -a "$log"
  return $rc
}

case "${1:-}" in
  pack) cmd_pack ;;
  run) cmd_run_bench ;;
  *) sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
