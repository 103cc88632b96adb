#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"

#ifndef ZEROD_CUBLASLT_DIR
#define ZEROD_CUBLASLT_DIR ""
#endif

namespace zerod::cuda {

namespace {

std::string g_path;

template <class F>
void resolve(void* handle, const char* name, F& f, const std::string& path) {
  dlerror();
  void* p = dlsym(handle, name);
  if (p == nullptr) {
    const char* why = dlerror();
    ZD_THROW("{} has no {}: {}", path, name, why != nullptr ? why : "not found");
  }
  f = reinterpret_cast<F>(p);
}

CublasLtLibrary load() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string path = soname, reasons;
  if (handle == nullptr) {
    const char* why = dlerror();
    reasons = fmt::format("{}: {}", soname, why != nullptr ? why : "not found");
    const std::string dir = ZEROD_CUBLASLT_DIR;
    if (!dir.empty()) {
      path = dir + "/" + soname;
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        why = dlerror();
        reasons += fmt::format("; {}: {}", path, why != nullptr ? why : "not found");
      }
    }
  }
  if (handle == nullptr) {
    ZD_THROW(
        "cannot load cuBLASLt for the GPU's matrix products ({}); put the CUDA toolkit's "
        "library folder on LD_LIBRARY_PATH",
        reasons);
  }
  CublasLtLibrary l{};
  resolve(handle, "cublasLtCreate", l.Create, path);
  resolve(handle, "cublasLtDestroy", l.Destroy, path);
  resolve(handle, "cublasLtGetStatusName", l.GetStatusName, path);
  resolve(handle, "cublasLtGetStatusString", l.GetStatusString, path);
  resolve(handle, "cublasLtMatmul", l.Matmul, path);
  resolve(handle, "cublasLtMatmulAlgoGetHeuristic", l.MatmulAlgoGetHeuristic, path);
  resolve(handle, "cublasLtMatmulDescCreate", l.MatmulDescCreate, path);
  resolve(handle, "cublasLtMatmulDescDestroy", l.MatmulDescDestroy, path);
  resolve(handle, "cublasLtMatmulDescSetAttribute", l.MatmulDescSetAttribute, path);
  resolve(handle, "cublasLtMatmulPreferenceCreate", l.MatmulPreferenceCreate, path);
  resolve(handle, "cublasLtMatmulPreferenceDestroy", l.MatmulPreferenceDestroy, path);
  resolve(handle, "cublasLtMatmulPreferenceSetAttribute", l.MatmulPreferenceSetAttribute, path);
  resolve(handle, "cublasLtMatrixLayoutCreate", l.MatrixLayoutCreate, path);
  resolve(handle, "cublasLtMatrixLayoutDestroy", l.MatrixLayoutDestroy, path);
  resolve(handle, "cublasLtGetVersion", l.GetVersion, path);
  // (The handle stays open for the process: the functions are used until exit.)
  Dl_info info{};
  g_path = dladdr(reinterpret_cast<void*>(l.Create), &info) != 0 && info.dli_fname != nullptr
               ? info.dli_fname
               : path;
  return l;
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static std::once_flag once;
  static CublasLtLibrary library{};
  std::call_once(once, [] { library = load(); });
  return library;
}

const char* cublaslt_path() {
  return g_path.c_str();
}

}  // namespace zerod::cuda
