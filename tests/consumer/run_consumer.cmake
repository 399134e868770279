# Configures, builds and runs the consumer project. VARIANT=install first installs fax into a
# fresh prefix under WORK_DIR and points the consumer at that prefix only.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
if(VARIANT STREQUAL "install")
  set(prefix "${WORK_DIR}/prefix")
  step("${CMAKE_COMMAND}" --install "${FAX_BUILD_DIR}" --prefix "${prefix}")
  set(locate "-DCMAKE_PREFIX_PATH=${prefix}")
else()
  set(locate "-Dfax_DIR=${FAX_BUILD_DIR}")
endif()

step("${CMAKE_COMMAND}" -S "${PROJECT_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release "${locate}")
step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
