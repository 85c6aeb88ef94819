# What the `athanor train` scenario scripts under mpirun share (trainer_dist, tp_trainer,
# pp_trainer): a scratch directory with a private copy of the corpus, runs of the CLI on one
# or several processes, the checks of test_trainer_dist, a resume from a step-5 checkpoint,
# and bad configs that must fail before any work. The including script sets MPIEXEC,
# MPIFLAGS, CLI, CHECK, CORPUS, DIR and, where its runs take longer, RUN_TIMEOUT.
if(NOT DEFINED RUN_TIMEOUT)
  set(RUN_TIMEOUT 120)
endif()
set(_flags ${MPIFLAGS})

# trainer_runs_scratch(<tiny.yaml text>): an empty ${DIR} with corpus.txt (a private copy: the
# shards are cached per test) and tiny.yaml.
function(trainer_runs_scratch yaml)
  file(REMOVE_RECURSE ${DIR})
  file(MAKE_DIRECTORY ${DIR})
  configure_file(${CORPUS} ${DIR}/corpus.txt COPYONLY)
  file(WRITE ${DIR}/tiny.yaml "${yaml}")
endfunction()

# run_config(<config.yaml> <name> <np or 1proc> <overrides…>): out_dir ${DIR}/runs, name <name>;
# its stdout is kept in ${DIR}/runs/<name>.out.
function(run_config config name np)
  set(_cmd ${CLI} train ${DIR}/${config} out_dir=${DIR}/runs name=${name} ${ARGN})
  if(np STREQUAL "1proc")
    set(_cmd ${_cmd} dist.backend=none)
  else()
    set(_cmd ${MPIEXEC} ${_flags} -np ${np} ${_cmd})
  endif()
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT ${RUN_TIMEOUT})
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "run ${name} (${np}) failed (${_rc}):\n${_out}${_err}")
  endif()
  string(REGEX MATCH "training [^\n]*" _line "${_out}")
  message("${name}: ${_line}")
  file(WRITE ${DIR}/runs/${name}.out "${_out}")
endfunction()
# run(<name> <np or 1proc> <overrides…>): the tiny config.
function(run name np)
  run_config(tiny.yaml ${name} ${np} ${ARGN})
endfunction()

# check(<test_trainer_dist arguments…>): fails the test if the check fails.
function(check)
  execute_process(COMMAND ${CHECK} ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  message("${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "check failed: ${ARGN}")
  endif()
endfunction()
# equal(<run> <reference run>): the loss at every step within 1e-5 relative; grad norms, the
# final validation loss and every weight within rtol 1e-4, atol 2e-5.
function(equal a b)
  check(compare_loss ${DIR}/runs/${a} ${DIR}/runs/${b} 1e-5)
  check(compare ${DIR}/runs/${a} ${DIR}/runs/${b} 1e-4 2e-5)
endfunction()

# resume_from_step5(<name> <np> <overrides…>): a copy of run `full` (checkpoints after steps 5
# and 10, overrides ${_u}) resumed from its step-5 checkpoint must equal it.
function(resume_from_step5 name np)
  file(COPY ${DIR}/runs/full/ DESTINATION ${DIR}/runs/${name})
  file(REMOVE_RECURSE ${DIR}/runs/${name}/checkpoints/step-000010 ${DIR}/runs/${name}/model.safetensors)
  file(WRITE ${DIR}/runs/${name}/checkpoints/latest "step-000005\n")
  run(${name} ${np} resume=auto ${_u} ${ARGN})
  file(READ ${DIR}/runs/${name}.out _o)
  if(NOT _o MATCHES "resumed from [^\n]*step-000005 at step 5")
    message(FATAL_ERROR "${name} did not resume from step 5:\n${_o}")
  endif()
  equal(${name} full)
endfunction()

# expect_error(<regex> <np or 1proc> <overrides…>): the run fails with a message matching the
# regex, before any work (no data is prepared).
function(expect_error what np)
  file(REMOVE_RECURSE ${DIR}/data)
  set(_cmd ${CLI} train ${DIR}/tiny.yaml out_dir=${DIR}/runs name=bad ${ARGN})
  if(NOT np STREQUAL "1proc")
    set(_cmd ${MPIEXEC} ${_flags} -np ${np} ${_cmd})
  endif()
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
  if(_rc EQUAL 0 OR NOT "${_out}${_err}" MATCHES "${what}")
    message(FATAL_ERROR "expected an error matching '${what}' for ${ARGN}, got exit ${_rc}:\n${_out}${_err}")
  endif()
  if(EXISTS ${DIR}/data/corpus-byte/train.bin)
    message(FATAL_ERROR "${ARGN}: the data was prepared before the error")
  endif()
  message("ok: ${ARGN} -> ${what}")
endfunction()
