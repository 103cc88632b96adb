// Row-major X (rows, cols) is column-major (cols, rows) with the same leading dimension, so each
// product is handed to cuBLASLt (column-major) on those views:
//   forward: out as (OC,N)  = op_T(weight as (C,OC)) x inp as (C,N)   [+ bias per row of D]
//            (before a GELU: the GELU_AUX_BIAS epilogue, pre-GELU values to aux = pre as (OC,N))
//   dinp:    dinp as (C,N)  = weight as (C,OC) x dout as (OC,N)       [beta 0, or 1 to accumulate]
//            (after a GELU: the DGELU epilogue, times gelu'(aux = pre as (C,N)))
//   dweight: dW as (C,OC)  += inp as (C,N) x op_T(dout as (OC,N))     [beta 1]
// Descriptors are built per call (cheap); the heuristic's choice is cached per shape, operation,
// pointer alignment and epilogue (Matmul::algos_); with ZEROD_CUBLASLT_TUNE=K the fastest of its
// first K choices, timed on the first call (measured on an H100: 0.4-0.8 ms of a 64-65 ms GPT-2
// 124M step, docs/gpu.md). For bf16/fp16, split-K partial sums may only be
// reduced in fp32 (never in the 16-bit output type): the accumulation stays fp32 end to end.
#include "kernels/cuda/matmul.h"

#include <cstdio>
#include <cstdlib>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/cublaslt_library.h"

namespace zerod::cuda {

namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    ZD_THROW("{}: cuBLASLt error {}: {}", what, cublaslt().GetStatusName(status),
             cublaslt().GetStatusString(status));
  }
}

cudaDataType_t data_type(Storage dt) {
  switch (dt) {
    case Storage::kF32:
      return CUDA_R_32F;
    case Storage::kBF16:
      return CUDA_R_16BF;
    case Storage::kF16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// The largest power of two (at most 256) dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a >>= 1;
  return a;
}

// Owners of the cuBLASLt descriptors of one call.
struct OpDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~OpDesc() {
    if (d) cublaslt().MatmulDescDestroy(d);
  }
};
struct LayoutDesc {
  cublasLtMatrixLayout_t d = nullptr;
  ~LayoutDesc() {
    if (d) cublaslt().MatrixLayoutDestroy(d);
  }
};
struct PrefDesc {
  cublasLtMatmulPreference_t d = nullptr;
  ~PrefDesc() {
    if (d) cublaslt().MatmulPreferenceDestroy(d);
  }
};

template <class V>
void set_op(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value,
            const char* what) {
  check_lt(cublaslt().MatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <class V>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const V& value) {
  check_lt(cublaslt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
           "cublasLtMatmulPreferenceSetAttribute");
}

}  // namespace

int parse_cublaslt_tune(const char* value) {
  return static_cast<int>(env_count("ZEROD_CUBLASLT_TUNE", value, 1, 32, 1,
                                    "how many of cuBLASLt's algorithms to time per matmul shape "
                                    "(1: the heuristic's first choice, untimed)"));
}

Matmul::Matmul(Storage dt, cudaStream_t stream, size_t workspace_bytes)
    : tune_(parse_cublaslt_tune(std::getenv("ZEROD_CUBLASLT_TUNE"))),
      dt_(dt),
      stream_(stream),
      workspace_bytes_(workspace_bytes) {
  check_lt(cublaslt().Create(&handle_), "cublasLtCreate");
  if (workspace_bytes_ > 0) {
    const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
    if (status != cudaSuccess) {
      cublaslt().Destroy(handle_);
      check(status, "cudaMalloc of the cuBLASLt workspace");
    }
  }
}

Matmul::~Matmul() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublaslt().Destroy(handle_);
}

