# Resharding: save with 4 ranks at ZeRO-2 (an uninterrupted 6-step run that checkpoints
# after step 3 and records its final weights), then resume from the checkpoint with
# 2 ranks at ZeRO-1, with 1 process (stage 0), with 4 ranks at ZeRO-2 and with 2 at
# ZeRO-3; each resumed run must end equal to
# the uninterrupted one (test_zero checks and exits non-zero otherwise).
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DEXE=… -DDIR=<scratch dir> -P zero_reshard.cmake
set(_flags ${MPIFLAGS})  # a CMake list
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
function(run_phase np arg)
  execute_process(COMMAND ${MPIEXEC} ${_flags} -np ${np} ${EXE} --reshard=${DIR},${arg}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
  message("---- np ${np} ${arg} (exit ${_rc}) ----\n${_out}${_err}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "phase '${arg}' on ${np} rank(s) failed")
  endif()
endfunction()
run_phase(4 save,2)
run_phase(2 resume,1)
run_phase(1 resume,0)
run_phase(4 resume,2)
run_phase(2 resume,3)
# Negative control: without the optimizer state (AdamW moments, step counts) the run must differ.
execute_process(COMMAND ${MPIEXEC} ${_flags} -np 2 ${EXE} --reshard=${DIR},resume_weights_only,1
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
message("---- np 2 resume_weights_only,1 (exit ${_rc}, expected non-zero) ----\n${_out}${_err}")
if(_rc EQUAL 0)
  message(FATAL_ERROR "resuming without the optimizer state matched the reference: the comparison cannot fail")
endif()
file(REMOVE_RECURSE ${DIR})
message("ok: resumed on 2 ranks (stages 1, 3), 1 process (stage 0) and 4 ranks (stage 2) equal the uninterrupted 4-rank stage-2 run")
