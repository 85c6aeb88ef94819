#!/usr/bin/env bash
# The side-by-side comparison of issue 7, run the way the figures in bench/RESULTS.md were made:
# builds the CLI (Release, build/), then runs bench/compare_pytorch.py with /usr/bin/python3
# (Debian's python3-torch). Extra arguments go to the script, e.g.
#   bash bench/run_compare.sh --quick                        # tiny GPT + MLP, 2 repeats x 3 steps
#   bash bench/run_compare.sh                                # every config, f32 and bf16, 3 x 10 steps
#   bash bench/run_compare.sh --configs gpt2-124m --repeats 5 --steps 5 --athanor-env
# Run it on a quiet machine: the ratios are the figures of record, with their spread.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if [ ! -x "$BUILD/apps/athanor/athanor" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD" --target athanor_cli
exec /usr/bin/python3 bench/compare_pytorch.py --athanor "$BUILD/apps/athanor/athanor" --out "$BUILD/compare_pytorch.json" "$@"
