# Compiler flags shared by every target of the project.
add_library(zerod_flags INTERFACE)
target_compile_options(zerod_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -fno-math-errno>)
if(ZEROD_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native ZEROD_HAS_MARCH_NATIVE)
  if(ZEROD_HAS_MARCH_NATIVE)
    target_compile_options(zerod_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endif()
target_compile_options(zerod_flags INTERFACE
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-O3>)
target_link_libraries(zerod_flags INTERFACE OpenMP::OpenMP_CXX Threads::Threads)
if(ZEROD_HAVE_CUDA)
  target_compile_definitions(zerod_flags INTERFACE ZEROD_HAVE_CUDA=1)
endif()
if(ZEROD_HAVE_GRPC)
  target_compile_definitions(zerod_flags INTERFACE ZEROD_HAVE_GRPC=1)
endif()

# zerod_library(NAME GLOBS... [DEPS ...]): a static library of the files matched by the globs
# (an interface library while a folder is still empty), linked PUBLIC to DEPS.
function(zerod_library name)
  cmake_parse_arguments(ARG "" "" "GLOBS;DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${ARG_GLOBS})
  if(sources)
    add_library(${name} STATIC ${sources})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()
