#!/usr/bin/env bash
# `athanor plan` from the command line: bad input gets one clear error (exit 1), and the
# config --write emits trains as it is under mpirun.
#   test_plan_cli.sh /path/to/athanor
set -u
ATHANOR=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export XDG_CACHE_HOME=$WORK/cache
source "$(dirname "${BASH_SOURCE[0]}")/../cli/expect_error.sh"

for _ in 1 2 3 4 5 6 7 8 9 10; do echo "The quick brown fox jumps over the lazy dog, again and again and again."; done > "$WORK/corpus.txt"
cat > "$WORK/tiny.yaml" <<EOF
name: tiny
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 16}
data: {type: text, corpus: $WORK/corpus.txt, tokenizer: byte, cache_dir: $WORK/data, num_workers: 0, val_fraction: 0.1}
trainer: {max_steps: 2, batch_size: 2, accum_steps: 1, eval_every: 0, eval_batches: 1, log_every: 1, sample_tokens: 2}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
EOF
cat > "$WORK/gpt3.yaml" <<EOF
name: gpt3-175b
model: {type: gpt, n_layer: 96, n_head: 96, n_embd: 12288, block_size: 2048, vocab_size: 51200}
trainer: {precision: bf16, batch_size: 1, accum_steps: 1536}
optimizer: {packed_weights: false}
EOF
printf 'name: two\ndevices_per_node: 2\nmemory_gib: 1\npeak_tflops: {f32: 0.1}\nshared_compute: true\ncores: 2\n' > "$WORK/two.yaml"

expect_error unknown-preset 1 "unknown cluster preset 'h100-sxm'|hint: did you mean 'h100-sxm-80gb'?" \
  "$ATHANOR" plan "$WORK/tiny.yaml" --cluster h100-sxm
expect_error heads-do-not-divide 1 "n_head 2 does not divide by tp 4|hint:" \
  "$ATHANOR" plan "$WORK/tiny.yaml" --cluster cpu --evaluate --world 4 dist.tp=4
expect_error layers-do-not-divide 1 "n_layer 2 does not divide by pp 4|hint:" \
  "$ATHANOR" plan "$WORK/tiny.yaml" --cluster cpu --evaluate --world 4 dist.pp=4
expect_error width-does-not-divide 1 "model.n_embd (32) does not divide by model.n_head (3)|hint:" \
  "$ATHANOR" plan "$WORK/tiny.yaml" --cluster cpu model.n_head=3
expect_error too-big-for-the-cluster 1 "fits on 8 a100-80gb devices|hint: the smallest a100-80gb cluster that holds it has 8 nodes|--nodes 8" \
  "$ATHANOR" plan "$WORK/gpt3.yaml" --cluster a100-80gb --nodes 1
expect_error gpt3-plan 0 "decision tree:|1. the model on one device|rejected:|best: dp" \
  "$ATHANOR" plan "$WORK/gpt3.yaml" --cluster a100-80gb --nodes 128 --global-batch 1536
expect_error bad-cluster-key 1 "unknown key 'memory_gb'|did you mean 'memory_gib'?" \
  bash -c "printf 'devices_per_node: 2\nmemory_gb: 1\npeak_tflops: {f32: 1}\n' > '$WORK/bad.yaml'; '$ATHANOR' plan '$WORK/tiny.yaml' --cluster '$WORK/bad.yaml'"

# --write: the best layout as a config that `athanor train` runs as it is (2 processes).
expect_error write 0 "best: dp 2 tp 1 pp 1|wrote $WORK/best.yaml (mpirun -np 2" \
  "$ATHANOR" plan "$WORK/tiny.yaml" --cluster "$WORK/two.yaml" --write "$WORK/best.yaml"
expect_error train-the-written 0 "step 2" \
  env OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -np 2 \
  "$ATHANOR" train "$WORK/best.yaml" out_dir="$WORK/runs"

[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
