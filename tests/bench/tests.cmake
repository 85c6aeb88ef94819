# bench/compare_pytorch_gpu.py and the GPU bench configs, checked without a GPU (issue 22): the
# configs through athanor's validation and planner, the script's YAML reader against PyYAML, its
# table on fixed results, and its CPU smoke path (both engines, tiny model, eager PyTorch).
# Debian's python3-torch and python3-yaml belong to /usr/bin/python3 (CMake's Python3 may be
# another one): that interpreter where it exists; the parts needing torch skip without it.
find_program(ATHANOR_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT ATHANOR_SYSTEM_PYTHON3)
  set(ATHANOR_SYSTEM_PYTHON3 ${Python3_EXECUTABLE})
endif()
if(TARGET athanor_cli)
  add_test(NAME bench.compare_pytorch_gpu
           COMMAND ${ATHANOR_SYSTEM_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_compare_pytorch_gpu.py $<TARGET_FILE:athanor_cli>)
  set_tests_properties(bench.compare_pytorch_gpu PROPERTIES LABELS bench TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
endif()
# The CPU f32 loss curve the GPU's bf16 curve is held to (tests/gpu/test_gpu_loss_curve.cpp) is
# still this build's: its first 3 steps re-run on the CPU (gpt2-124M, ~40 s here; label slow).
if(TARGET athanor_cli)
  add_test(NAME bench.loss_curve_fixture
           COMMAND ${ATHANOR_SYSTEM_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/loss_curve_fixture.py check $<TARGET_FILE:athanor_cli> 3)
  set_tests_properties(bench.loss_curve_fixture PROPERTIES LABELS slow TIMEOUT 600 RUN_SERIAL TRUE
                       ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
endif()
# The GPU check's diagnostics of torch.compile, checked without a GPU (issue 22): the kernel
# categories of its profile (bench/torch_profile.py), the GEMMs it times beside bench_cuda_gemm's
# (bench/torch_gemm_shapes.py; its CPU dry run where this Python has torch), and the host side of
# scripts/gpu_check.sh / gpu_bench.sh (the summary on fake step outputs, the pack's file list).
foreach(t torch_profile torch_gemm_shapes gpu_check_summary)
  add_test(NAME bench.${t} COMMAND ${ATHANOR_SYSTEM_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_${t}.py)
  set_tests_properties(bench.${t} PROPERTIES LABELS bench TIMEOUT 120)
endforeach()
