#include "kernels/cpu/cpu_backend.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <mutex>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/lamb.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace zerod {

namespace cpu {

namespace {
inline float* F(void* p) {
  return static_cast<float*>(p);
}

// ZEROD_CPU_BF16_GEMM: unset or 1, bf16 products where they can run; 0, never.
bool bf16_gemm_wanted() {
  return env_switch("ZEROD_CPU_BF16_GEMM", true);
}
inline const float* F(const void* p) {
  return static_cast<const float*>(p);
}
}  // namespace

Buffer CpuBackend::allocate(size_t bytes, MemCategory category, MemoryTracker* tracker) {
  return host_alloc(bytes, category, tracker);
}

void CpuBackend::memset_zero(void* p, size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void CpuBackend::copy_2d(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows,
                         int64_t cols) {
  ZD_CHECK(rows >= 0 && cols >= 0 && dst_ld >= cols && src_ld >= cols,
           "copy_2d: {} rows of {} columns between row strides {} and {}", rows, cols, dst_ld,
           src_ld);
  if (rows == 0 || cols == 0) return;
  float* d = F(dst);
  const float* s = F(src);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(d + r * dst_ld, s + r * src_ld, cols * sizeof(float));
}

std::string bf16_products_note() {
  if (!bf16_gemm_wanted()) {
    return "bf16 on the CPU: bf16 storage, fp32 matrix products (ZEROD_CPU_BF16_GEMM=0)";
  }
  const std::string why = bf16_gemm_unavailable();
  if (!why.empty()) return "bf16 on the CPU: bf16 storage, fp32 matrix products (" + why + ")";
  return "bf16 on the CPU: matrix products on bf16 operands with fp32 accumulation (oneDNN, "
         "avx512_bf16)";
}

CpuBackend::CpuBackend(DType compute_dtype) : dtype_(compute_dtype) {
  if (dtype_ != DType::kBF16) return;
  bf16_products_ = bf16_gemm_wanted() && bf16_gemm_unavailable().empty();
  static std::once_flag logged;
  std::call_once(logged, [] { spdlog::info("{}", bf16_products_note()); });
}

void CpuBackend::round_to_compute(void* x, int64_t n) {
  cast_round(F(x), F(x), n, dtype_);
}

void CpuBackend::cast_to_compute(void* out, const float* in, int64_t n) {
  cast_round(F(out), in, n, dtype_);
}

void CpuBackend::cast_from_compute(float* out, const void* in, int64_t n) {
  cast_round(out, F(in), n, DType::kF32);
}

void CpuBackend::encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                                 int B, int T, int C, const int32_t* doc_start) {
  cpu::encoder_forward(F(out), tokens, F(wte), F(wpe), B, T, C, doc_start);
}

void CpuBackend::encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                  int B, int T, int C, const int32_t* doc_start) {
  cpu::encoder_backward(F(dwte), F(dwpe), F(dout), tokens, B, T, C, doc_start);
}

void CpuBackend::layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                   const void* weight, const void* bias, int64_t N, int C) {
  cpu::layernorm_forward(F(out), mean, rstd, F(inp), F(weight), F(bias), N, C);
}

// The reference: the three ops it fuses, in order.
void CpuBackend::residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                            const void* a, const void* b, const void* weight,
                                            const void* bias, int64_t N, int C) {
  const int64_t n = N * C;
  residual_forward(res, a, b, n);
  round_to_compute(res, n);
  layernorm_forward(out, mean, rstd, res, weight, bias, N, C);
}

void CpuBackend::layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                    const void* inp, const void* weight, const float* mean,
                                    const float* rstd, int64_t N, int C) {
  cpu::layernorm_backward(F(dinp), F(dweight), F(dbias), F(dout), F(inp), F(weight), mean, rstd, N,
                          C);
}

void CpuBackend::matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                                int64_t N, int C, int OC) {
  cpu::matmul_forward(F(out), F(inp), F(weight), F(bias), N, C, OC, bf16_products_);
}

void CpuBackend::matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                 const void* inp, const void* weight, int64_t N, int C, int OC,
                                 bool accumulate_dinp) {
  // The fused cross-entropy's bf16 dlogits serve the very next backward product that reads
  // those dlogits (the head's), and only it.
  const uint16_t* d16 =
      dout == dlogits_bf16_of_ && N * OC == dlogits_bf16_elems_ ? dlogits_bf16_.data() : nullptr;
  dlogits_bf16_of_ = nullptr;
  cpu::matmul_backward(F(dinp), F(dweight), F(dbias), F(dout), F(inp), F(weight), N, C, OC,
                       accumulate_dinp, bf16_products_, d16);
}

void CpuBackend::attention_forward(void* out, float* lse, const void* qkv,
                                   const AttentionShape& s) {
  cpu::attention_forward(F(out), lse, F(qkv), s);
}

void CpuBackend::attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                    const float* lse, const AttentionShape& s) {
  cpu::attention_backward(F(dqkv), F(dout), F(qkv), F(out), lse, s);
}

void CpuBackend::attention_kv_cache(void* out, const void* qkv, void* kcache, void* vcache,
                                    int pos0, int maxT, const AttentionShape& s) {
  cpu::attention_kv_cache(F(out), F(qkv), F(kcache), F(vcache), pos0, maxT, s);
}

void CpuBackend::attention_block_forward(void* out, float* lse, const void* qkv,
                                         const int32_t* qpos, const void* kv, const int32_t* kpos,
                                         int Tk, const AttentionShape& s, bool first_block) {
  cpu::attention_block_forward(F(out), lse, F(qkv), qpos, F(kv), kpos, Tk, s, first_block);
}

