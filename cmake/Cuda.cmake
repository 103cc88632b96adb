# CUDA is optional: detected with CheckLanguage; without nvcc everything else builds.
set(ZEROD_HAVE_CUDA OFF)
if(ZEROD_CUDA)
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # "90" = sm_90 SASS plus compute_90 PTX (Hopper, forward-compatible through the PTX).
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 for nvcc
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # Static cudart loads the driver at run time: binaries start on machines without one.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    find_package(CUDAToolkit REQUIRED)
    set(ZEROD_HAVE_CUDA ON)
  endif()
endif()
