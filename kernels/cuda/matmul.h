// Matmul forward/backward through cuBLASLt: bf16/fp16 inputs with fp32 accumulation, fp32 inputs
// with fp32 compute (no TF32). Row-major tensors as kernels/backend.h; device pointers;
// asynchronous on the stream given to the constructor. Host code (C++20, links cuBLASLt).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// ZEROD_CUBLASLT_TUNE's value: how many of the heuristic's algorithms to time on the first
// product of each shape ("" or unset: 1, the heuristic's first choice, nothing timed). Bad values
// are bad input (InputError naming the variable and what it takes).
int parse_cublaslt_tune(const char* value);

class Matmul {
 public:
  // Creates the cuBLASLt handle and a workspace of `workspace_bytes` device memory.
  Matmul(Storage dt, cudaStream_t stream, size_t workspace_bytes = size_t{32} << 20);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC, may be null; the cuBLASLt bias
  // epilogue, or a separate broadcast add when no algorithm offers it for these pointers).
  void forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int C,
               int OC);
  // dinp (N,C) = (+= when accumulate_dinp) dout (N,OC) x weight (OC,C), skipped when null;
  // dweight (OC,C) += dout^T x inp (beta = 1). dbias is not handled here (see bias.h).
  void backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* weight,
                int64_t N, int C, int OC, bool accumulate_dinp);

  // The fully connected layer before a GELU in one product (the GELU_AUX_BIAS epilogue):
  // pre (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC), out (N,OC) = gelu(pre), both written.
  // False (nothing launched) when no algorithm offers the epilogue for these pointers.
  bool forward_gelu(void* out, void* pre, const void* inp, const void* weight, const void* bias,
                    int64_t N, int C, int OC);
  // The input gradient of a layer whose input was gelu(pre), in one product (the DGELU
  // epilogue): dpre (N,C) = (dout (N,OC) x weight (OC,C)) * gelu'(pre (N,C)). False (nothing
  // launched) when no algorithm offers it.
  bool backward_dgelu(void* dpre, const void* dout, const void* weight, const void* pre, int64_t N,
                      int C, int OC);

 private:
  enum class Epilogue : int64_t { kNone, kBias, kGeluAuxBias, kDGelu };
  struct Extra {
    Epilogue epilogue = Epilogue::kNone;
    const void* bias = nullptr;  // (m), kBias and kGeluAuxBias
    const void* aux = nullptr;   // column-major (m,n) with leading dimension aux_ld: the GELU input
    int64_t aux_ld = 0;
  };
  // Column-major D (m,n) = op(A) (m,k) x op(B) (k,n) + beta D, then the epilogue: + bias (m) per
  // row of D; or that and D = gelu(D) with the pre-GELU values to aux; or D *= gelu'(aux).
  // Returns false (nothing launched) when an epilogue is asked for and no algorithm offers it.
  bool gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
            const void* B, int64_t ldb, void* D, int64_t ldd, float beta, const Extra& extra);
  bool gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
            const void* B, int64_t ldb, void* D, int64_t ldd, float beta) {
    return gemm(trans_a, trans_b, m, n, k, A, lda, B, ldb, D, ldd, beta, Extra{});
  }

  // The heuristic's algorithm for a product's shapes, operations, pointer alignments and
  // epilogue (nullopt: none found), asked once per key: the query costs tens of microseconds and
  // a training step repeats the same few shapes.
  using AlgoKey = std::array<int64_t, 15>;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos_;
  // With ZEROD_CUBLASLT_TUNE=K > 1: the first product of each key runs each of the heuristic's
  // K algorithms (one warm-up, then the least of three timed runs, device events) and keeps the
  // fastest; a product that accumulates (beta 1) has D saved before and restored after. `run`
  // launches the product with the algorithm given. Prints one line per key to stderr.
  template <class Run>
  int fastest(const cublasLtMatmulHeuristicResult_t* results, int found, void* D, size_t d_bytes,
              float beta, const Run& run, const AlgoKey& key);
  int tune_ = 1;

  Storage dt_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace zerod::cuda
