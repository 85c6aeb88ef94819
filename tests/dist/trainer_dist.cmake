# Data-parallel training through `athanor train` under mpirun (real processes), checked
# against independent 1-process runs on the same global batches by test_trainer_dist.
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DCLI=<athanor> -DCHECK=<test_trainer_dist> -DCORPUS=<text file>
#         -DDIR=<scratch dir> -DSCENARIO=sgd|zero|reshard|kill|errors -P trainer_dist.cmake
# Tiny GPT (2 layers, 32 wide, 32 tokens), global micro-batch 8 × accum 2, gradient clipping
# (and SGD without).
# Tolerance: rtol 1e-4, atol 2e-5 on losses, grad norms and every weight (f32; the ranks' sum
# order differs from one process's, nothing else).
set(_flags ${MPIFLAGS})
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
configure_file(${CORPUS} ${DIR}/corpus.txt COPYONLY)  # a private copy: the shards are cached per test
file(WRITE ${DIR}/tiny.yaml "seed: 7
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {decay: constant}
trainer: {max_steps: 6, accum_steps: 2, eval_every: 0, eval_batches: 4, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")
set(_rtol 1e-4)
set(_atol 2e-5)

# run(<name> <np or 1proc> <overrides…>): out_dir ${DIR}/runs, name <name>.
function(run name np)
  set(_cmd ${CLI} train ${DIR}/tiny.yaml out_dir=${DIR}/runs name=${name} ${ARGN})
  if(np STREQUAL "1proc")
    set(_cmd ${_cmd} dist.backend=none)
  else()
    set(_cmd ${MPIEXEC} ${_flags} -np ${np} ${_cmd})
  endif()
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "run ${name} (${np}) failed (${_rc}):\n${_out}${_err}")
  endif()
  string(REGEX MATCH "training [^\n]*" _line "${_out}")
  message("${name}: ${_line}")
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
  function(expect_error what)
    execute_process(COMMAND ${CLI} train ${DIR}/tiny.yaml out_dir=${DIR}/runs name=bad ${ARGN}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
    if(_rc EQUAL 0 OR NOT "${_out}${_err}" MATCHES "${what}")
      message(FATAL_ERROR "expected an error matching '${what}' for ${ARGN}, got exit ${_rc}:\n${_out}${_err}")
    endif()
    message("ok: ${ARGN} -> ${what}")
  endfunction()
  expect_error("dist.zero_stage 3 is not supported by the trainer.*FullyShardedBlock" dist.backend=mpi dist.zero_stage=3)
  expect_error("dist.zero_stage must be 0, 1, 2 or 3, got 5" dist.backend=mpi dist.zero_stage=5)
  expect_error("dist.zero_stage.*applies to dist.backend=auto.mpi" dist.backend=none dist.zero_stage=1)
  expect_error("dist.bucket_mb must be > 0" dist.backend=mpi dist.bucket_mb=0)
else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