template <class Run>
int Matmul::fastest(const cublasLtMatmulHeuristicResult_t* results, int found, void* D,
                    size_t d_bytes, float beta, const Run& run, const AlgoKey& key) {
  // D as it was, when the product adds to it (each timed run adds once more).
  void* saved = nullptr;
  if (beta != 0.0f) {
    check(cudaMalloc(&saved, d_bytes), "matmul tuning: cudaMalloc");
    check(cudaMemcpyAsync(saved, D, d_bytes, cudaMemcpyDeviceToDevice, stream_),
          "matmul tuning: save D");
  }
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  check(cudaEventCreate(&t0), "matmul tuning: cudaEventCreate");
  check(cudaEventCreate(&t1), "matmul tuning: cudaEventCreate");
  std::vector<float> best_ms(static_cast<size_t>(found), -1.0f);
  for (int i = 0; i < found; ++i) {
    if (results[i].workspaceSize > workspace_bytes_) continue;
    if (run(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // (warm-up; some refuse)
    float least = -1.0f;
    for (int rep = 0; rep < 3; ++rep) {
      check(cudaEventRecord(t0, stream_), "matmul tuning: cudaEventRecord");
      run(results[i].algo);
      check(cudaEventRecord(t1, stream_), "matmul tuning: cudaEventRecord");
      check(cudaEventSynchronize(t1), "matmul tuning: cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, t0, t1), "matmul tuning: cudaEventElapsedTime");
      if (least < 0.0f || ms < least) least = ms;
    }
    best_ms[static_cast<size_t>(i)] = least;
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  if (saved != nullptr) {
    check(cudaMemcpyAsync(D, saved, d_bytes, cudaMemcpyDeviceToDevice, stream_),
          "matmul tuning: restore D");
    check(cudaStreamSynchronize(stream_), "matmul tuning: cudaStreamSynchronize");
    cudaFree(saved);
  }
  int pick = 0;
  for (int i = 0; i < found; ++i) {
    const float ms = best_ms[static_cast<size_t>(i)];
    if (ms >= 0.0f &&
        (best_ms[static_cast<size_t>(pick)] < 0.0f || ms < best_ms[static_cast<size_t>(pick)]))
      pick = i;
  }
  std::fprintf(stderr,
               "zerod: cuBLASLt tuning m=%lld n=%lld k=%lld trans=%lld%lld epilogue %lld: "
               "heuristic's first %.1f us, algorithm %d of %d %.1f us\n",
               static_cast<long long>(key[2]), static_cast<long long>(key[3]),
               static_cast<long long>(key[4]), static_cast<long long>(key[0]),
               static_cast<long long>(key[1]), static_cast<long long>(key[12]), 1e3 * best_ms[0],
               pick, found, 1e3 * best_ms[static_cast<size_t>(pick)]);
  return pick;
}

bool Matmul::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A,
                  int64_t lda, const void* B, int64_t ldb, void* D, int64_t ldd, float beta,
                  const Extra& extra) {
  const cudaDataType_t type = data_type(dt_);
  OpDesc op;
  check_lt(cublaslt().MatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_op(op.d, CUBLASLT_MATMUL_DESC_TRANSA, ta, "cublaslt().MatmulDescSetAttribute(TRANSA)");
  set_op(op.d, CUBLASLT_MATMUL_DESC_TRANSB, tb, "cublaslt().MatmulDescSetAttribute(TRANSB)");
  if (extra.epilogue != Epilogue::kNone) {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (extra.epilogue == Epilogue::kGeluAuxBias) epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (extra.epilogue == Epilogue::kDGelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
    set_op(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue,
           "cublaslt().MatmulDescSetAttribute(EPILOGUE)");
  }
  if (extra.bias != nullptr) {
    set_op(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, extra.bias,
           "cublaslt().MatmulDescSetAttribute(BIAS_POINTER)");
  }
  if (extra.aux != nullptr) {
    set_op(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, extra.aux,
           "cublaslt().MatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    set_op(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, extra.aux_ld,
           "cublaslt().MatmulDescSetAttribute(EPILOGUE_AUX_LD)");
  }

  // Stored shapes (before the op): A is (k,m) when transposed, else (m,k); B likewise.
  LayoutDesc a_layout, b_layout, d_layout;
  check_lt(cublaslt().MatrixLayoutCreate(&a_layout.d, type, trans_a ? k : m, trans_a ? m : k, lda),
           "cublaslt().MatrixLayoutCreate(A)");
  check_lt(cublaslt().MatrixLayoutCreate(&b_layout.d, type, trans_b ? n : k, trans_b ? k : n, ldb),
           "cublaslt().MatrixLayoutCreate(B)");
  check_lt(cublaslt().MatrixLayoutCreate(&d_layout.d, type, m, n, ldd),
           "cublaslt().MatrixLayoutCreate(D)");

  const int64_t bias_alignment = extra.bias == nullptr ? 0 : alignment_of(extra.bias);
  const int64_t aux_alignment = extra.aux == nullptr ? 0 : alignment_of(extra.aux);
  const AlgoKey key = {trans_a,
                       trans_b,
                       m,
                       n,
                       k,
                       lda,
                       ldb,
                       ldd,
                       alignment_of(A),
                       alignment_of(B),
                       alignment_of(D),
                       bias_alignment,
                       static_cast<int64_t>(extra.epilogue),
                       aux_alignment,
                       extra.aux_ld};
  auto cached = algos_.find(key);
  if (cached == algos_.end()) {
    PrefDesc pref;
    check_lt(cublaslt().MatmulPreferenceCreate(&pref.d), "cublasLtMatmulPreferenceCreate");
    set_pref(pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
             static_cast<uint64_t>(workspace_bytes_));
    set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(A));
    set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(B));
    set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(D));
    set_pref(pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(D));
    if (dt_ != Storage::kF32) {
      set_pref(pref.d, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
               uint32_t{CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE});
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(tune_));
    int found = 0;
    const cublasStatus_t status =
        cublaslt().MatmulAlgoGetHeuristic(handle_, op.d, a_layout.d, b_layout.d, d_layout.d,
                                          d_layout.d, pref.d, tune_, results.data(), &found);
    // (An error is thrown, not cached, unless an epilogue is asked for: then the caller falls
    // back to the plain product.)
    if (status != CUBLAS_STATUS_SUCCESS && extra.epilogue == Epilogue::kNone)
      check_lt(status, "cublasLtMatmulAlgoGetHeuristic");
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
      int pick = 0;
      if (found > 1) {
        const float one = 1.0f;
        const size_t d_bytes =
            static_cast<size_t>(ldd) * static_cast<size_t>(n) * (dt_ == Storage::kF32 ? 4 : 2);
        pick = fastest(
            results.data(), found, D, d_bytes, beta,
            [&](const cublasLtMatmulAlgo_t& a) {
              return cublaslt().Matmul(handle_, op.d, &one, A, a_layout.d, B, b_layout.d, &beta, D,
                                       d_layout.d, D, d_layout.d, &a, workspace_, workspace_bytes_,
                                       stream_);
            },
            key);
      }
      algo = results[static_cast<size_t>(pick)].algo;
    }
    cached = algos_.emplace(key, algo).first;
  }
  if (!cached->second) {
    if (extra.epilogue != Epilogue::kNone) return false;
    ZD_THROW("cuBLASLt has no algorithm for a (m={}, n={}, k={}) matmul, transa={}, transb={}", m,
             n, k, trans_a, trans_b);
  }
  const float alpha = 1.0f;
  const cublasStatus_t status =
      cublaslt().Matmul(handle_, op.d, &alpha, A, a_layout.d, B, b_layout.d, &beta, D, d_layout.d,
                        D, d_layout.d, &*cached->second, workspace_, workspace_bytes_, stream_);
  if (status != CUBLAS_STATUS_SUCCESS) {
    ZD_THROW(
        "cublasLtMatmul (m={}, n={}, k={}, transa={}, transb={}, epilogue {}): cuBLASLt error "
        "{}: {}",
        m, n, k, trans_a, trans_b, static_cast<int>(extra.epilogue),
        cublaslt().GetStatusName(status), cublaslt().GetStatusString(status));
  }
  return true;
}

void Matmul::forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                     int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (C <= 0) {  // empty inner dimension: out = bias (or 0)
    if (bias != nullptr) {
      add_bias(dt_, out, bias, N, OC, /*overwrite=*/true, stream_);
    } else {
      const size_t elem = dt_ == Storage::kF32 ? 4 : 2;
      check(cudaMemsetAsync(out, 0, static_cast<size_t>(N) * OC * elem, stream_),
            "matmul_forward: cudaMemsetAsync");
    }
    return;
  }
  // The epilogue wants a 16-byte aligned bias; otherwise (or without an algorithm) add it after.
  const bool epilogue = bias != nullptr && alignment_of(bias) >= 16;
  if (epilogue && gemm(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f,
                       Extra{Epilogue::kBias, bias, nullptr, 0})) {
    return;
  }
  gemm(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f);
  if (bias != nullptr) add_bias(dt_, out, bias, N, OC, /*overwrite=*/false, stream_);
}

