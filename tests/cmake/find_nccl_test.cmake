# Runs cmake/FindNCCL.cmake against two fake installs and checks what it finds:
#   1. NCCL inside a CUDA toolkit tree (<cuda>/include, <cuda>/lib64), as NVIDIA's installers lay it out;
#   2. NCCL in the system directories (/usr/include, /usr/lib/<multiarch>), as Debian/Ubuntu packages do,
#      emulated under CMAKE_FIND_ROOT_PATH so the real machine's NCCL cannot answer instead.
# Usage: cmake -DEAGLE3_SOURCE_DIR=... -DWORK_DIR=... -P find_nccl_test.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
set(header "#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 3\n")
file(WRITE "${WORK_DIR}/cuda/include/nccl.h" "${header}")
file(WRITE "${WORK_DIR}/cuda/lib64/libnccl.so" "")
file(MAKE_DIRECTORY "${WORK_DIR}/cuda/bin")
file(WRITE "${WORK_DIR}/sysroot/usr/include/nccl.h" "${header}")
file(WRITE "${WORK_DIR}/sysroot/usr/lib/x86_64-linux-gnu/libnccl.so" "")
file(WRITE "${WORK_DIR}/project/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.25)
project(find_nccl_probe LANGUAGES CXX)
list(APPEND CMAKE_MODULE_PATH \"${EAGLE3_SOURCE_DIR}/cmake\")
find_package(NCCL REQUIRED)
if(NOT TARGET NCCL::NCCL)
  message(FATAL_ERROR \"no NCCL::NCCL target\")
endif()
message(STATUS \"PROBE library=\${NCCL_LIBRARY} include=\${NCCL_INCLUDE_DIR} version=\${NCCL_VERSION}\")
")

function(probe name expected_lib expected_inc)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${WORK_DIR}/project" -B "${WORK_DIR}/build-${name}" ${ARGN}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: configure failed:\n${out}\n${err}")
  endif()
  string(REGEX MATCH "PROBE library=([^ ]*) include=([^ ]*) version=([^\n]*)" _ "${out}")
  if(NOT CMAKE_MATCH_1 STREQUAL expected_lib OR NOT CMAKE_MATCH_2 STREQUAL expected_inc
     OR NOT CMAKE_MATCH_3 STREQUAL "2.28.3")
    message(FATAL_ERROR "${name}: expected library=${expected_lib} include=${expected_inc} "
                        "version=2.28.3, got library=${CMAKE_MATCH_1} include=${CMAKE_MATCH_2} "
                        "version=${CMAKE_MATCH_3}")
  endif()
  message(STATUS "${name}: found ${CMAKE_MATCH_1}")
endfunction()

probe(toolkit "${WORK_DIR}/cuda/lib64/libnccl.so" "${WORK_DIR}/cuda/include"
  "-DCUDAToolkit_BIN_DIR=${WORK_DIR}/cuda/bin" "-DCUDAToolkit_LIBRARY_ROOT=${WORK_DIR}/cuda")
probe(system "${WORK_DIR}/sysroot/usr/lib/x86_64-linux-gnu/libnccl.so" "${WORK_DIR}/sysroot/usr/include"
  "-DCUDAToolkit_BIN_DIR=/nonexistent/bin" "-DCMAKE_FIND_ROOT_PATH=${WORK_DIR}/sysroot"
  -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY)
