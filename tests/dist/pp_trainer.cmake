# Pipeline parallelism through `athanor train` under mpirun (real processes), checked against
# independent 1-process runs on the same global batches by test_trainer_dist.
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DCLI=<athanor> -DCHECK=<test_trainer_dist> -DCORPUS=<text file>
#         -DSRC=<source dir> -DDIR=<scratch dir> -DSCENARIO=<below> -P pp_trainer.cmake
# Tiny GPT (4 layers, 4 heads, 32 wide, 32 tokens) on the byte tokenizer's 256 tokens, AdamW
# with warmup and cosine decay, gradient clipping, f32.
# Tolerances: the loss within 1e-5 relative at every step (compare_loss); grad norms, the final
# validation loss and every weight within rtol 1e-4, atol 2e-5 (compare).
#   matrix   every schedule at pp 2 and 4 with 4 and 8 micro-batches (interleaved at pp 2 with
#            2 virtual stages): 20 AdamW steps == 1 process
#   layout   an unbalanced layout (dist.pp_layers [3, 1]) == 1 process
#   dropout  dropout 0.1 and gradient checkpointing at pp 2: == 1 process (the masks are its)
#   amp      f16 with the scaler (overflowing steps skipped on every rank together), bf16 trains
#   mesh3d   dp 2 x tp 2 x pp 2 (8 processes) with ZeRO-1, 10 steps == 1 process; with sequence parallelism
#            and ZB-H1 too; dp 2 x pp 2 interleaved (DDP over two chunks per rank)
#   ckpt     a checkpoint of dp 2 x tp 2 x pp 2 resumes at pp 1 and at dp 4 x pp 2 as the uninterrupted run
#   traffic  the ledger's pp bytes per step against the theory, exactly
#   cli      mpirun -np 8 athanor train examples/gpt-char-3d.yaml: one run directory, the report's
#            pipeline timeline, a trace with a track per rank, a resume
#   errors   bad layouts: a clear error before any work
set(RUN_TIMEOUT 200)
include(${CMAKE_CURRENT_LIST_DIR}/trainer_runs.cmake)
trainer_runs_scratch("seed: 11
model: {type: gpt, n_layer: 4, n_head: 4, n_embd: 32, block_size: 32, dropout: 0.0}
data: {type: text, corpus: ${DIR}/corpus.txt, tokenizer: byte, cache_dir: ${DIR}/data, num_workers: 0, val_fraction: 0.1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, grad_clip: 0.5}
schedule: {warmup_steps: 5, decay: cosine, min_lr_ratio: 0.1}
trainer: {max_steps: 20, accum_steps: 4, eval_every: 0, eval_batches: 4, log_every: 1, sample_tokens: 8}
observe: {tensorboard: false, report: false, peak_gflops: 1.0}
")

# pp(<name> <np> <schedule> <m> <overrides…>): a pipeline run of the schedule with m micro-batches.
function(pp name np schedule m)
  set(_v "")
  if(schedule STREQUAL "interleaved")
    set(_v dist.virtual_stages=2)
  endif()
  run(${name} ${np} trainer.batch_size=4 trainer.accum_steps=${m} dist.pp=${np} dist.pp_schedule=${schedule} ${_v} ${ARGN})
  file(READ ${DIR}/runs/${name}.out _o)
  if(NOT _o MATCHES "; pp ${np}, ${schedule}")
    message(FATAL_ERROR "${name} did not train with pp ${np} and the ${schedule} schedule")
  endif()
endfunction()

if(SCENARIO STREQUAL "layout")
  run(ref4 1proc trainer.batch_size=4 trainer.accum_steps=4)
  # An unbalanced layout (dist.pp_layers) trains the same model.
  pp(pp2_layers 2 1f1b 4 "dist.pp_layers=[3,1]")
  equal(pp2_layers ref4)
  file(READ ${DIR}/runs/pp2_layers/config.yaml _c)
  if(NOT _c MATCHES "blocks per stage: \\[0, 3\\) \\[3, 4\\)")
    message(FATAL_ERROR "config.yaml does not record the layout [3, 1]:\n${_c}")
  endif()
elseif(SCENARIO STREQUAL "matrix")
  foreach(m 4 8)
    run(ref${m} 1proc trainer.batch_size=4 trainer.accum_steps=${m})
    foreach(np 2 4)
      foreach(s gpipe 1f1b interleaved zb-h1)
        if(s STREQUAL "interleaved" AND np EQUAL 4)
          continue()
        endif()
        pp(pp${np}_${s}_m${m} ${np} ${s} ${m})
        equal(pp${np}_${s}_m${m} ref${m})
      endforeach()
    endforeach()
  endforeach()
elseif(SCENARIO STREQUAL "dropout")
  set(_d model.dropout=0.1 trainer.max_steps=8)
  run(ref_drop 1proc trainer.batch_size=4 ${_d})
  pp(pp2_drop 2 1f1b 4 ${_d})
  equal(pp2_drop ref_drop)
  pp(pp2_drop_ckpt 2 zb-h1 4 ${_d} model.gradient_checkpointing=true)
  equal(pp2_drop_ckpt ref_drop)
  pp(pp2_drop_inter 2 interleaved 4 ${_d} model.gradient_checkpointing=true)
  equal(pp2_drop_inter ref_drop)
elseif(SCENARIO STREQUAL "amp")
  # f16 with the GradScaler from a scale that overflows now and then: those steps are skipped on
  # every rank together (found_inf is agreed over every stage), the scale backs off.
  pp(pp2_f16 2 1f1b 4 trainer.precision=f16 scaler.init_scale=1048576 trainer.max_steps=12)
  file(READ ${DIR}/runs/pp2_f16/metrics.jsonl _m)
  if(NOT _m MATCHES "\"skipped\":true" OR NOT _m MATCHES "\"step\":12,[^\n]*\"skipped\":false")
    message(FATAL_ERROR "expected a skipped (overflowed) step and step 12 taken:\n${_m}")
  endif()
  pp(pp2_bf16 2 zb-h1 4 trainer.precision=bf16 trainer.max_steps=6)
elseif(SCENARIO STREQUAL "mesh3d")
  run(ref 1proc trainer.batch_size=8 trainer.max_steps=10)
  run(dp2tp2pp2_z1 8 trainer.batch_size=4 trainer.max_steps=10 dist.tp=2 dist.pp=2 dist.zero_stage=1)
  equal(dp2tp2pp2_z1 ref)
  file(READ ${DIR}/runs/dp2tp2pp2_z1.out _o)
  if(NOT _o MATCHES "x 2 dp ranks \\(mpi, zero_stage 1; tp 2; pp 2, 1f1b\\)")
    message(FATAL_ERROR "the run did not train on dp 2 x tp 2 x pp 2")
  endif()
  run(dp2tp2pp2_sp_zb 8 trainer.batch_size=4 trainer.max_steps=10 dist.tp=2 dist.pp=2 dist.sequence_parallel=true dist.pp_schedule=zb-h1)
  equal(dp2tp2pp2_sp_zb ref)
  # DDP with two model chunks per rank: each chunk's gradients are reduced after its own last backward.
  run(dp2pp2_inter 4 trainer.batch_size=4 trainer.max_steps=10 dist.pp=2 dist.pp_schedule=interleaved dist.virtual_stages=2)
  equal(dp2pp2_inter ref)
elseif(SCENARIO STREQUAL "ckpt")
  set(_u trainer.max_steps=10 checkpoint.every=5 checkpoint.keep_last=0)
  run(full 8 trainer.batch_size=4 dist.tp=2 dist.pp=2 dist.zero_stage=1 ${_u})
  resume_from_step5(at_pp1 1proc trainer.batch_size=8)
  resume_from_step5(at_dp4pp2 8 trainer.batch_size=2 dist.pp=2 dist.zero_stage=1 dist.pp_schedule=zb-h1)
  file(READ ${DIR}/runs/full/checkpoints/step-000010/state.json _s)
  if(NOT _s MATCHES "\"pp\": 2")
    message(FATAL_ERROR "state.json does not record the pipeline layout:\n${_s}")
  endif()
elseif(SCENARIO STREQUAL "traffic")
  # Stage 0 (rank 0, which writes metrics.jsonl) at pp 2, tp 1, per step with m micro-batches of
  # B = 4 sequences of T = 32 tokens, d = 32, f32: m activations sent and m gradients received
  # (B·T·d·4 bytes each), the tied embedding's gradient all-reduced with the last stage (V·d·4,
  # V = 256), and four 8-byte values over pp (the schedule's span and busy time, the loss from
  # the last stage, the gradient norm's sum of squares).
  math(EXPR _act "4 * 32 * 32 * 4")
  foreach(m 4 8)
    math(EXPR _pp "2 * ${m} * ${_act} + 256 * 32 * 4 + 4 * 8")
    pp(traffic_m${m} 2 1f1b ${m} trainer.max_steps=6)
    check(traffic ${DIR}/runs/traffic_m${m} pp ${_pp})
  endforeach()
elseif(SCENARIO STREQUAL "cli")
  set(_run ${MPIEXEC} ${_flags} -np 8 ${CLI} train ${SRC}/examples/gpt-char-3d.yaml out_dir=${DIR}/cli_runs
           data.corpus=${DIR}/corpus.txt data.cache_dir=${DIR}/data schedule.warmup_steps=1 trainer.batch_size=2 trainer.eval_batches=2
           trainer.sample_tokens=16 trainer.time_limit_s=0 checkpoint.every=2 observe.tensorboard=false
           profile.start_step=2 profile.num_steps=1)
  execute_process(COMMAND ${_run} trainer.max_steps=4 WORKING_DIRECTORY ${SRC} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                  ERROR_VARIABLE _err TIMEOUT 250)
  message("${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np 8 athanor train examples/gpt-char-3d.yaml failed (${_rc})")
  endif()
  file(GLOB _dirs LIST_DIRECTORIES true ${DIR}/cli_runs/*)
  list(LENGTH _dirs _n)
  if(NOT _n EQUAL 1)
    message(FATAL_ERROR "expected one run directory, found ${_n}: ${_dirs}")
  endif()
  foreach(f config.yaml metrics.jsonl model.safetensors report.html trace.json pipeline_timeline.json checkpoints/step-000004/state.json)
    if(NOT EXISTS ${_dirs}/${f})
      message(FATAL_ERROR "the run directory lacks ${f}")
    endif()
  endforeach()
  if(NOT _out MATCHES "x 2 dp ranks \\(mpi, zero_stage 1; tp 2, sequence parallel; pp 2, ")
    message(FATAL_ERROR "the run did not train on dp 2 x tp 2 x pp 2")
  endif()
  file(READ ${_dirs}/report.html _r)
  foreach(want "<h2>Pipeline</h2>" "Pipeline timeline of step 2" "rank 7 \\(pp 1, tp 1, dp 1\\)" "bubble, the schedule's theory")
    if(NOT _r MATCHES "${want}")
      message(FATAL_ERROR "report.html does not show '${want}'")
    endif()
  endforeach()
  file(READ ${_dirs}/trace.json _t)
  foreach(r 0 7)
    if(NOT _t MATCHES "\"name\":\"rank ${r} \\(dp [01], tp [01], pp [01]\\)\"")
      message(FATAL_ERROR "trace.json has no track for rank ${r}")
    endif()
  endforeach()
  file(READ ${_dirs}/metrics.jsonl _m)
  if(NOT _m MATCHES "\"pipeline\":{\"schedule\":\"[a-z0-9-]+\",\"stages\":2")
    message(FATAL_ERROR "metrics.jsonl has no pipeline record:\n${_m}")
  endif()
  # Resume: two more steps from the step-4 checkpoint.
  execute_process(COMMAND ${_run} trainer.max_steps=6 resume=auto WORKING_DIRECTORY ${SRC} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                  ERROR_VARIABLE _err TIMEOUT 250)
  if(NOT _rc EQUAL 0 OR NOT _out MATCHES "resumed from [^\n]*step-000004 at step 4" OR NOT _out MATCHES "done: 6 steps")
    message(FATAL_ERROR "the resumed run failed (${_rc}):\n${_out}${_err}")
  endif()
  # One process evaluates and samples the merged weights of the 3-D run.
  foreach(cmd eval generate)
    execute_process(COMMAND ${CLI} ${cmd} ${_dirs} data.cache_dir=${DIR}/data WORKING_DIRECTORY ${SRC}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _o ERROR_VARIABLE _e TIMEOUT 60)
    if(NOT _rc EQUAL 0 OR NOT "${_e}" MATCHES "evaluating its merged weights in one process")
      message(FATAL_ERROR "athanor ${cmd} of the 3-D run in one process failed (${_rc}):\n${_o}${_e}")
    endif()
  endforeach()
elseif(SCENARIO STREQUAL "errors")
  # Bad layouts: a clear error naming the numbers, before any work (no data is prepared).
  expect_error("model.n_layer \\(4\\) is smaller than the 8 virtual stages \\(dist.pp 4 x dist.virtual_stages 2\\): a stage would hold no transformer block.*hint:"
               4 dist.pp=4 dist.pp_schedule=interleaved dist.virtual_stages=2 trainer.accum_steps=8)
  expect_error("the world size 2 is not divisible by tp x pp = 1 x 4 = 4.*hint:" 2 dist.pp=4)
  expect_error("dist.zero_stage 2 with dist.pp 2: .*DeepSpeed allows only ZeRO-1 with pipelines.*hint: use dist.zero_stage 1" 2 dist.pp=2 dist.zero_stage=2)
  expect_error("dist.zero_stage 3 with dist.pp 2" 2 dist.pp=2 dist.zero_stage=3)
  expect_error("trainer.accum_steps \\(6 micro-batches\\) must be a multiple of dist.pp \\(4\\)" 4 dist.pp=4 dist.pp_schedule=interleaved dist.virtual_stages=1 trainer.accum_steps=6)
  expect_error("dist.virtual_stages 2 is for the interleaved schedule, not 1f1b" 2 dist.pp=2 dist.virtual_stages=2)
  expect_error("dist.pp_layers sums to 5 blocks but model.n_layer is 4" 2 dist.pp=2 "dist.pp_layers=[3,2]")
  expect_error("dist.pp_layers gives stage 1 0 blocks" 2 dist.pp=2 "dist.pp_layers=[4,0]")
  expect_error("dist.pp is 2 but this run is one process" 1proc dist.backend=auto dist.pp=2)
  expect_error("dist.virtual_stages is 2 but dist.pp is 1" 1proc dist.backend=auto dist.virtual_stages=2)
  file(WRITE ${DIR}/mlp.yaml "model: {type: mlp}\ndata: {type: fashion_mnist}\ndist: {pp: 2}\n")
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np 2 ${CLI} train ${DIR}/mlp.yaml out_dir=${DIR}/runs name=bad_mlp
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
  if(_rc EQUAL 0 OR NOT "${_out}${_err}" MATCHES "dist.pp 2 is not supported for model.type mlp.*hint: set dist.pp: 1")
    message(FATAL_ERROR "expected the mlp to be refused under dist.pp 2, got exit ${_rc}:\n${_out}${_err}")
  endif()
  message("ok: mlp with dist.pp=2 refused")
else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