void Matmul::backward(void* dinp, void* dweight, const void* dout, const void* inp,
                      const void* weight, int64_t N, int C, int OC, bool accumulate_dinp) {
  if (N <= 0 || C <= 0) return;
  if (dinp != nullptr) {
    if (OC > 0) {
      gemm(false, false, C, N, OC, weight, C, dout, OC, dinp, C, accumulate_dinp ? 1.0f : 0.0f);
    } else if (!accumulate_dinp) {
      const size_t elem = dt_ == Storage::kF32 ? 4 : 2;
      check(cudaMemsetAsync(dinp, 0, static_cast<size_t>(N) * C * elem, stream_),
            "matmul_backward: cudaMemsetAsync");
    }
  }
  if (dweight != nullptr && OC > 0) gemm(false, true, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f);
}

bool Matmul::forward_gelu(void* out, void* pre, const void* inp, const void* weight,
                          const void* bias, int64_t N, int C, int OC) {
  // cuBLASLt wants the aux leading dimension a multiple of 8 and 16-byte aligned pointers.
  if (N <= 0 || C <= 0 || OC <= 0 || OC % 8 != 0 || bias == nullptr) return false;
  if (alignment_of(bias) < 16 || alignment_of(pre) < 16) return false;
  return gemm(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f,
              Extra{Epilogue::kGeluAuxBias, bias, pre, OC});
}

bool Matmul::backward_dgelu(void* dpre, const void* dout, const void* weight, const void* pre,
                            int64_t N, int C, int OC) {
  if (N <= 0 || C <= 0 || OC <= 0 || C % 8 != 0 || alignment_of(pre) < 16) return false;
  return gemm(false, false, C, N, OC, weight, C, dout, OC, dpre, C, 0.0f,
              Extra{Epilogue::kDGelu, nullptr, pre, C});
}

}  // namespace zerod::cuda
