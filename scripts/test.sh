#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#
#   bash scripts/test.sh              Release build in build/, every test (the slow ones train to
#                                     an accuracy bar, one at a time: ~6 more minutes), then the
#                                     kernel tests again at each lower ISA level this CPU runs
#   bash scripts/test.sh --fast       ... without the slow tests (label "slow")
#   bash scripts/test.sh --long       ... and the runs too long for CI (label "long": the doctor's
#                                     whole catalogue, gpt-char trained at lr-find's lr, the planner against
#                                     24 real runs; ~27 min)
#   bash scripts/test.sh --sanitize   ASan + UBSan + LSan build in build-asan/, allocator cache off
#                                     (implies --fast)
#   --labels a,b,c                    only the tests with these labels (and only their executables
#                                     are built), e.g. --sanitize --labels core,backend,autograd,ops,dist
#
# The ISA passes: the kernels are compiled for avx2, avx512 and avx512_bf16 and run at the
# highest level the CPU has (src/backend/cpu/isa.h). After the full pass at that level, the
# core, backend, autograd, ops and optim tests run again at each lower level, with oneDNN capped to
# match (ONEDNN_MAX_CPU_ISA), so one machine runs the paths the others take: avx512 is an
# Intel Xeon without AVX512_BF16 or AMX, avx2 a Zen 3 or Haswell; on a CPU with AMX, the
# avx512_bf16 level with oneDNN kept off AMX is an AMD Zen 5.
#
# Every phase (setup, configure, build, each ctest pass) prints its wall and CPU seconds and the
# load average as it ends ("[phase] ..."), and all of them again as a table at the end.
#
# ATHANOR_BUILD_DIR overrides the build directory, ATHANOR_CMAKE_ARGS adds CMake
# options. Exits non-zero if any step or any test fails.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SLOW=1
LONG=0
SANITIZE=0
LABELS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --fast) SLOW=0 ;;
    --slow) SLOW=1 ;;
    --long) SLOW=1; LONG=1 ;;
    --sanitize) SANITIZE=1; SLOW=0 ;;
    --labels) shift; LABELS=${1:-} ;;
    --labels=*) LABELS=${1#--labels=} ;;
    -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option '$1' (expected --fast, --long, --sanitize or --labels a,b)" >&2; exit 2 ;;
  esac
  shift
done

MODE=$([[ $SANITIZE -eq 1 ]] && echo sanitized || echo release)
trap 'athanor_phase_summary "test.sh, $MODE"' EXIT
athanor_phase "$MODE: setup" bash "$ATHANOR_ROOT/scripts/setup.sh"

if [[ $SANITIZE -eq 1 ]]; then
  BUILD_DIR=${ATHANOR_BUILD_DIR:-$ATHANOR_ROOT/build-asan}
  # Without the cache every freed block goes straight back to the system, so
  # ASan sees use-after-free and overflows past the requested size.
  export ATHANOR_ALLOCATOR_CACHE=0
  # LeakSanitizer stays on (detect_leaks=1). libgomp's parked worker threads still
  # reference their pool at exit, so LSan sees it as reachable, not leaked. Do not answer
  # a libgomp report with a "leak:libgomp" suppression: every allocation made inside a
  # parallel region has libgomp frames in its stack, so that would hide real leaks in the
  # kernels too. The only suppressions are Open MPI's own, by name, in
  # scripts/lsan_suppressions.txt (the file says why each is there).
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ATHANOR_ROOT/scripts/lsan_suppressions.txt:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  athanor_phase "$MODE: configure" athanor_configure "$BUILD_DIR" -DATHANOR_BUILD_TESTS=ON -DATHANOR_SANITIZE=ON
else
  BUILD_DIR=${ATHANOR_BUILD_DIR:-$ATHANOR_ROOT/build}
  athanor_phase "$MODE: configure" athanor_configure "$BUILD_DIR" -DATHANOR_BUILD_TESTS=ON -DATHANOR_SANITIZE=OFF
fi

# The executables the requested labels need (all of them without --labels).
TARGETS=()
LABEL_REGEX=""
if [[ -n "$LABELS" ]]; then
  IFS=',' read -r -a label_list <<<"$LABELS"
  for l in "${label_list[@]}"; do
    case "$l" in
      dist) TARGETS+=(athanor_tests_dist athanor_tests_zero athanor_tests_tp athanor_tests_pipeline athanor_tests_llama_parallel athanor_tests_sync_batch_norm
                  athanor_tests_trainer_dist athanor_tests_gpu_dist athanor_cli) ;;
      fuzz) TARGETS+=(athanor_fuzz_safetensors) ;;
      cli|train|observe|slow) TARGETS+=("athanor_tests_$l" athanor_cli) ;;
      bench) TARGETS+=(athanor_cli) ;;  # tests/bench: python, reads the CLI
      long) TARGETS+=(athanor_tests_slow athanor_cli) ;;
      gpu) TARGETS+=(athanor_tests_gpu athanor_tests_gpu_dist) ;;  # gpu_dist: labels gpu;dist (CUDA builds only)
      core|backend|autograd|ops|amp|nn|optim|data|ckpt) TARGETS+=("athanor_tests_$l") ;;
      *) echo "test.sh: unknown label '$l'" >&2; exit 2 ;;
    esac
    [[ "$l" == backend ]] && TARGETS+=(athanor_cli)  # backend.isa_scan reads the binary
    LABEL_REGEX+="${LABEL_REGEX:+|}$l"
  done
  LABEL_REGEX="^($LABEL_REGEX)\$"
