# Configures, builds and runs an out-of-tree consumer of fax.
#   VARIANT=build_tree: the consumer project against the build tree's package;
#   VARIANT=install:    the same against a fresh `cmake --install` prefix;
#   VARIANT=plugin:     plugins/example, example_model and example_dataset built on their own
#                       against that prefix, then run by the installed fax-run through --plugin-dir.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
if(VARIANT STREQUAL "build_tree")
  set(locate "-Dfax_DIR=${FAX_BUILD_DIR}")
else()
  step("${CMAKE_COMMAND}" --install "${FAX_BUILD_DIR}" --prefix "${prefix}")
  set(locate "-DCMAKE_PREFIX_PATH=${prefix}")
endif()

if(VARIANT STREQUAL "plugin")
  set(source "${PLUGIN_DIR}")
else()
  set(source "${PROJECT_DIR}")
endif()
step("${CMAKE_COMMAND}" -S "${source}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release "${locate}")
step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
if(VARIANT STREQUAL "plugin")
  # The model and data set plugins in folders of their own, all found through --plugin-dir.
  foreach(kind model dataset)
    step("${CMAKE_COMMAND}" -S "${PLUGIN_DIR}_${kind}" -B "${WORK_DIR}/build-${kind}" -G "${GENERATOR}"
         "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=Release "${locate}")
    step("${CMAKE_COMMAND}" --build "${WORK_DIR}/build-${kind}")
  endforeach()
endif()

if(VARIANT STREQUAL "plugin")
  # 8 clients of 10 rows, 4 features, 3 classes for the CSV template.
  set(rows "")
  foreach(i RANGE 79)
    math(EXPR client "${i} % 8")
    math(EXPR label "${i} % 3")
    string(APPEND rows "c${client},${label},${label}.5,1,0.${i},-${label}\n")
  endforeach()
  file(WRITE "${WORK_DIR}/rows.csv" "${rows}")
  file(WRITE "${WORK_DIR}/example.yaml"
       "rounds: 3\ncohort:\n  size: 4\ndata:\n  name: example_dataset\n  path: ${WORK_DIR}/rows.csv\n"
       "model:\n  name: example_model\n  hidden: 8\nalgorithm:\n  name: example\n  client_lr: 0.05\n")
  # FAX_PLUGIN_PATH is cleared so only --plugin-dir and the prefix are searched; the out-of-tree
  # folders come first, so their plugins win over the installed ones of the same names.
  step("${CMAKE_COMMAND}" -E env FAX_PLUGIN_PATH= "${prefix}/bin/fax-run" run "${WORK_DIR}/example.yaml"
       --plugin-dir "${WORK_DIR}/build" --plugin-dir "${WORK_DIR}/build-model" --plugin-dir "${WORK_DIR}/build-dataset"
       -o "${WORK_DIR}/example.h5")
  if(NOT step_output MATCHES "algorithm: example \\(${WORK_DIR}/build/fax_example.so\\)")
    message(FATAL_ERROR "the installed fax-run did not run the out-of-tree plugin:\n${step_output}")
  endif()
  if(NOT step_output MATCHES "model: example_model\\(4 -> 8 -> 3\\) \\(${WORK_DIR}/build-model/fax_example_model.so\\)")
    message(FATAL_ERROR "the installed fax-run did not run the out-of-tree model plugin:\n${step_output}")
  endif()
  if(NOT step_output MATCHES "data: example_dataset\\([^)]*\\): 8 clients, 4 features, 3 classes \\(${WORK_DIR}/build-dataset/fax_example_dataset.so\\)")
    message(FATAL_ERROR "the installed fax-run did not run the out-of-tree data set plugin:\n${step_output}")
  endif()
  if(NOT step_output MATCHES "round 3/3")
    message(FATAL_ERROR "the run did not finish:\n${step_output}")
  endif()
  step("${prefix}/bin/fax-run" plugins)
  if(NOT step_output MATCHES "fedavg .*${prefix}/lib/fax/plugins/fax_fedavg.so")
    message(FATAL_ERROR "the installed fax-run does not find the installed plugins:\n${step_output}")
  endif()
else()
  step("${WORK_DIR}/build/consumer")
endif()
