# Sourced by the scripts in this folder: the one way to configure a build.
#   athanor_configure BUILD_DIR [extra cmake args...]
# Release, Ninja, ccache when installed; resets a cached development test subset
# (ATHANOR_TEST_REGEX) so a reused build directory always builds everything.
# Extra CMake options can also come from the environment: ATHANOR_CMAKE_ARGS.
#   athanor_phase NAME COMMAND...
# Runs COMMAND and prints its wall time and CPU time (user + sys, children included) and the
# load average, so every log says where its time went and whether the machine was shared;
# athanor_phase_summary prints them all again as a table.
ATHANOR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

athanor_configure() {
  local build_dir=$1
  shift
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DATHANOR_TEST_REGEX=)
  if command -v ccache >/dev/null; then
    # base_dir = this checkout: ccache hashes the paths under it as relative ones, so a second
    # checkout at another path (a CI runner's fresh clone) hits the first one's cache. The
    # launcher carries it, so it holds for every later `cmake --build` of this directory without
    # a ccache.conf. (hash_dir, on by default, adds the working directory to the hash only when
    # compiling with -g: the Release and sanitized builds have none.)
    local launcher="env;CCACHE_BASEDIR=$ATHANOR_ROOT;ccache"
    args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher" "-DCMAKE_CUDA_COMPILER_LAUNCHER=$launcher")
  fi
  # shellcheck disable=SC2206  # word splitting of the user's extra arguments is intended
  args+=("$@" ${ATHANOR_CMAKE_ARGS:-})
  cmake -S "$ATHANOR_ROOT" -B "$build_dir" "${args[@]}"
}

ATHANOR_PHASES=()
athanor_phase() {
  local name=$1
  shift
  local rc=0 t0 line
  t0=$(date +%s.%N)
  local -a c0 c1
  read -r -a c0 < <(athanor_cpu_ticks_)
  "$@" || rc=$?
  read -r -a c1 < <(athanor_cpu_ticks_)
  line=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" -v u="$((c1[0] - c0[0]))" -v s="$((c1[1] - c0[1]))" -v hz="$(getconf CLK_TCK)" \
             -v load="$(cut -d' ' -f1-3 /proc/loadavg)" -v name="$name" -v rc="$rc" \
             'BEGIN { printf "%-44s %7.1f s wall %8.1f s CPU   load %s%s", name, t1 - t0, (u + s) / hz, load, rc ? "   FAILED (exit " rc ")" : "" }')
  echo "[phase] $line"
  ATHANOR_PHASES+=("$line")
  return "$rc"
}
# This shell's children's CPU ticks (user, sys) so far: what the finished phase commands used.
athanor_cpu_ticks_() { awk '{ print $16, $17 }' "/proc/$$/stat" 2>/dev/null || echo "0 0"; }
athanor_phase_summary() {
  [[ ${#ATHANOR_PHASES[@]} -gt 0 ]] || return 0
  echo "[phase] ---- where the time went ($1) ----"
  printf '[phase] %s\n' "${ATHANOR_PHASES[@]}"
}