fi
# The sanitizer options are exported before the build on purpose:
# gtest_discover_tests runs every test binary at build time.
if [[ ${#TARGETS[@]} -gt 0 ]]; then
  # Only existing targets (a cli test binary, say, exists only where its folder has tests).
  mapfile -t known < <(cmake --build "$BUILD_DIR" --target help | sed -n 's/^\([A-Za-z0-9_]*\): .*/\1/p')
  build_targets=()
  for t in $(printf '%s\n' "${TARGETS[@]}" | sort -u); do
    if printf '%s\n' "${known[@]}" | grep -qx "$t"; then build_targets+=("$t"); fi
  done
  athanor_phase "$MODE: build (${#build_targets[@]} targets)" cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${build_targets[@]}"
else
  athanor_phase "$MODE: build (all)" cmake --build "$BUILD_DIR" -j"$(nproc)"
fi

CTEST_ARGS=(--output-on-failure -j2 --test-dir "$BUILD_DIR")
if [[ -n "$LABEL_REGEX" ]]; then
  :  # the labels asked for, long ones included
elif [[ $SLOW -eq 0 ]]; then
  CTEST_ARGS+=(-LE '^(slow|long)$')
elif [[ $LONG -eq 0 ]]; then
  CTEST_ARGS+=(-LE '^long$')
fi
if [[ -n "$LABEL_REGEX" ]]; then
  CTEST_ARGS+=(-L "$LABEL_REGEX")
fi
athanor_phase "$MODE: ctest ${LABEL_REGEX:-$([[ $SLOW -eq 1 ]] && echo 'all (slow incl.)' || echo 'fast')}" ctest "${CTEST_ARGS[@]}"

# The lower levels (see the top of this file). Not under the sanitizers: one level suffices
# to find memory errors, and the sanitized build is the slow one.
if [[ $SANITIZE -eq 0 ]]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  has() { [[ " $flags " == *" $1 "* ]]; }
  # Each pass: ATHANOR_ISA level, oneDNN's cap, the CPU it stands for.
  passes=()
  if has avx512f && has avx512bw && has avx512cd && has avx512dq && has avx512vl; then
    if has avx512_bf16 && has amx_tile; then
      passes+=("avx512_bf16 AVX512_CORE_BF16 an_AMD_Zen_5_(AVX512_BF16_without_AMX)")
    fi
    if has avx512_bf16; then
      passes+=("avx512 AVX512_CORE_VNNI an_Intel_Xeon_without_AVX512_BF16_or_AMX")
    fi
    passes+=("avx2 AVX2 a_Zen_3_or_Haswell")
  fi
  ISA_LABELS='^(core|backend|autograd|ops|optim)$'
  if [[ -n "$LABEL_REGEX" ]]; then ISA_LABELS=$LABEL_REGEX; fi
  for pass in "${passes[@]}"; do
    read -r level cap cpu <<<"$pass"
    echo "test.sh: the ${ISA_LABELS} tests at ISA level $level with oneDNN capped at $cap, as on ${cpu//_/ }"
    # (backend.isa_scan is a scan of the binary: the same at every level)
    ATHANOR_ISA=$level ONEDNN_MAX_CPU_ISA=$cap \
      athanor_phase "$MODE: ctest at ISA level $level" \
      ctest --output-on-failure -j2 --test-dir "$BUILD_DIR" -LE '^(slow|long)$' -L "$ISA_LABELS" -E '^backend\.isa_scan$'
  done
fi