void CpuBackend::attention_block_backward(void* dqkv, void* dkv, const void* dout, const void* qkv,
                                          const int32_t* qpos, const void* kv, const int32_t* kpos,
                                          int Tk, const void* out, const float* lse,
                                          const AttentionShape& s, bool accumulate_dkv) {
  cpu::attention_block_backward(F(dqkv), F(dkv), F(dout), F(qkv), qpos, F(kv), kpos, Tk, F(out),
                                lse, s, accumulate_dkv);
}

void CpuBackend::rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight,
                                 int64_t N, int C, float eps) {
  cpu::rmsnorm_forward(F(out), rstd, F(inp), F(weight), N, C, eps);
}

void CpuBackend::rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                  const void* weight, const float* rstd, int64_t N, int C) {
  cpu::rmsnorm_backward(F(dinp), F(dweight), F(dout), F(inp), F(weight), rstd, N, C);
}

void CpuBackend::rope_forward(void* qkv, const float* cos, const float* sin,
                              const AttentionShape& s) {
  cpu::rope_forward(F(qkv), cos, sin, s);
}

void CpuBackend::rope_backward(void* dqkv, const float* cos, const float* sin,
                               const AttentionShape& s) {
  cpu::rope_backward(F(dqkv), cos, sin, s);
}

void CpuBackend::swiglu_forward(void* out, const void* gu, int64_t N, int I) {
  cpu::swiglu_forward(F(out), F(gu), N, I);
}

void CpuBackend::swiglu_backward(void* dgu, const void* dout, const void* gu, int64_t N, int I) {
  cpu::swiglu_backward(F(dgu), F(dout), F(gu), N, I);
}

void CpuBackend::gelu_forward(void* out, const void* inp, int64_t n) {
  cpu::gelu_forward(F(out), F(inp), n);
}

void CpuBackend::gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n) {
  cpu::gelu_backward(F(dinp), F(inp), F(dout), n);
}

void CpuBackend::residual_forward(void* out, const void* a, const void* b, int64_t n) {
  cpu::residual_forward(F(out), F(a), F(b), n);
}

void CpuBackend::crossentropy_forward(float* losses, const void* logits, const int32_t* targets,
                                      int64_t N, int V, int Vp) {
  cpu::crossentropy_forward(losses, F(logits), targets, N, V, Vp);
}

void CpuBackend::crossentropy_fused(float* losses, void* logits_to_dlogits, const int32_t* targets,
                                    int64_t N, int V, int Vp, float dloss) {
  // 16-bit modes: the rows are rounded in cache (the Backend contract), not in extra passes;
  // with bf16 products also written as bf16 for the head's backward (matmul_backward).
  dlogits_bf16_of_ = nullptr;
  uint16_t* d16 = nullptr;
  if (bf16_products_) {
    dlogits_bf16_.resize(static_cast<size_t>(N * Vp));
    d16 = dlogits_bf16_.data();
  }
  cpu::crossentropy_fused(losses, F(logits_to_dlogits), targets, N, V, Vp, dloss, dtype_, d16);
  if (d16 != nullptr) {
    dlogits_bf16_of_ = logits_to_dlogits;
    dlogits_bf16_elems_ = N * Vp;
  }
}

// Like crossentropy_fused, the shard ops compute in fp32 on the stored values (already rounded
// to the compute dtype) and leave the rounding of dlogits to the caller.
void CpuBackend::crossentropy_shard_stats(float* stats, const void* logits, const int32_t* targets,
                                          int64_t N, int real, int Vl, int v0) {
  cpu::crossentropy_shard_stats(stats, F(logits), targets, N, real, Vl, v0);
}

void CpuBackend::crossentropy_shard_sumexp(float* stats, const void* logits, int64_t N, int real,
                                           int Vl) {
  cpu::crossentropy_shard_sumexp(stats, F(logits), N, real, Vl);
}

void CpuBackend::crossentropy_shard_finish(float* losses, void* logits_to_dlogits,
                                           const int32_t* targets, const float* stats, int64_t N,
                                           int real, int Vl, int v0, float dloss) {
  dlogits_bf16_of_ = nullptr;
  cpu::crossentropy_shard_finish(losses, F(logits_to_dlogits), targets, stats, N, real, Vl, v0,
                                 dloss);
}

void CpuBackend::optimizer_update(float* master, float* m, float* v, const void* grad,
                                  void* param_out, int64_t n, const OptimizerParams& p) {
  cpu::optimizer_update(master, m, v, F(grad), F(param_out), n, p, dtype_);
}

Backend::LambSums CpuBackend::lamb_moments(float* master, float* m, float* v, const void* grad,
                                           int64_t n, const OptimizerParams& p) {
  return cpu::lamb_moments(master, m, v, F(grad), n, p);
}

void CpuBackend::lamb_apply(float* master, const float* m, const float* v, void* param_out,
                            int64_t n, const OptimizerParams& p, float coeff) {
  cpu::lamb_apply(master, m, v, F(param_out), n, p, coeff, dtype_);
}

double CpuBackend::sum_squares(const void* x, int64_t n) {
  return cpu::sum_squares(F(x), n);
}

void CpuBackend::scale(void* x, float s, int64_t n) {
  cpu::scale(F(x), s, n);
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(DType compute_dtype) {
  return std::make_unique<cpu::CpuBackend>(compute_dtype);
}

}  // namespace zerod
