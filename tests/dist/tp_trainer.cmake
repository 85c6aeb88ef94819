# Tensor-parallel training through `athanor train` under mpirun (real processes), checked
# against independent 1-process runs on the same global batches by test_trainer_dist.
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DCLI=<athanor> -DCHECK=<test_trainer_dist> -DCORPUS=<text file>
#         -DSRC=<source dir> -DDIR=<scratch dir> -DSCENARIO=train|dropout|mesh|ckpt|traffic|cli|errors -P tp_trainer.cmake
# Tiny GPT (2 layers, 4 heads, 32 wide, 32 tokens) on the byte tokenizer's 256 tokens (at tp 4
# padded to 512: two of the four vocabulary shards hold only padding), AdamW with warmup and
# cosine decay, gradient clipping and 2 micro-batches per step, f32.
# Tolerances: the loss within 1e-5 relative at every step (compare_loss); grad norms, the
# final validation loss and every weight within rtol 1e-4, atol 2e-5 (compare): the ranks
# sum partial products in another order than one process, nothing else differs.
set(RUN_TIMEOUT 150)
include(${CMAKE_CURRENT_LIST_DIR}/trainer_runs.cmake)
trainer_runs_scratch("seed: 11
model: {type: gpt, n_layer: 2, n_head: 4, n_embd: 32, block_size: 32, dropout: 0.0}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {warmup_steps: 5, decay: cosine, min_lr_ratio: 0.1}
trainer: {max_steps: 20, accum_steps: 2, eval_every: 0, eval_batches: 4, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")


if(SCENARIO STREQUAL "train")
  # 20 AdamW steps at tp 2 (dp 1), with and without sequence parallelism, == 1 process.
  run(ref 1proc trainer.batch_size=8)
  run(tp2 2 trainer.batch_size=8 dist.tp=2)
  equal(tp2 ref)
  run(tp2_sp 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true)
  equal(tp2_sp ref)
  # bf16 autocast trains too (not compared: bf16 rounds differently when sums are split).
  run(tp2_sp_bf16 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true trainer.precision=bf16 trainer.max_steps=7)
  # f16 with the GradScaler from a scale that overflows now and then: those steps are skipped
  # on every rank together (found_inf is agreed; a rank that stepped alone would leave the
  # others in a collective), the scale backs off, training goes on.
  run(tp2_f16 2 trainer.batch_size=8 dist.tp=2 trainer.precision=f16 scaler.init_scale=1048576 trainer.max_steps=12)
  file(READ ${DIR}/runs/tp2_f16/metrics.jsonl _m)
  if(NOT _m MATCHES "\"skipped\":true" OR NOT _m MATCHES "\"step\":12,[^\n]*\"skipped\":false")
    message(FATAL_ERROR "expected a skipped (overflowed) step and step 12 taken:\n${_m}")
  endif()
elseif(SCENARIO STREQUAL "dropout")
  # Dropout 0.1 at tp 2: two runs are bitwise equal; and since the masks are those of one
  # process (replicated stream; sequence-parallel slices of the logical mask), equal to it.
  set(_d model.dropout=0.1 trainer.max_steps=8)
  run(tp2_drop_a 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true ${_d})
  run(tp2_drop_b 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true ${_d})
  check(compare ${DIR}/runs/tp2_drop_a ${DIR}/runs/tp2_drop_b 0 0)
  run(ref_drop 1proc trainer.batch_size=8 ${_d})
  equal(tp2_drop_a ref_drop)
elseif(SCENARIO STREQUAL "mesh")
  # dp 2 x tp 2 (4 processes) with ZeRO-1 on dp == 1 process with the global batch.
  run(ref 1proc trainer.batch_size=8)
  run(dp2tp2_z1 4 trainer.batch_size=4 dist.tp=2 dist.zero_stage=1)
  equal(dp2tp2_z1 ref)
  # and ZeRO-3 with sequence parallelism (the blocks sharded over dp, split over tp)
  run(dp2tp2_z3_sp 4 trainer.batch_size=4 dist.tp=2 dist.zero_stage=3 dist.sequence_parallel=true)
  equal(dp2tp2_z3_sp ref)
elseif(SCENARIO STREQUAL "ckpt")
  # Uninterrupted: dp 2 x tp 2, ZeRO-1, 10 steps, checkpoints after steps 5 and 10.
  set(_u trainer.max_steps=10 checkpoint.every=5 checkpoint.keep_last=0)
  run(full 4 trainer.batch_size=4 dist.tp=2 dist.zero_stage=1 ${_u})
  # Each resumed copy starts from the step-5 checkpoint (its metrics.jsonl is kept up to it).
  resume_from_step5(at_tp1 1proc trainer.batch_size=8)
  resume_from_step5(at_tp4 4 trainer.batch_size=8 dist.tp=4)
  resume_from_step5(at_dp4 4 trainer.batch_size=2 dist.zero_stage=2)
  resume_from_step5(at_tp2_sp 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true dist.zero_stage=0)
  resume_from_step5(at_dp2tp2_z3 4 trainer.batch_size=4 dist.tp=2 dist.zero_stage=3)
  # export-hf merges the step-10 checkpoint's shards: importing the export back gives the
  # run's final (merged) weights, exactly.
  execute_process(COMMAND ${CLI} export-hf ${DIR}/runs/full ${DIR}/hf --checkpoint ${DIR}/runs/full/checkpoints/step-000010
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  message("${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "export-hf failed")
  endif()
  execute_process(COMMAND ${CLI} import-hf ${DIR}/hf ${DIR}/reimported.safetensors RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "import-hf failed:\n${_out}${_err}")
  endif()
  check(compare_weights ${DIR}/reimported.safetensors ${DIR}/runs/full/model.safetensors 0 0)
  file(READ ${DIR}/runs/full/checkpoints/step-000010/model.safetensors.index.json _index)
  if(NOT _index MATCHES "\"tp_slices\"")
    message(FATAL_ERROR "the dp2 x tp2 checkpoint's index maps no slices:\n${_index}")
  endif()
elseif(SCENARIO STREQUAL "traffic")
  # The ledger's tp bytes per step (metrics.jsonl "comm".tp.bytes) against the theory, exactly:
  # per micro-batch (B = 4 sequences of T = 32 tokens, d = 32, L = 2 layers, f32 = 4 bytes):
  #   tensor parallel: (4 L + 2) all-reduces of B·T·d (4 per layer, the embedding's g, the
  #                    lm_head's f) + 3 of B·T (the loss's max, sum of exps, target logit);
  #   sequence parallel (regather): (4 L + 2) reduce-scatters and (4 L + 2) + (2 L + 1)
  #                    all-gathers of B·T·d (the re-gathers of the column-parallel inputs in
  #                    backward) + the loss's 3 of B·T;
  # per step: the gradient norm's all-reduce (one f64) and, with sequence parallelism, the sum
  # over tp of the replicated gradients (LayerNorms 2·(2 L + 1)·d, wpe T·d, c_proj biases 2 L·d).
  math(EXPR _act "4 * 32 * 32 * 4")
  math(EXPR _ce "3 * 4 * 32 * 4")
  math(EXPR _tp "2 * ((4 * 2 + 2) * ${_act} + ${_ce}) + 8")
  math(EXPR _sp_grads "(2 * (2 * 2 + 1) * 32 + 32 * 32 + 2 * 2 * 32) * 4")
  math(EXPR _sp "2 * ((4 * 2 + 2) * ${_act} + (4 * 2 + 2 + 2 * 2 + 1) * ${_act} + ${_ce}) + 8 + ${_sp_grads}")
  run(traffic_tp 2 trainer.batch_size=4 dist.tp=2 trainer.max_steps=6)
  check(traffic ${DIR}/runs/traffic_tp tp ${_tp})
  run(traffic_sp 2 trainer.batch_size=4 dist.tp=2 dist.sequence_parallel=true trainer.max_steps=6)
  check(traffic ${DIR}/runs/traffic_sp tp ${_sp})
  # The same at dp 2 x tp 2: the tp group's traffic does not change with dp.
  run(traffic_dp2tp2 4 trainer.batch_size=4 dist.tp=2 trainer.max_steps=6)
  check(traffic ${DIR}/runs/traffic_dp2tp2 tp ${_tp})
elseif(SCENARIO STREQUAL "cli")
  # The example config as a user runs it (dp 2 x tp 2 with sequence parallelism), shortened.
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np 4 ${CLI} train ${SRC}/examples/gpt-char-tp.yaml out_dir=${DIR}/cli_runs
                          data.corpus=${DIR}/corpus.txt data.cache_dir=${DIR}/data trainer.max_steps=3 schedule.warmup_steps=1 trainer.batch_size=2
                          trainer.eval_batches=2 trainer.sample_tokens=16 trainer.time_limit_s=0 checkpoint.every=0
                          observe.tensorboard=false
                  WORKING_DIRECTORY ${SRC} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 150)
  message("${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np 4 athanor train examples/gpt-char-tp.yaml failed (${_rc})")
  endif()
  file(GLOB _dirs LIST_DIRECTORIES true ${DIR}/cli_runs/*)
  list(LENGTH _dirs _n)
  if(NOT _n EQUAL 1)
    message(FATAL_ERROR "expected one run directory, found ${_n}: ${_dirs}")
  endif()
  foreach(f config.yaml metrics.jsonl model.safetensors report.html)
    if(NOT EXISTS ${_dirs}/${f})
      message(FATAL_ERROR "the run directory lacks ${f}")
    endif()
  endforeach()
  file(READ ${_dirs}/report.html _r)
  if(NOT _r MATCHES "Communication per step by mesh dimension")
    message(FATAL_ERROR "report.html does not draw the communication per mesh dimension")
  endif()
  file(READ ${_dirs}/metrics.jsonl _m)
  if(NOT _m MATCHES "\"comm\":{\"dp\":{[^}]*},\"tp\":{")
    message(FATAL_ERROR "metrics.jsonl has no per-dimension communication:\n${_m}")
  endif()
  if(NOT _out MATCHES "x 2 dp ranks \\(mpi, zero_stage 1; tp 2, sequence parallel\\)")
    message(FATAL_ERROR "the run did not train on dp 2 x tp 2")
  endif()
  # One process evaluates and samples the merged weights of the tensor-parallel run.
  foreach(cmd eval generate)
    execute_process(COMMAND ${CLI} ${cmd} ${_dirs} data.cache_dir=${DIR}/data WORKING_DIRECTORY ${SRC}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _o ERROR_VARIABLE _e TIMEOUT 60)
    if(NOT _rc EQUAL 0 OR NOT "${_e}" MATCHES "evaluating its merged weights in one process")
      message(FATAL_ERROR "athanor ${cmd} of the tp run in one process failed (${_rc}):\n${_o}${_e}")
    endif()
  endforeach()
elseif(SCENARIO STREQUAL "errors")
  # Bad layouts: a clear error naming the numbers, before any work (no data is prepared).
  expect_error("model.n_head \\(3\\) is not divisible by dist.tp \\(2\\).*hint:" 2 dist.tp=2 model.n_head=3 model.n_embd=48)
  expect_error("the world size 2 is not divisible by tp x pp = 4 x 1 = 4.*hint:" 2 dist.tp=4)
  file(WRITE ${DIR}/convnet.yaml "model: {type: convnet}\ndata: {type: fashion_mnist}\ndist: {tp: 2}\n")
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np 2 ${CLI} train ${DIR}/convnet.yaml out_dir=${DIR}/runs name=bad_convnet
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
  if(_rc EQUAL 0 OR NOT "${_out}${_err}" MATCHES "dist.tp 2 is not supported for model.type convnet.*hint: set dist.tp: 1")
    message(FATAL_ERROR "expected the convnet to be refused under dist.tp 2, got exit ${_rc}:\n${_out}${_err}")
  endif()
  message("ok: convnet with dist.tp=2 refused")
  expect_error("model.vocab_size \\(258\\) is not divisible by dist.tp \\(4\\) and dist.vocab_pad_multiple is 1" 4 dist.tp=4 model.vocab_size=258 dist.vocab_pad_multiple=1)
  expect_error("dist.sequence_parallel splits the sequence across tp: model.block_size \\(30\\) is not divisible by dist.tp \\(4\\)" 4 dist.tp=4 dist.sequence_parallel=true model.block_size=30)
  expect_error("dist.tp is 2 but this run is one process" 1proc dist.backend=auto dist.tp=2)
  expect_error("the world size 2 is not divisible by tp x pp = 1 x 4 = 4.*hint:" 2 dist.pp=4 model.n_layer=4)
  expect_error("optimizer.type lamb with dist.tp 2: its trust ratio is the norm of each whole weight" 2 dist.tp=2 optimizer.type=lamb)
else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
