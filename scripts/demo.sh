#!/usr/bin/env bash
# Sets up, builds and runs the main job: a small byte-level GPT trained on the
# Brown corpus on the CPU (examples/gpt-char.yaml, under 10 minutes on 2 cores),
# then prints text it generates. Arguments are config overrides, e.g.
#   bash scripts/demo.sh trainer.max_steps=300
# ATHANOR_BUILD_DIR overrides the build directory (default build/).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bash "$ATHANOR_ROOT/scripts/setup.sh"
BUILD_DIR=${ATHANOR_BUILD_DIR:-$ATHANOR_ROOT/build}
athanor_configure "$BUILD_DIR" -DATHANOR_SANITIZE=OFF
cmake --build "$BUILD_DIR" -j"$(nproc)" --target athanor_cli
cd "$ATHANOR_ROOT"
"$BUILD_DIR/apps/athanor/athanor" --version
"$BUILD_DIR/apps/athanor/athanor" train examples/gpt-char.yaml "$@"
echo
echo "A sample from the trained model (athanor generate runs/gpt-char):"
"$BUILD_DIR/apps/athanor/athanor" generate runs/gpt-char --prompt "The " --tokens 400
