# Sourced by the scripts in this folder: the one way to configure a build.
#   athanor_configure BUILD_DIR [extra cmake args...]
# Release, Ninja, ccache when installed; resets a cached development test subset
# (ATHANOR_TEST_REGEX) so a reused build directory always builds everything.
# Extra CMake options can also come from the environment: ATHANOR_CMAKE_ARGS.
ATHANOR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

athanor_configure() {
  local build_dir=$1
  shift
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DATHANOR_TEST_REGEX=)
  if command -v ccache >/dev/null; then args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  # shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
  args+=("$@" ${ATHANOR_CMAKE_ARGS:-})
  cmake -S "$ATHANOR_ROOT" -B "$build_dir" "${args[@]}"
}
