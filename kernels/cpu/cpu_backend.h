// The CPU reference backend: every Backend op on fp32 storage (kernels/cpu/*.h). For bf16/fp16
// compute dtypes tensors stay fp32 arrays holding values representable in the 16-bit type;
// round_to_compute() / cast_to_compute() / optimizer_update()'s param_out do the rounding.
#pragma once

#include <string>
#include <vector>

#include "kernels/backend.h"

namespace zerod::cpu {

// What bf16 mode computes its matrix products with on this machine and build, and why: one line
// (the backend logs it once; zerod check prints it for bf16 CPU jobs).
std::string bf16_products_note();

class CpuBackend final : public Backend {
 public:
  // bf16 compute runs its matrix products on bf16 operands (bf16_gemm.h) where this CPU and
  // build can, unless ZEROD_CPU_BF16_GEMM=0; the first backend made logs which, and why.
  explicit CpuBackend(DType compute_dtype);
  // True when matmul_forward/backward multiply bf16 operands (bf16 mode on a CPU that can).
  bool bf16_products() const { return bf16_products_; }

  const char* name() const override { return "cpu"; }
  DType compute_dtype() const override { return dtype_; }
  size_t compute_elem_size() const override { return sizeof(float); }

  Buffer allocate(size_t bytes, MemCategory category, MemoryTracker* tracker) override;
  void memset_zero(void* p, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_2d(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows,
               int64_t cols) override;

  void round_to_compute(void* x, int64_t n) override;
  void cast_to_compute(void* out, const float* in, int64_t n) override;
  void cast_from_compute(float* out, const void* in, int64_t n) override;

  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                       int T, int C, const int32_t* doc_start) override;
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* doc_start) override;

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int64_t N, int C) override;
  void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                  const void* b, const void* weight, const void* bias, int64_t N,
                                  int C) override;
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int64_t N,
                          int C) override;

  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                      int C, int OC) override;
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int64_t N, int C, int OC, bool accumulate_dinp) override;

  void attention_forward(void* out, float* lse, const void* qkv, const AttentionShape& s) override;
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionShape& s) override;
  void attention_kv_cache(void* out, const void* qkv, void* kcache, void* vcache, int pos0,
                          int maxT, const AttentionShape& s) override;
  void attention_block_forward(void* out, float* lse, const void* qkv, const int32_t* qpos,
                               const void* kv, const int32_t* kpos, int Tk, const AttentionShape& s,
                               bool first_block) override;
  void attention_block_backward(void* dqkv, void* dkv, const void* dout, const void* qkv,
                                const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                                const void* out, const float* lse, const AttentionShape& s,
                                bool accumulate_dkv) override;

  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int64_t N,
                       int C, float eps) override;
  void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                        const void* weight, const float* rstd, int64_t N, int C) override;

  void rope_forward(void* qkv, const float* cos, const float* sin,
                    const AttentionShape& s) override;
  void rope_backward(void* dqkv, const float* cos, const float* sin,
                     const AttentionShape& s) override;

  void swiglu_forward(void* out, const void* gu, int64_t N, int I) override;
  void swiglu_backward(void* dgu, const void* dout, const void* gu, int64_t N, int I) override;

  void gelu_forward(void* out, const void* inp, int64_t n) override;
  void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n) override;

  void residual_forward(void* out, const void* a, const void* b, int64_t n) override;

  void crossentropy_forward(float* losses, const void* logits, const int32_t* targets, int64_t N,
                            int V, int Vp) override;
  void crossentropy_fused(float* losses, void* logits_to_dlogits, const int32_t* targets, int64_t N,
                          int V, int Vp, float dloss) override;
  void crossentropy_shard_stats(float* stats, const void* logits, const int32_t* targets, int64_t N,
                                int real, int Vl, int v0) override;
  void crossentropy_shard_sumexp(float* stats, const void* logits, int64_t N, int real,
                                 int Vl) override;
  void crossentropy_shard_finish(float* losses, void* logits_to_dlogits, const int32_t* targets,
                                 const float* stats, int64_t N, int real, int Vl, int v0,
                                 float dloss) override;

  MoeRouterStats moe_router_forward(float* probs, float* lse, int32_t* expert, float* weight,
                                    int64_t* aux_counts, int64_t* kept, const void* logits,
                                    int64_t N, const MoeRouterOptions& o) override;
  void moe_router_backward(void* dlogits, const float* dweight, const float* probs,
                           const float* lse, const int32_t* expert, int64_t N,
                           const MoeRouterOptions& o, const MoeRouterLossGrad& loss) override;
  int64_t moe_permute_plan(int64_t* offsets, int32_t* row_token, int32_t* slot_row,
                           const int32_t* expert, int64_t N, int k, int E) override;
  void moe_permute_forward(void* xp, const void* x, const int32_t* row_token, int64_t R,
                           int C) override;
  void moe_permute_backward(void* dx, const void* dxp, const int32_t* slot_row, int64_t N, int k,
                            int C) override;
  void moe_unpermute_forward(void* y, const void* yp, const float* weight, const int32_t* slot_row,
                             int64_t N, int k, int C) override;
  void moe_unpermute_backward(void* dyp, float* dweight, const void* dy, const void* yp,
                              const float* weight, const int32_t* slot_row, int64_t N, int k,
                              int C) override;
  void grouped_matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                              const int64_t* offsets, int E, int C, int OC, int64_t weight_stride,
                              int64_t bias_stride) override;
  void grouped_matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const int64_t* offsets, int E,
                               int C, int OC, bool accumulate_dinp, int64_t weight_stride,
                               int64_t bias_stride) override;

  void optimizer_update(float* master, float* m, float* v, const void* grad, void* param_out,
                        int64_t n, const OptimizerParams& p) override;
  LambSums lamb_moments(float* master, float* m, float* v, const void* grad, int64_t n,
                        const OptimizerParams& p) override;
  void lamb_apply(float* master, const float* m, const float* v, void* param_out, int64_t n,
                  const OptimizerParams& p, float coeff) override;
  double sum_squares(const void* x, int64_t n) override;
  void scale(void* x, float s, int64_t n) override;

 private:
  DType dtype_;
  bool bf16_products_ = false;
  // bf16 products: the last crossentropy_fused's dlogits as bf16 (N,Vp), valid for the next
  // matmul_backward when it reads dout == dlogits_bf16_of_ (then, or at any other backward
  // product or cross-entropy, forgotten).
  std::vector<uint16_t> dlogits_bf16_;
  const void* dlogits_bf16_of_ = nullptr;
  int64_t dlogits_bf16_elems_ = 0;
};

}  // namespace zerod::cpu
