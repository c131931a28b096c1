# Turns RINGX_CUDA (top-level CMakeLists.txt) into the decision whether ringx
# builds its CUDA side (the kernels, and an extension linked against torch's
# CUDA libraries). It leaves RINGX_WITH_CUDA ON or OFF for every subdirectory,
# with the CUDA language enabled and CUDA::cudart defined when ON.

# SASS for A100 (sm_80), H100 (sm_90) and B200 (sm_100), plus compute_100 PTX
# that the driver compiles for GPUs newer than all three. Set before
# check_language, which otherwise probes nvcc for a default of its own.
# A packager narrows or widens it with -DCMAKE_CUDA_ARCHITECTURES.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;100-real;100-virtual")
endif()

# A Catch2 build of the core (no extension, no torch to ask) is CPU only
# unless RINGX_CUDA=on asks for the kernels.
set(RINGX_WITH_CUDA OFF)
if(RINGX_CUDA STREQUAL "off")
  set(_why "RINGX_CUDA=off")
elseif(RINGX_CUDA STREQUAL "auto" AND NOT RINGX_BUILD_PYTHON)
  set(_why "RINGX_CUDA=auto and no extension is built (RINGX_BUILD_PYTHON=OFF)")
elseif(RINGX_CUDA STREQUAL "auto" AND NOT RINGX_TORCH_CUDA)
  set(_why "RINGX_CUDA=auto and torch ${RINGX_TORCH_VERSION} is a CPU build")
else()
  include(CheckLanguage)
  check_language(CUDA)
  if(RINGX_CUDA STREQUAL "on" AND NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "RINGX_CUDA=on but no CUDA compiler was found: install the CUDA toolkit and put nvcc "
      "on PATH, or name it with -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  endif()
  if(RINGX_CUDA STREQUAL "on" AND RINGX_BUILD_PYTHON AND NOT RINGX_TORCH_CUDA)
    message(FATAL_ERROR "RINGX_CUDA=on but torch ${RINGX_TORCH_VERSION} in ${TORCH_DIR} is a CPU build: "
      "install a CUDA build of torch, or build with RINGX_CUDA=off")
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(RINGX_WITH_CUDA ON)
    if(RINGX_CUDA STREQUAL "on")
      set(_why "RINGX_CUDA=on")
    else()
      set(_why "RINGX_CUDA=auto, torch ${RINGX_TORCH_VERSION} is a CUDA ${RINGX_TORCH_CUDA} build and nvcc was found")
    endif()
  else()
    set(_why "RINGX_CUDA=auto and no CUDA compiler (nvcc) was found")
  endif()
endif()

if(RINGX_WITH_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "ringx: CUDA on (${_why}): nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
    "architectures ${CMAKE_CUDA_ARCHITECTURES}")
else()
  message(STATUS "ringx: CUDA off (${_why})")
endif()
unset(_why)
