# fax_add_test_executable(<name> LABEL <label> SOURCES <files...> [LIBRARIES <targets...>])
# One GoogleTest executable per test folder, registered as one ctest test: loading LibTorch costs
# about a second per process, so one process per test case would dominate the suite's run time.
# gtest prints the failing cases; run the executable with --gtest_filter to narrow down.
function(fax_add_test_executable name)
  cmake_parse_arguments(arg "" "LABEL" "SOURCES;LIBRARIES" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE fax::core GTest::gmock GTest::gtest GTest::gtest_main ${arg_LIBRARIES})
  target_compile_options(${name} PRIVATE -Wall -Wextra)
  target_precompile_headers(${name} PRIVATE <ATen/ATen.h> <gtest/gtest.h> <torch/csrc/autograd/autograd.h> <fax/fax.h>)
  add_test(NAME ${arg_LABEL} COMMAND ${name} --gtest_brief=1)
  set_tests_properties(${arg_LABEL} PROPERTIES LABELS ${arg_LABEL})
endfunction()
