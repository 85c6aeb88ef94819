# Observe-layer tests that run programs other than gtest (included by tests/CMakeLists.txt).
# The Python protobuf decoder of TensorBoard files runs inside the gtest
# TensorBoard.PythonProtobufDecoderAgreesAndRejectsCorruption (it writes the file first).

# report.html rendered by headless Chromium: no console errors, a non-blank screenshot
# (kept at <build>/tests/observe/report_screenshot/report.png).
add_test(NAME observe.report_screenshot
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/observe/report_screenshot.sh $<TARGET_FILE:athanor_cli>
                 ${CMAKE_CURRENT_BINARY_DIR}/observe/report_screenshot)
set_tests_properties(observe.report_screenshot PROPERTIES LABELS observe TIMEOUT 180)

# The same script must reject a blank page: a stand-in CLI writes an empty report.html.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/observe/blank_report_cli.sh
     "#!/bin/sh\n# stand-in for `athanor report DIR` that writes an empty page\nprintf '<!DOCTYPE html><html><body></body></html>' > \"$2/report.html\"\necho \"$2/report.html\"\n")
file(CHMOD ${CMAKE_CURRENT_BINARY_DIR}/observe/blank_report_cli.sh PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
add_test(NAME observe.report_screenshot_rejects_blank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/observe/report_screenshot.sh
                 ${CMAKE_CURRENT_BINARY_DIR}/observe/blank_report_cli.sh ${CMAKE_CURRENT_BINARY_DIR}/observe/report_screenshot_blank)
set_tests_properties(observe.report_screenshot_rejects_blank PROPERTIES LABELS observe TIMEOUT 180
                     PASS_REGULAR_EXPRESSION "FAIL: the screenshot looks blank")

# The doctor's catalogue (tests/observe/doctor_catalogue): broken runs it must diagnose with
# the right kind and a fix that fits their config, healthy runs it must leave alone; each
# run is `athanor train` + `athanor doctor --json`, as a user would, and the test prints the
# confusion table. The whole catalogue trains GPTs for ~10 minutes on two cores (label long:
# scripts/test.sh --long runs it); a subset of Fashion-MNIST runs (seconds each) is in the
# fast suite. Exit 77: no Fashion-MNIST.
find_program(ATHANOR_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT ATHANOR_PYTHON3)
  find_program(ATHANOR_PYTHON3 NAMES python3)
endif()
if(ATHANOR_PYTHON3)
  set(_mpiexec mpirun)
  if(MPIEXEC_EXECUTABLE)
    set(_mpiexec ${MPIEXEC_EXECUTABLE})
  endif()
  add_test(NAME observe.doctor_catalogue_fast
           COMMAND ${ATHANOR_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/observe/doctor_catalogue/run_catalogue.py
                   $<TARGET_FILE:athanor_cli> ${CMAKE_CURRENT_BINARY_DIR}/observe/doctor_catalogue_fast --fast --mpirun ${_mpiexec})
  set_tests_properties(observe.doctor_catalogue_fast PROPERTIES LABELS observe TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
  add_test(NAME observe.doctor_catalogue
           COMMAND ${ATHANOR_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/observe/doctor_catalogue/run_catalogue.py
                   $<TARGET_FILE:athanor_cli> ${CMAKE_CURRENT_BINARY_DIR}/observe/doctor_catalogue --mpirun ${_mpiexec})
  set_tests_properties(observe.doctor_catalogue PROPERTIES LABELS long RUN_SERIAL TRUE TIMEOUT 3600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
endif()
