# FindNCCL
# --------
# Finds NCCL, the NVIDIA collective communications library, wherever distributions put it: under the
# CUDA toolkit (CUDA runfile / tarball installs: <cuda>/include, <cuda>/lib64) or in the system
# directories (Debian/Ubuntu libnccl-dev: /usr/include, /usr/lib/<multiarch>). NCCL_ROOT or the NCCL_ROOT
# environment variable take precedence.
#
# Result: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported target NCCL::NCCL.

set(_nccl_hints)
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${NCCL_HOME}" "$ENV{NCCL_HOME}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()
if(NOT DEFINED CUDAToolkit_LIBRARY_ROOT AND NOT DEFINED CUDAToolkit_BIN_DIR)
  find_package(CUDAToolkit QUIET)
endif()
foreach(_dir IN ITEMS "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")
  if(_dir)
    list(APPEND _nccl_hints "${_dir}")
  endif()
endforeach()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_hints "${_cuda_root}")
endif()
list(APPEND _nccl_hints /usr/local/cuda)

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu targets/x86_64-linux/lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR [0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR [0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH [0-9]+")
  string(REGEX REPLACE "[^0-9]" "" _nccl_major "${_nccl_major}")
  string(REGEX REPLACE "[^0-9]" "" _nccl_minor "${_nccl_minor}")
  string(REGEX REPLACE "[^0-9]" "" _nccl_patch "${_nccl_patch}")
  if(_nccl_major)
    set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
