# Runs an injected-failure scenario of test_dist under mpirun and checks that
# every rank exited (mpirun non-zero), within MAX_SECONDS, with output matching EXPECT.
#   cmake -DMPIEXEC=… -DMPIFLAGS=… -DNP=… -DEXE=… -DSCENARIO=… -DEXPECT=<regex> -DMAX_SECONDS=… [-DSKIP_MARK=…] -P expect_abort.cmake
set(_flags ${MPIFLAGS})  # a CMake list
string(TIMESTAMP _t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${_flags} -np ${NP} ${EXE} --scenario=${SCENARIO}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
string(TIMESTAMP _t1 "%s")
math(EXPR _dt "${_t1} - ${_t0}")
message("---- output (exit ${_rc}, ${_dt}s) ----\n${_out}${_err}----")
# SKIP_MARK: a line the program prints when it cannot run the scenario here (no GPU): the
# test's SKIP_REGULAR_EXPRESSION matches the output above, and ctest reports it skipped.
if(DEFINED SKIP_MARK AND "${_out}${_err}" MATCHES "${SKIP_MARK}")
  message("skipped: the program printed '${SKIP_MARK}'")
  return()
endif()
if(_rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit from mpirun, got 0")
endif()
if(NOT "${_out}${_err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match: ${EXPECT}")
endif()
if(_dt GREATER ${MAX_SECONDS})
  message(FATAL_ERROR "took ${_dt}s, more than ${MAX_SECONDS}s")
endif()
message("ok: exit ${_rc} after ${_dt}s")
