#!/usr/bin/env bash
# Bad input to `athanor train` gives one clear error naming the file or key and
# what to do, and exits with status 1 (a user error, not a crash: no 134/139).
#   test_cli_errors.sh /path/to/athanor
set -u
ATHANOR=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/expect_error.sh"

printf 'trainer:\n  max_stpes: 3\n' > "$WORK/unknown_key.yaml"
expect_error unknown-key 1 "unknown_key.yaml: unknown key 'trainer.max_stpes'|hint: did you mean 'trainer.max_steps'?" \
  "$ATHANOR" train "$WORK/unknown_key.yaml"

printf 'trainer:\n  batch_size: lots\n' > "$WORK/wrong_type.yaml"
expect_error wrong-type 1 "key 'trainer.batch_size' must be an integer, got 'lots'" "$ATHANOR" train "$WORK/wrong_type.yaml"

expect_error missing-config 1 "cannot open config file '$WORK/nope.yaml'|hint:" "$ATHANOR" train "$WORK/nope.yaml"

printf 'seed: 1\n' > "$WORK/ok.yaml"
expect_error bad-override 1 "unknown key 'optimizer.weight_decy'|did you mean 'optimizer.weight_decay'" "$ATHANOR" train "$WORK/ok.yaml" "optimizer.weight_decy=0.1"

# trainer.device: cuda on a machine (or a build) without a GPU, and a malformed device, are
# errors before any work: no run directory is made.
expect_error device-cuda-no-gpu 1 "trainer.device|cuda:0 was asked for, but this|hint:" \
  "$ATHANOR" train "$WORK/ok.yaml" trainer.device=cuda "out_dir=$WORK/runs_dev"
expect_error device-cuda7 1 "cuda:7 was asked for, but this" "$ATHANOR" train "$WORK/ok.yaml" trainer.device=cuda:7 "out_dir=$WORK/runs_dev"
expect_error device-malformed 1 "key 'trainer.device' is 'gpu', which is not a device|cuda:N" \
  "$ATHANOR" train "$WORK/ok.yaml" trainer.device=gpu "out_dir=$WORK/runs_dev"
# The issue's command on a machine without a GPU: the same error, before the corpus is read.
expect_error device-gpt-char-no-gpu 1 "trainer.device|cuda:0 was asked for, but this|hint:" \
  "$ATHANOR" train "$(dirname "${BASH_SOURCE[0]}")/../../examples/gpt-char.yaml" trainer.device=cuda "out_dir=$WORK/runs_dev" \
  "data.cache_dir=$WORK/runs_dev/cache"
if [[ -e "$WORK/runs_dev" ]]; then echo "FAIL device errors: a run directory was made before the error"; failures=$((failures + 1)); fi
# athanor ops: the cuda column ("yes"/"-", the 6th) follows the registry's CUDA slot: linear
# has a CUDA kernel in a CUDA build, exp has none in any build.
ops_table=$("$ATHANOR" ops 2>&1)
cuda_build=$("$ATHANOR" --version 2>&1 | grep -c "cuda: *built with CUDA")
want_linear=$([[ $cuda_build -eq 1 ]] && echo yes || echo -)
got_linear=$(awk '$1 == "linear" {print $6}' <<<"$ops_table")
got_exp=$(awk '$1 == "exp" {print $6}' <<<"$ops_table")
if [[ "$(awk 'NR == 1 {print $6}' <<<"$ops_table")" != cuda || "$got_linear" != "$want_linear" || "$got_exp" != "-" ]]; then
  echo "FAIL ops-cuda-column: linear '$got_linear' (want '$want_linear'), exp '$got_exp' (want '-')"; echo "$ops_table" | head -5
  failures=$((failures + 1))
else
  echo "ok   ops-cuda-column"
fi

printf 'model: {type: mlp}\ndata: {type: fashion_mnist, dir: %s/fmnist}\nout_dir: %s/runs\n' "$WORK" "$WORK" > "$WORK/no_dataset.yaml"
expect_error missing-dataset 1 "$WORK/fmnist|dataset-fashion-mnist" "$ATHANOR" train "$WORK/no_dataset.yaml"

# Token shards in llm.c's format: 256 x i32 header (magic, version 1 = u16 tokens, count), then tokens.
write_shard() {  # path count tokens...
  /usr/bin/python3 -c '
import struct, sys
path, count, toks = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3:]]
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, count] + [0] * 253)))
    f.write(struct.pack("<%dH" % len(toks), *toks))
' "$@"
}
mkdir -p "$WORK/cache/book-byte"
write_shard "$WORK/cache/book-byte/train.bin" 40 $(seq 65 104 | sed 's/^84$/300/')   # token 300 at position 19
write_shard "$WORK/cache/book-byte/val.bin" 40 $(seq 65 104)
printf 'model: {type: gpt, n_layer: 1, n_head: 1, n_embd: 8, block_size: 8}\ndata: {type: text, corpus: %s/book.txt, cache_dir: %s/cache}\ntrainer: {batch_size: 2}\nout_dir: %s/runs\n' \
  "$WORK" "$WORK" "$WORK" > "$WORK/bad_token.yaml"
expect_error token-out-of-vocab 1 "$WORK/cache/book-byte/train.bin|300" "$ATHANOR" train "$WORK/bad_token.yaml"

write_shard "$WORK/cache/book-byte/train.bin" 1000 $(seq 65 74)   # claims 1000 tokens, holds 10
expect_error truncated-shard 1 "$WORK/cache/book-byte/train.bin" "$ATHANOR" train "$WORK/bad_token.yaml"

expect_error unknown-command 2 "unknown command 'trian'" "$ATHANOR" trian
expect_error eval-not-a-run 1 "is not a run directory" "$ATHANOR" eval "$WORK"

# The doctor and the tuning tools: bad input is refused before any work.
expect_error doctor-no-metrics 1 "no metrics.jsonl in '$WORK'|hint:" "$ATHANOR" doctor "$WORK"
mkdir -p "$WORK/run" && printf '{"step": 1, "loss": 2.0}\n' > "$WORK/run/metrics.jsonl"
expect_error doctor-bad-baseline 1 "'$WORK/nope' is not a directory" "$ATHANOR" doctor "$WORK/run" --baseline "$WORK/nope"
printf 'trainer:\n  max_steps: 3\n' > "$WORK/small.yaml"
expect_error lr-find-steps 1 "--steps must be at least 5, got 2" "$ATHANOR" lr-find "$WORK/small.yaml" --steps 2
expect_error lr-find-range 1 "0 < --min-lr < --max-lr" "$ATHANOR" lr-find "$WORK/small.yaml" --min-lr 1 --max-lr 0.1
expect_error batch-find-memory 1 "cannot read the memory size 'lots'|16GiB" "$ATHANOR" batch-find "$WORK/small.yaml" --memory lots
printf 'debug:\n  corrupt_value: oops\n' > "$WORK/bad_debug.yaml"
expect_error debug-corrupt-value 1 "debug.corrupt_value must be 'nan', 'inf' or a number, got 'oops'" \
  "$ATHANOR" train "$WORK/bad_debug.yaml"

if [[ $failures -eq 0 ]]; then echo "cli errors: all cases passed"; exit 0; fi
echo "cli errors: $failures case(s) failed"
exit 1
