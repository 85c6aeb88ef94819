#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#
#   bash scripts/test.sh              Release build in build/, every test (the slow ones train to
#                                     an accuracy bar, one at a time: ~10 more minutes)
#   bash scripts/test.sh --fast       ... without the slow tests (label "slow")
#   bash scripts/test.sh --sanitize   ASan + UBSan build in build-asan/, allocator cache off (implies --fast)
#
# ATHANOR_BUILD_DIR overrides the build directory, ATHANOR_CMAKE_ARGS adds CMake
# options. Exits non-zero if any step or any test fails.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SLOW=1
SANITIZE=0
for arg in "$@"; do
  case "$arg" in
    --fast) SLOW=0 ;;
    --slow) SLOW=1 ;;
    --sanitize) SANITIZE=1; SLOW=0 ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (expected --fast or --sanitize)" >&2; exit 2 ;;
  esac
done

bash "$ATHANOR_ROOT/scripts/setup.sh"

if [[ $SANITIZE -eq 1 ]]; then
  BUILD_DIR=${ATHANOR_BUILD_DIR:-$ATHANOR_ROOT/build-asan}
  # Without the cache every freed block goes straight back to the system, so
  # ASan sees use-after-free and overflows past the requested size.
  export ATHANOR_ALLOCATOR_CACHE=0
  # LeakSanitizer stays on (detect_leaks=1). ASan + OpenMP was checked on this
  # machine (g++ 12, libgomp 12): parallel regions, regions started from
  # short-lived std::threads, omp_set_num_threads changes and oneDNN/OpenBLAS
  # GEMMs produce no leak reports: at exit libgomp's parked worker threads
  # still reference their pool, so LSan sees it as reachable, not leaked. Do
  # not answer a future libgomp report with a "leak:libgomp" suppression: every
  # allocation made inside a parallel region has libgomp frames in its stack,
  # so that would hide real leaks in the kernels too.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  athanor_configure "$BUILD_DIR" -DATHANOR_BUILD_TESTS=ON -DATHANOR_SANITIZE=ON
else
  BUILD_DIR=${ATHANOR_BUILD_DIR:-$ATHANOR_ROOT/build}
  athanor_configure "$BUILD_DIR" -DATHANOR_BUILD_TESTS=ON -DATHANOR_SANITIZE=OFF
fi
# The sanitizer options are exported before the build on purpose:
# gtest_discover_tests runs every test binary at build time.
cmake --build "$BUILD_DIR" -j"$(nproc)"

CTEST_ARGS=(--output-on-failure -j2 --test-dir "$BUILD_DIR")
if [[ $SLOW -eq 0 ]]; then
  CTEST_ARGS+=(-LE slow)
fi
ctest "${CTEST_ARGS[@]}"
