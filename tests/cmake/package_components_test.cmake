# The installed package config (cmake/eagle3-config.cmake.in) and its cuda component, against a fake
# install prefix that has eagle3::cuda (as an install made with CUDA does) and fake CUDAToolkit / NCCL
# find modules, so that this runs, and "no CUDA here" is certain, on any machine:
#   1. find_package(eagle3 REQUIRED) with no CUDA toolkit: found, no eagle3::cuda;
#   2. OPTIONAL_COMPONENTS cuda with no CUDA toolkit: found, eagle3_cuda_FOUND false;
#   3. COMPONENTS cuda with no CUDA toolkit: not found, saying so;
#   4. COMPONENTS cuda with the (fake) toolkit and NCCL: found, eagle3::cuda defined;
#   5. COMPONENTS cuda with the toolkit but no NCCL (the install needs it): not found, saying so;
#   6. COMPONENTS cuda from an install without the CUDA backend: not found, saying so;
#   7. an unknown component: not found.
# Usage: cmake -DEAGLE3_SOURCE_DIR=... -DWORK_DIR=... [-DCMAKE_GENERATOR=...] -P package_components_test.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
include(CMakePackageConfigHelpers)

# Two fake installs: with-cuda (eagle3-cuda-targets.cmake present, needs NCCL) and cpu-only.
foreach(kind IN ITEMS with-cuda cpu-only)
  set(prefix "${WORK_DIR}/${kind}")
  set(dir "${prefix}/lib/cmake/eagle3")
  set(CMAKE_INSTALL_PREFIX "${prefix}")
  if(kind STREQUAL "with-cuda")
    set(EAGLE3_CUDA_NEEDS_NCCL ON)
    file(WRITE "${dir}/eagle3-cuda-targets.cmake" "
if(NOT TARGET CUDA::cudart OR NOT TARGET NCCL::NCCL)
  message(FATAL_ERROR \"eagle3-cuda-targets.cmake loaded before CUDA::cudart and NCCL::NCCL were found\")
endif()
if(NOT TARGET eagle3::cuda)
  add_library(eagle3::cuda INTERFACE IMPORTED)
  set_target_properties(eagle3::cuda PROPERTIES INTERFACE_LINK_LIBRARIES \"eagle3::eagle3;CUDA::cudart;NCCL::NCCL\")
endif()
")
  else()
    set(EAGLE3_CUDA_NEEDS_NCCL OFF)
  endif()
  configure_package_config_file("${EAGLE3_SOURCE_DIR}/cmake/eagle3-config.cmake.in" "${dir}/eagle3-config.cmake"
                                INSTALL_DESTINATION lib/cmake/eagle3)
  file(WRITE "${dir}/eagle3-targets.cmake" "
if(NOT TARGET eagle3::eagle3)
  add_library(eagle3::eagle3 INTERFACE IMPORTED)
endif()
")
endforeach()

# Fake find modules: found unless disabled (CMAKE_DISABLE_FIND_PACKAGE_<name>, as on a machine
# without them).
file(WRITE "${WORK_DIR}/modules/FindCUDAToolkit.cmake" "
set(CUDAToolkit_FOUND TRUE)
if(NOT TARGET CUDA::cudart)
  add_library(CUDA::cudart INTERFACE IMPORTED)
endif()
")
file(WRITE "${WORK_DIR}/modules/FindNCCL.cmake" "
set(NCCL_FOUND TRUE)
if(NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL INTERFACE IMPORTED)
endif()
")
# A real install has the package's FindNCCL.cmake next to its config: here, the fake one.
file(COPY "${WORK_DIR}/modules/FindNCCL.cmake" DESTINATION "${WORK_DIR}/with-cuda/lib/cmake/eagle3")

file(WRITE "${WORK_DIR}/project/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.25)
project(eagle3_components_probe LANGUAGES CXX)
list(APPEND CMAKE_MODULE_PATH \"${WORK_DIR}/modules\")
find_package(eagle3 REQUIRED \${PROBE_ARGS})
if(NOT TARGET eagle3::eagle3)
  message(FATAL_ERROR \"no eagle3::eagle3\")
endif()
if(TARGET eagle3::cuda)
  message(STATUS \"PROBE cuda=yes found=\${eagle3_cuda_FOUND}\")
else()
  message(STATUS \"PROBE cuda=no found=\${eagle3_cuda_FOUND}\")
endif()
")

set(generator)
if(CMAKE_GENERATOR)
  set(generator -G "${CMAKE_GENERATOR}")
endif()
# probe(<name> <install> <expect: "cuda=yes" / "cuda=no" / "fail:<message part>"> <PROBE_ARGS> [cmake args...])
function(probe name install expect probe_args)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${WORK_DIR}/project" -B "${WORK_DIR}/build-${name}" ${generator}
            "-DCMAKE_PREFIX_PATH=${WORK_DIR}/${install}" "-DPROBE_ARGS=${probe_args}" ${ARGN}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(expect MATCHES "^fail:(.*)$")
    set(part "${CMAKE_MATCH_1}")
    string(FIND "${out}${err}" "${part}" at)
    if(rc EQUAL 0 OR at EQUAL -1)
      message(FATAL_ERROR "${name}: expected a failure saying '${part}', got rc ${rc}:\n${out}\n${err}")
    endif()
  else()
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${name}: configure failed:\n${out}\n${err}")
    endif()
    string(FIND "${out}" "PROBE ${expect}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${name}: expected 'PROBE ${expect}':\n${out}")
    endif()
  endif()
  message(STATUS "${name}: ok (${expect})")
endfunction()

set(no_cuda -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
set(no_nccl -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON)
probe(cpu-consumer with-cuda "cuda=no found=FALSE" "" ${no_cuda} ${no_nccl})
probe(optional-no-cuda with-cuda "cuda=no found=FALSE" "OPTIONAL_COMPONENTS;cuda" ${no_cuda})
probe(required-no-cuda with-cuda "fail:the CUDA toolkit (CUDAToolkit) was not found" "COMPONENTS;cuda" ${no_cuda})
probe(required-cuda with-cuda "cuda=yes found=TRUE" "COMPONENTS;cuda")
probe(required-no-nccl with-cuda "fail:NCCL was not found" "COMPONENTS;cuda" ${no_nccl})
probe(required-cpu-only cpu-only "fail:built without its CUDA backend" "COMPONENTS;cuda")
probe(unknown-component with-cuda "fail:unknown component 'gpu'" "COMPONENTS;gpu")
