// The mixture-of-experts ops of the Backend interface: the defaults (a backend without them
// refuses) and the CPU backend's, over the reference kernels (moe_router.h, moe_permute.h,
// grouped_matmul.h).
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/grouped_matmul.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"

namespace zerod {

namespace {

[[noreturn]] void no_moe(const Backend& b, const char* op) {
  ZD_THROW_INPUT("the {} backend has no mixture-of-experts ops yet ({}): run MoE layers on the cpu",
                 b.name(), op);
}

inline float* F(void* p) {
  return static_cast<float*>(p);
}
inline const float* F(const void* p) {
  return static_cast<const float*>(p);
}

}  // namespace

MoeRouterStats Backend::moe_router_forward(float*, float*, int32_t*, float*, int64_t*, int64_t*,
                                           const void*, int64_t, const MoeRouterOptions&) {
  no_moe(*this, "moe_router_forward");
}
void Backend::moe_router_backward(void*, const float*, const float*, const float*, const int32_t*,
                                  int64_t, const MoeRouterOptions&, const MoeRouterLossGrad&) {
  no_moe(*this, "moe_router_backward");
}
int64_t Backend::moe_permute_plan(int64_t*, int32_t*, int32_t*, const int32_t*, int64_t, int, int) {
  no_moe(*this, "moe_permute_plan");
}
void Backend::moe_permute_forward(void*, const void*, const int32_t*, int64_t, int) {
  no_moe(*this, "moe_permute_forward");
}
void Backend::moe_permute_backward(void*, const void*, const int32_t*, int64_t, int, int) {
  no_moe(*this, "moe_permute_backward");
}
void Backend::moe_unpermute_forward(void*, const void*, const float*, const int32_t*, int64_t, int,
                                    int) {
  no_moe(*this, "moe_unpermute_forward");
}
void Backend::moe_unpermute_backward(void*, float*, const void*, const void*, const float*,
                                     const int32_t*, int64_t, int, int) {
  no_moe(*this, "moe_unpermute_backward");
}
void Backend::grouped_matmul_forward(void*, const void*, const void*, const void*, const int64_t*,
                                     int, int, int, int64_t, int64_t) {
  no_moe(*this, "grouped_matmul_forward");
}
void Backend::grouped_matmul_backward(void*, void*, void*, const void*, const void*, const void*,
                                      const int64_t*, int, int, int, bool, int64_t, int64_t) {
  no_moe(*this, "grouped_matmul_backward");
}

namespace cpu {

MoeRouterStats CpuBackend::moe_router_forward(float* probs, float* lse, int32_t* expert,
                                              float* weight, int64_t* aux_counts, int64_t* kept,
                                              const void* logits, int64_t N,
                                              const MoeRouterOptions& o) {
  return cpu::moe_router_forward(probs, lse, expert, weight, aux_counts, kept, nullptr, F(logits),
                                 N, o);
}
void CpuBackend::moe_router_backward(void* dlogits, const float* dweight, const float* probs,
                                     const float* lse, const int32_t* expert, int64_t N,
                                     const MoeRouterOptions& o, const MoeRouterLossGrad& loss) {
  cpu::moe_router_backward(F(dlogits), dweight, probs, lse, expert, N, o, loss);
}
int64_t CpuBackend::moe_permute_plan(int64_t* offsets, int32_t* row_token, int32_t* slot_row,
                                     const int32_t* expert, int64_t N, int k, int E) {
  return cpu::moe_permute_plan(offsets, row_token, slot_row, expert, N, k, E);
}
void CpuBackend::moe_permute_forward(void* xp, const void* x, const int32_t* row_token, int64_t R,
                                     int C) {
  cpu::moe_permute_forward(F(xp), F(x), row_token, R, C);
}
void CpuBackend::moe_permute_backward(void* dx, const void* dxp, const int32_t* slot_row, int64_t N,
                                      int k, int C) {
  cpu::moe_permute_backward(F(dx), F(dxp), slot_row, N, k, C);
}
void CpuBackend::moe_unpermute_forward(void* y, const void* yp, const float* weight,
                                       const int32_t* slot_row, int64_t N, int k, int C) {
  cpu::moe_unpermute_forward(F(y), F(yp), weight, slot_row, N, k, C);
}
void CpuBackend::moe_unpermute_backward(void* dyp, float* dweight, const void* dy, const void* yp,
                                        const float* weight, const int32_t* slot_row, int64_t N,
                                        int k, int C) {
  cpu::moe_unpermute_backward(F(dyp), dweight, F(dy), F(yp), weight, slot_row, N, k, C);
}
void CpuBackend::grouped_matmul_forward(void* out, const void* inp, const void* weight,
                                        const void* bias, const int64_t* offsets, int E, int C,
                                        int OC, int64_t weight_stride, int64_t bias_stride) {
  cpu::grouped_matmul_forward(F(out), F(inp), F(weight), F(bias), offsets, E, C, OC, bf16_products_,
                              weight_stride, bias_stride);
}
void CpuBackend::grouped_matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                         const void* inp, const void* weight,
                                         const int64_t* offsets, int E, int C, int OC,
                                         bool accumulate_dinp, int64_t weight_stride,
                                         int64_t bias_stride) {
  dlogits_bf16_of_ = nullptr;  // any other backward product forgets the head's bf16 dlogits
  cpu::grouped_matmul_backward(F(dinp), F(dweight), F(dbias), F(dout), F(inp), F(weight), offsets,
                               E, C, OC, accumulate_dinp, bf16_products_, weight_stride,
                               bias_stride);
}

}  // namespace cpu
}  // namespace zerod
