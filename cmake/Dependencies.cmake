# Third-party dependencies, found through the config packages Debian ships.
# tools/test.sh installs them (tools/deps.sh lists the Debian packages).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)

# OpenBLAS: Debian's config package sets variables, not a target; wrap them in one.
find_package(OpenBLAS REQUIRED)
if(NOT TARGET zerod::openblas)
  add_library(zerod::openblas INTERFACE IMPORTED)
  set_target_properties(zerod::openblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()

# Gloo: collectives between CPU ranks (comm/gloo/). Debian's config package names the target gloo.
find_package(Gloo REQUIRED)

# gRPC + protobuf: the control plane and the multi-node rendezvous (engine/runtime,
# engine/control, tools). Optional: without them the training core and single-node training
# build and run; multi-node flags are then refused.
option(ZEROD_GRPC "Build the gRPC control plane and multi-node rendezvous when gRPC is found" ON)
set(ZEROD_HAVE_GRPC OFF)
if(ZEROD_GRPC)
  find_package(Protobuf QUIET)
  find_package(gRPC CONFIG QUIET)
  find_program(ZEROD_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  if(Protobuf_FOUND AND gRPC_FOUND AND ZEROD_GRPC_CPP_PLUGIN)
    set(ZEROD_HAVE_GRPC ON)
  endif()
endif()

# prometheus-cpp: the /metrics endpoint (engine/metrics). Optional: without it --metrics-port is
# refused with a message.
find_package(prometheus-cpp CONFIG QUIET)
set(ZEROD_HAVE_PROMETHEUS OFF)
if(prometheus-cpp_FOUND)
  set(ZEROD_HAVE_PROMETHEUS ON)
endif()

# PCRE2 and libsentencepiece: the tokenizers (engine/tokenizer). Optional: without PCRE2,
# tokenizer.json files with regex pre-tokenizers and GPT-2's vocab.json + merges.txt are refused
# with a message; without libsentencepiece, SentencePiece .model files are.
option(ZEROD_PCRE2 "Build tokenizer.json regex pre-tokenizers when PCRE2 is found" ON)
option(ZEROD_SENTENCEPIECE "Build SentencePiece .model support when libsentencepiece is found" ON)
# utf8proc: tokenizer.json's Unicode normalizers (NFC, NFD, NFKC, NFKD); without it they are
# refused with a message.
option(ZEROD_UTF8PROC "Build tokenizer.json Unicode normalizers when utf8proc is found" ON)
find_package(PkgConfig QUIET)
set(ZEROD_HAVE_PCRE2 OFF)
set(ZEROD_HAVE_SENTENCEPIECE OFF)
if(PkgConfig_FOUND AND ZEROD_PCRE2)
  pkg_check_modules(ZEROD_PCRE2_PC QUIET IMPORTED_TARGET libpcre2-8)
  if(ZEROD_PCRE2_PC_FOUND)
    set(ZEROD_HAVE_PCRE2 ON)
  endif()
endif()
set(ZEROD_HAVE_UTF8PROC OFF)
if(PkgConfig_FOUND AND ZEROD_UTF8PROC)
  pkg_check_modules(ZEROD_UTF8PROC_PC QUIET IMPORTED_TARGET libutf8proc)
  if(ZEROD_UTF8PROC_PC_FOUND)
    set(ZEROD_HAVE_UTF8PROC ON)
  endif()
endif()
if(PkgConfig_FOUND AND ZEROD_SENTENCEPIECE)
  pkg_check_modules(ZEROD_SENTENCEPIECE_PC QUIET IMPORTED_TARGET sentencepiece)
  if(ZEROD_SENTENCEPIECE_PC_FOUND)
    set(ZEROD_HAVE_SENTENCEPIECE ON)
  endif()
endif()

# oneDNN (libdnnl-dev): the CPU backend's bf16 matrix products (kernels/cpu/bf16_gemm.h) on CPUs
# with bf16 dot-product instructions. Optional: without it bf16 mode computes its products in
# fp32, and says so.
option(ZEROD_ONEDNN "Build the CPU bf16 matrix products on oneDNN when it is found" ON)
set(ZEROD_HAVE_ONEDNN OFF)
if(ZEROD_ONEDNN)
  # Debian's dnnl-config.cmake requires OpenCL (its GPU runtime) and fails the configure when
  # it is missing, QUIET or not: look for OpenCL first and go without oneDNN when it is absent.
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    find_package(dnnl CONFIG QUIET)
  endif()
  if(dnnl_FOUND)
    set(ZEROD_HAVE_ONEDNN ON)
  else()
    message(STATUS "oneDNN not used (libdnnl-dev, or the OpenCL it requires, not found): "
                   "CPU bf16 matrix products run in fp32")
  endif()
endif()

# zlib and zstd: zerod-shards reads .gz and .zst inputs. Optional: without them such inputs
# are refused with a message naming the library.
set(ZEROD_HAVE_ZLIB OFF)
set(ZEROD_HAVE_ZSTD OFF)
find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  set(ZEROD_HAVE_ZLIB ON)
endif()
if(PkgConfig_FOUND)
  pkg_check_modules(ZEROD_ZSTD_PC QUIET IMPORTED_TARGET libzstd)
  if(ZEROD_ZSTD_PC_FOUND)
    set(ZEROD_HAVE_ZSTD ON)
  endif()
endif()

# OpenSSL's libcrypto: SHA-256 of shards and tokenizers in zerod-shards' manifest. Optional:
# without it the manifest records CRC32C instead.
set(ZEROD_HAVE_OPENSSL OFF)
find_package(OpenSSL QUIET COMPONENTS Crypto)
if(OpenSSL_FOUND OR OPENSSL_FOUND)
  set(ZEROD_HAVE_OPENSSL ON)
endif()

if(ZEROD_TESTS)
  find_package(GTest REQUIRED)
endif()
