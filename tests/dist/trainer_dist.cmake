# Data-parallel training through `athanor train` under mpirun (real processes), checked
# against independent 1-process runs on the same global batches by test_trainer_dist.
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DCLI=<athanor> -DCHECK=<test_trainer_dist> -DCORPUS=<text file>
#         -DDIR=<scratch dir> -DSCENARIO=sgd|zero|zero3|zero3_mlp|llama|llama_par|reshard|zero3_reshard|kill|errors -P trainer_dist.cmake
# Tiny GPT (2 layers, 32 wide, 32 tokens), global micro-batch 8 × accum 2, gradient clipping
# (and SGD without).
# Tolerance: rtol 1e-4, atol 2e-5 on losses, grad norms and every weight (f32; the ranks' sum
# order differs from one process's, nothing else).
include(${CMAKE_CURRENT_LIST_DIR}/trainer_runs.cmake)
trainer_runs_scratch("seed: 7
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {decay: constant}
trainer: {max_steps: 6, accum_steps: 2, eval_every: 0, eval_batches: 4, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
set(_rtol 1e-4)
set(_atol 2e-5)


# The text sample a run printed at its end (GPT).
function(final_sample name var)
  file(READ ${DIR}/runs/${name}.out _o)
  string(REGEX MATCH "--- sample ---\n.*\n--------------" _s "${_o}")  # (the text may hold newlines)
  if(_s STREQUAL "")
    message(FATAL_ERROR "run ${name} printed no sample:\n${_o}")
  endif()
  set(${var} "${_s}" PARENT_SCOPE)
endfunction()

function(compare a b)
  execute_process(COMMAND ${CHECK} compare ${DIR}/runs/${a} ${DIR}/runs/${b} ${_rtol} ${_atol}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  message("${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${a} differs from ${b}")
  endif()
endfunction()

if(SCENARIO STREQUAL "sgd")
  # 2 ranks × micro-batch 4 == 1 process × 8 (SGD with momentum, accum 2, clipping).
  set(_sgd optimizer.type=sgd optimizer.momentum=0.9 optimizer.lr=0.05)
  run(ref_sgd 1proc trainer.batch_size=8 ${_sgd})
  run(dp2_sgd 2 trainer.batch_size=4 ${_sgd})
  compare(dp2_sgd ref_sgd)
  # Without clipping too: clipping rescales both runs' gradients to the same norm, which
  # would hide a wrong gradient scale from the weights (the grad norms are compared as well).
  run(ref_sgd_noclip 1proc trainer.batch_size=8 ${_sgd} optimizer.grad_clip=0)
  run(dp2_sgd_noclip 2 trainer.batch_size=4 ${_sgd} optimizer.grad_clip=0)
  compare(dp2_sgd_noclip ref_sgd_noclip)
elseif(SCENARIO STREQUAL "zero")
  # AdamW: DDP (zero 0), ZeRO-1 and ZeRO-2 with 2 ranks == 1 process; ZeRO-2 with 4 ranks × 2.
  run(ref_adamw 1proc trainer.batch_size=8)
  foreach(stage 0 1 2)
    run(dp2_z${stage} 2 trainer.batch_size=4 dist.zero_stage=${stage})
    compare(dp2_z${stage} ref_adamw)
  endforeach()
  run(dp4_z2 4 trainer.batch_size=2 dist.zero_stage=2)
  compare(dp4_z2 ref_adamw)
elseif(SCENARIO STREQUAL "zero3")
  # ZeRO-3 (the GPT's blocks transformer.h.<i> sharded, gathered per forward/backward) with 2 and
  # 4 ranks == 1 process; also with model.gradient_checkpointing (the block is checkpointed once,
  # by ZeRO-3). The resolved config names the sharded modules; the weights keep their names.
  run(ref_adamw 1proc trainer.batch_size=8)
  run(dp2_z3 2 trainer.batch_size=4 dist.zero_stage=3)
  compare(dp2_z3 ref_adamw)
  run(dp4_z3 4 trainer.batch_size=2 dist.zero_stage=3)
  compare(dp4_z3 ref_adamw)
  run(dp2_z3_gc 2 trainer.batch_size=4 dist.zero_stage=3 model.gradient_checkpointing=true)
  compare(dp2_z3_gc ref_adamw)
  # The sample is generated on rank 0 alone with the gathered weights: the 1-process text.
  final_sample(ref_adamw _ref_sample)
  final_sample(dp4_z3 _z3_sample)
  if(NOT _z3_sample STREQUAL _ref_sample)
    message(FATAL_ERROR "the ZeRO-3 run sampled other text than 1 process:\n${_z3_sample}\nvs\n${_ref_sample}")
  endif()
  file(READ ${DIR}/runs/dp2_z3/config.yaml _cfg)
  if(NOT _cfg MATCHES "zero_stage 3 sharded modules[^\n]*: transformer.h.0, transformer.h.1\n")
    message(FATAL_ERROR "the resolved config does not name the sharded modules:\n${_cfg}")
  endif()
elseif(SCENARIO STREQUAL "zero3_mlp")
  # ZeRO-3 of the MLP (its Linear layers are the units) on Fashion-MNIST: 2 and 4 ranks == 1 process.
  file(WRITE ${DIR}/mlp.yaml "seed: 7
model: {type: mlp, sizes: [784, 32, 32, 10]}
data: {type: fashion_mnist, num_workers: 0}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {decay: constant}
trainer: {max_steps: 4, accum_steps: 2, eval_every: 0, eval_batches: 2, log_every: 1}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
  function(run_mlp name np)
    run_config(mlp.yaml ${name} ${np} ${ARGN})
  endfunction()
  run_mlp(ref_mlp 1proc trainer.batch_size=16)
  run_mlp(dp2_z3_mlp 2 trainer.batch_size=8 dist.zero_stage=3)
  compare(dp2_z3_mlp ref_mlp)
  run_mlp(dp4_z3_mlp 4 trainer.batch_size=4 dist.zero_stage=3)
  compare(dp4_z3_mlp ref_mlp)
  file(READ ${DIR}/runs/dp2_z3_mlp/config.yaml _cfg)
  if(NOT _cfg MATCHES "zero_stage 3 sharded modules[^\n]*: layers.0, layers.2, layers.4\n")
    message(FATAL_ERROR "the resolved config does not name the MLP's sharded Linear layers:\n${_cfg}")
  endif()
  # The convnet is refused with a clear error (its layers are not called through run_forward).
  file(WRITE ${DIR}/convnet.yaml "model: {type: convnet}
data: {type: fashion_mnist, num_workers: 0}
trainer: {max_steps: 1, batch_size: 4}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np 2 ${CLI} train ${DIR}/convnet.yaml out_dir=${DIR}/runs name=convnet_z3
                          dist.zero_stage=3
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
  if(_rc EQUAL 0 OR NOT "${_out}${_err}" MATCHES "dist.zero_stage 3 is not supported for model.type convnet")
    message(FATAL_ERROR "expected the convnet at zero_stage 3 to be refused, got exit ${_rc}:\n${_out}${_err}")
  endif()
elseif(SCENARIO STREQUAL "llama")
  # The Llama (GQA, RoPE, SwiGLU, untied head; dropout 0) under DDP and ZeRO 1/2/3 with 2 ranks
  # == 1 process; ZeRO-3 shards its layers model.layers.<i> (also with gradient checkpointing);
  # the ZeRO-3 run samples the 1-process text. (Tensor and pipeline parallelism: llama_par.)
  file(WRITE ${DIR}/llama.yaml "seed: 7
model: {type: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 64, block_size: 32}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {decay: constant}
trainer: {max_steps: 4, accum_steps: 2, eval_every: 0, eval_batches: 4, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
  function(run_llama name np)
    run_config(llama.yaml ${name} ${np} ${ARGN})
  endfunction()
  run_llama(ref_llama 1proc trainer.batch_size=8)
  foreach(stage 0 1 2 3)
    run_llama(dp2_llama_z${stage} 2 trainer.batch_size=4 dist.zero_stage=${stage})
    compare(dp2_llama_z${stage} ref_llama)
  endforeach()
  run_llama(dp2_llama_z3_gc 2 trainer.batch_size=4 dist.zero_stage=3 model.gradient_checkpointing=true)
  compare(dp2_llama_z3_gc ref_llama)
  file(READ ${DIR}/runs/dp2_llama_z3/config.yaml _cfg)
  if(NOT _cfg MATCHES "zero_stage 3 sharded modules[^\n]*: model.layers.0, model.layers.1\n")
    message(FATAL_ERROR "the resolved config does not name the Llama's sharded layers:\n${_cfg}")
  endif()
  final_sample(ref_llama _ref_sample)
  final_sample(dp2_llama_z3 _z3_sample)
  if(NOT _z3_sample STREQUAL _ref_sample)
    message(FATAL_ERROR "the ZeRO-3 Llama sampled other text than 1 process:\n${_z3_sample}\nvs\n${_ref_sample}")
  endif()
elseif(SCENARIO STREQUAL "llama_par")
  # The Llama (GQA: 4 heads, 2 kv heads; 4 layers; untied head) under tensor and pipeline
  # parallelism through `athanor train`, 6 AdamW steps with clipping, f32: tp 2 with sequence
  # parallelism and tp 2 x pp 2 (1F1B) with ZeRO-1 == 1 process (the loss at every step
  # within 1e-5, grad norms and weights within rtol 1e-4, atol 2e-5: equal()); the tp 2 x pp 2
  # run's step-3 checkpoint resumed in the same layout == the uninterrupted run, bit for bit,
  # and by one process == it (equal()); its export to HF imports back as the run's weights;
  # splits the ranks cannot make are refused before any work. (Every schedule's AdamW steps,
  # MHA/MQA, ZeRO-3 are checked against one process in tests/dist/test_llama_parallel.cpp.)
  file(WRITE ${DIR}/tiny.yaml "seed: 7
model: {type: llama, n_layer: 4, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 64, block_size: 32}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {decay: constant}
trainer: {max_steps: 6, accum_steps: 2, eval_every: 0, eval_batches: 2, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
  run(ref 1proc trainer.batch_size=8)
  run(tp2 2 trainer.batch_size=8 dist.tp=2 dist.sequence_parallel=true)
  equal(tp2 ref)
  # Its tp bytes per step are the GPT's theory (tp_trainer.cmake "traffic"): q, k and v read one
  # all-gathered input (and regather it once), as the GPT's fused c_attn. Per micro-batch
  # (B 8, T 32, d 32, L 4, f32) (4 L + 2) reduce-scatters and (4 L + 2) + (2 L + 1) all-gathers
  # of B·T·d, the loss's 3 of B·T; per step the grad norm (8 bytes) and the RMSNorms' gradients
  # summed over tp ((2 L + 1)·d).
  math(EXPR _act "8 * 32 * 32 * 4")
  math(EXPR _tp "2 * ((4 * 4 + 2 + 4 * 4 + 2 + 2 * 4 + 1) * ${_act} + 3 * 8 * 32 * 4) + 8 + (2 * 4 + 1) * 32 * 4")
  check(traffic ${DIR}/runs/tp2 tp ${_tp})
  set(_u checkpoint.every=3 checkpoint.keep_last=0)
  run(full 4 trainer.batch_size=8 dist.tp=2 dist.pp=2 dist.zero_stage=1 ${_u})
  equal(full ref)
  # Generation through the tp ranks' vocabulary shards and the pipeline's stages: one process's text.
  final_sample(ref _ref_sample)
  foreach(r tp2 full)
    final_sample(${r} _sample)
    if(NOT _sample STREQUAL _ref_sample)
      message(FATAL_ERROR "the Llama run ${r} sampled other text than 1 process:\n${_sample}\nvs\n${_ref_sample}")
    endif()
  endforeach()
  file(COPY ${DIR}/runs/full/ DESTINATION ${DIR}/runs/resumed)
  file(REMOVE_RECURSE ${DIR}/runs/resumed/checkpoints/step-000006 ${DIR}/runs/resumed/model.safetensors)
  file(WRITE ${DIR}/runs/resumed/checkpoints/latest "step-000003\n")
  run(resumed 4 trainer.batch_size=8 dist.tp=2 dist.pp=2 dist.zero_stage=1 resume=auto ${_u})
  file(READ ${DIR}/runs/resumed.out _o)
  if(NOT _o MATCHES "resumed from [^\n]*step-000003 at step 3")
    message(FATAL_ERROR "the tp 2 x pp 2 Llama did not resume from step 3:\n${_o}")
  endif()
  check(compare_loss ${DIR}/runs/resumed ${DIR}/runs/full 0)
  check(compare ${DIR}/runs/resumed ${DIR}/runs/full 0 0)
  # The same checkpoint in another layout: resumed by one process (the shards merged to the
  # 1-process names), and exported to Hugging Face's layout as whole tensors.
  file(COPY ${DIR}/runs/full/ DESTINATION ${DIR}/runs/at1)
  file(REMOVE_RECURSE ${DIR}/runs/at1/checkpoints/step-000006 ${DIR}/runs/at1/model.safetensors)
  file(WRITE ${DIR}/runs/at1/checkpoints/latest "step-000003\n")
  run(at1 1proc trainer.batch_size=8 resume=auto ${_u})
  equal(at1 full)
  execute_process(COMMAND ${CLI} export-hf ${DIR}/runs/full ${DIR}/hf --checkpoint ${DIR}/runs/full/checkpoints/step-000006
                  RESULT_VARIABLE _rc1 OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  execute_process(COMMAND ${CLI} import-hf ${DIR}/hf ${DIR}/reimported.safetensors RESULT_VARIABLE _rc2 OUTPUT_VARIABLE _out2 ERROR_VARIABLE _err2)
  if(NOT _rc1 EQUAL 0 OR NOT _rc2 EQUAL 0 OR NOT _out2 MATCHES "Llama, 39 tensors")
    message(FATAL_ERROR "export-hf / import-hf of the tp 2 x pp 2 Llama failed:\n${_out}${_err}${_out2}${_err2}")
  endif()
  check(compare_weights ${DIR}/reimported.safetensors ${DIR}/runs/full/model.safetensors 0 0)
  expect_error("model.n_kv_head \\(3\\) and dist.tp \\(2\\) do not divide one another.*multi-query attention.*hint:" 2
               dist.tp=2 model.n_head=6 model.n_kv_head=3 model.n_embd=48)
  expect_error("model.intermediate_size \\(66\\) is not divisible by dist.tp \\(4\\).*hint:" 4 dist.tp=4 model.intermediate_size=66)
elseif(SCENARIO STREQUAL "zero3_reshard")
  # Checkpoints keep the 1-process names at every stage (each rank writes its shard), so they
  # reshard through the trainer:
  # saved with 4 ranks at ZeRO-3, resumed with 2 ranks at ZeRO-1 and with 1 process; saved with
  # 2 ranks at ZeRO-2, resumed with 2 ranks at ZeRO-3. Each equals the uninterrupted 1-process run.
  run(ref_adamw 1proc trainer.batch_size=8 trainer.eval_batches=0)
  run(saved_z3 4 trainer.batch_size=2 dist.zero_stage=3 trainer.max_steps=3 checkpoint.every=3 trainer.eval_batches=0)
  run(saved_z2 2 trainer.batch_size=4 dist.zero_stage=2 trainer.max_steps=3 checkpoint.every=3 trainer.eval_batches=0)
  # Each rank wrote its own shards (rank 0 the indexes and the manifest); `inspect` verifies
  # them and their index, `export-hf` merges them.
  set(_ck ${DIR}/runs/saved_z3/checkpoints/step-000003)
  foreach(_f model-00001-of-00004 model-00004-of-00004 optimizer-00001-of-00004 optimizer-00004-of-00004)
    if(NOT EXISTS ${_ck}/${_f}.safetensors)
      message(FATAL_ERROR "the 4-rank checkpoint has no ${_f}.safetensors")
    endif()
  endforeach()
  if(EXISTS ${_ck}/model.safetensors OR NOT EXISTS ${_ck}/model.safetensors.index.json)
    message(FATAL_ERROR "the 4-rank checkpoint is not sharded (model.safetensors, no index)")
  endif()
  execute_process(COMMAND ${CLI} inspect ${_ck} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0 OR NOT _out MATCHES "model \\(sharded, model.safetensors.index.json\\): [0-9]+ tensors[^\n]*agree")
    message(FATAL_ERROR "inspect of the sharded checkpoint failed (${_rc}):\n${_out}${_err}")
  endif()
  execute_process(COMMAND ${CLI} export-hf ${DIR}/runs/saved_z3 ${DIR}/hf_z3 RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0 OR NOT EXISTS ${DIR}/hf_z3/model.safetensors)
    message(FATAL_ERROR "export-hf of the sharded checkpoint failed (${_rc}):\n${_out}${_err}")
  endif()
  foreach(r z3_to_dp2_z1 z3_to_1proc)
    file(COPY ${DIR}/runs/saved_z3/ DESTINATION ${DIR}/runs/${r})
  endforeach()
  file(COPY ${DIR}/runs/saved_z2/ DESTINATION ${DIR}/runs/z2_to_dp2_z3)
  run(z3_to_dp2_z1 2 trainer.batch_size=4 dist.zero_stage=1 resume=auto trainer.eval_batches=0)
  run(z3_to_1proc 1proc trainer.batch_size=8 resume=auto trainer.eval_batches=0)
  run(z2_to_dp2_z3 2 trainer.batch_size=4 dist.zero_stage=3 resume=auto trainer.eval_batches=0)
  compare(z3_to_dp2_z1 ref_adamw)
  compare(z3_to_1proc ref_adamw)
  compare(z2_to_dp2_z3 ref_adamw)
elseif(SCENARIO STREQUAL "reshard")
  # Save at step 3 with 4 ranks ZeRO-2; resume to step 6 with 2 ranks ZeRO-1 and with 1 process;
  # both equal an uninterrupted 1-process run of 6 steps.
  # A third resume changes the global micro-batch (16 × accum 1 instead of 8 × 2: the same
  # samples per step) so the loader position must be mapped through the global sample count.
  # eval_batches 0: the whole validation set, whatever the eval batch size.
  run(ref_adamw 1proc trainer.batch_size=8 trainer.eval_batches=0)
  run(saved 4 trainer.batch_size=2 dist.zero_stage=2 trainer.max_steps=3 checkpoint.every=3 trainer.eval_batches=0)
  foreach(r resumed_dp2 resumed_1proc resumed_b16)
    file(COPY ${DIR}/runs/saved/ DESTINATION ${DIR}/runs/${r})
  endforeach()
  run(resumed_dp2 2 trainer.batch_size=4 dist.zero_stage=1 resume=auto trainer.eval_batches=0)
  run(resumed_1proc 1proc trainer.batch_size=8 resume=auto trainer.eval_batches=0)
  run(resumed_b16 1proc trainer.batch_size=16 trainer.accum_steps=1 resume=auto trainer.eval_batches=0)
  compare(resumed_dp2 ref_adamw)
  compare(resumed_1proc ref_adamw)
  compare(resumed_b16 ref_adamw)
elseif(SCENARIO STREQUAL "kill")
  # Rank 1 SIGKILLs itself in step 3 (test hook): the other ranks must exit non-zero
  # within the collective timeout (5 s), with mpirun naming the lost rank or the timeout naming the collective.
  string(TIMESTAMP _t0 "%s")
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np 2 -x ATHANOR_TEST_KILL_RANK -x ATHANOR_TEST_KILL_STEP
                          ${CLI} train ${DIR}/tiny.yaml out_dir=${DIR}/runs name=killed trainer.batch_size=4 trainer.max_steps=20
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
  string(TIMESTAMP _t1 "%s")
  math(EXPR _dt "${_t1} - ${_t0}")
  message("---- output (exit ${_rc}, ${_dt}s) ----\n${_out}${_err}----")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit from mpirun, got 0")
  endif()
  if(NOT "${_out}${_err}" MATCHES "killing myself in step 3")
    message(FATAL_ERROR "the test hook did not fire")
  endif()
  if(NOT "${_out}${_err}" MATCHES "(rank 1 with PID [0-9]+ on node [^ ]+ exited on signal 9|timed out after [0-9.]+s. ranks not arrived: \\[1\\])")
    message(FATAL_ERROR "the output names neither the lost rank 1 nor the timed-out collective")
  endif()
  if(_dt GREATER 30)
    message(FATAL_ERROR "took ${_dt}s, more than 30s")
  endif()
elseif(SCENARIO STREQUAL "errors")
  # Config errors name the key and what to do (1 process; no collective is reached).
  expect_error("observe.layer_norms cannot be used with dist.zero_stage 3.*sharded" 1proc dist.backend=mpi dist.zero_stage=3 observe.layer_norms=true)
  expect_error("dist.zero_stage must be 0, 1, 2 or 3, got 5" 1proc dist.backend=mpi dist.zero_stage=5)
  expect_error("dist.zero_stage.*applies to dist.backend=auto.mpi" 1proc dist.backend=none dist.zero_stage=1)
  expect_error("dist.bucket_mb must be > 0" 1proc dist.backend=mpi dist.bucket_mb=0)
else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
