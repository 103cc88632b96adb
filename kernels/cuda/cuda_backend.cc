#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/device_oom.h"
#include "core/error.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/lamb.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/crossentropy.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/lamb.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/residual.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/storage.h"
#include "kernels/cuda/swiglu.h"

namespace zerod {

namespace cuda {

namespace {

static_assert(static_cast<int>(Storage::kF32) == static_cast<int>(DType::kF32));
static_assert(static_cast<int>(Storage::kBF16) == static_cast<int>(DType::kBF16));
static_assert(static_cast<int>(Storage::kF16) == static_cast<int>(DType::kF16));

// Host-side staging of casts from / to host memory, in pieces of this many elements.
constexpr int64_t kStageElems = int64_t{16} << 20;

// Frees device memory on its own device (a Buffer may die on a thread whose current device is
// another one), restoring the thread's device. A destructor path: errors cannot be reported.
void device_release(void* data, size_t) {
  int current = -1;
  cudaPointerAttributes attr{};
  const bool known = cudaGetDevice(&current) == cudaSuccess &&
                     cudaPointerGetAttributes(&attr, data) == cudaSuccess &&
                     attr.type == cudaMemoryTypeDevice;
  if (known && attr.device != current) cudaSetDevice(attr.device);
  cudaFree(data);
  if (known && attr.device != current) cudaSetDevice(current);
  cudaGetLastError();
}

void pinned_release(void* data, size_t) {
  cudaFreeHost(data);  // a destructor path: errors cannot be reported
}

// True for memory a kernel on `device` may read (its device memory, or managed memory); false
// for host memory, registered or not, and for another GPU's memory (copied through staging).
bool on_device(const void* p, int device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error of an unknown pointer: it is host memory
    return false;
  }
  return (attr.type == cudaMemoryTypeDevice && attr.device == device) ||
         attr.type == cudaMemoryTypeManaged;
}

size_t align_up(size_t x, size_t a = 256) {
  return (x + a - 1) / a * a;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(DType dtype, int device) : dtype_(dtype), st_(static_cast<Storage>(dtype)) {
    const int count = device_count();
    ZD_CHECK(device >= 0 && device < count, "CUDA device {} requested but {} visible", device,
             count);
    device_ = device;
    check(cudaSetDevice(device_), "cudaSetDevice");
    cuda::attention_mma_variants();  // a bad ZEROD_ATTENTION_MMA fails here, before any step
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    try {
      matmul_ = std::make_unique<Matmul>(st_, stream_);
    } catch (...) {
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    matmul_.reset();
    if (scratch_ != nullptr) cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  DType compute_dtype() const override { return dtype_; }
  size_t compute_elem_size() const override { return dtype_size(dtype_); }

  // ---- memory ---------------------------------------------------------------------------------
  Buffer allocate(size_t bytes, MemCategory category, MemoryTracker* tracker) override {
    if (bytes == 0) return Buffer(nullptr, 0, nullptr, category, tracker);
    activate();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      out_of_memory(bytes, std::string(mem_category_name(category)),
                    tracker != nullptr ? tracker->total() : -1, status);
    }
    Buffer buffer(p, bytes, device_release, category, tracker);
    // Zeroed like host_alloc(), ordered before every later op of this backend.
    check(cudaMemsetAsync(p, 0, bytes, stream_), "allocate: cudaMemsetAsync");
    return buffer;
  }

  bool device_memory() const override { return true; }

  Buffer allocate_host(size_t bytes, MemCategory category, MemoryTracker* tracker) override {
    if (bytes == 0) return Buffer(nullptr, 0, nullptr, category, tracker);
    activate();
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      cudaGetLastError();
      ZD_THROW("cannot allocate {} bytes of pinned host memory for {}: {}", bytes,
               mem_category_name(category), cudaGetErrorString(status));
    }
    std::memset(p, 0, bytes);
    return Buffer(p, bytes, pinned_release, category, tracker);
  }

  void register_host(void* p, size_t bytes) override {
    if (p == nullptr || bytes == 0) return;
    activate();
    const cudaError_t status = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (status != cudaSuccess) {
      cudaGetLastError();
      ZD_THROW("cannot page-lock {} bytes of host buffers for copies to GPU {}: {}", bytes, device_,
               cudaGetErrorString(status));
    }
  }

  void unregister_host(void* p) override {
    if (p == nullptr) return;
    activate();
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();  // (a destructor path)
  }

  void* native_stream() const override { return stream_; }

  bool device_memory_info(int64_t* free_bytes, int64_t* total_bytes) const override {
    size_t f = 0, t = 0;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *free_bytes = static_cast<int64_t>(f);
    *total_bytes = static_cast<int64_t>(t);
    return true;
  }

  std::string device_name() const override {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    return prop.name;
  }

  void memset_zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    check(cudaMemsetAsync(p, 0, bytes, stream_), "memset_zero: cudaMemsetAsync");
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy: cudaMemcpyAsync");
    // Host memory on either side: done (readable / reusable) when copy() returns.
    if (!on_device(dst, device_) || !on_device(src, device_)) synchronize();
  }

  void copy_2d(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows,
               int64_t cols) override {
    ZD_CHECK(rows >= 0 && cols >= 0 && dst_ld >= cols && src_ld >= cols,
             "copy_2d: {} rows of {} columns between row strides {} and {}", rows, cols, dst_ld,
             src_ld);
    if (rows == 0 || cols == 0) return;
    activate();
    const size_t e = compute_elem_size();
    check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_ld) * e, src,
                            static_cast<size_t>(src_ld) * e, static_cast<size_t>(cols) * e,
                            static_cast<size_t>(rows), cudaMemcpyDefault, stream_),
          "copy_2d: cudaMemcpy2DAsync");
    if (!on_device(dst, device_) || !on_device(src, device_)) synchronize();
  }

  void synchronize() override {
    activate();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  // ---- precision --------------------------------------------------------------------------------
  void round_to_compute(void*, int64_t) override {}  // storage already has the dtype

  void cast_to_compute(void* out, const float* in, int64_t n) override {
    if (n <= 0) return;
    if (st_ == Storage::kF32) return copy(out, in, static_cast<size_t>(n) * sizeof(float));
    staged_convert(static_cast<uint16_t*>(out), in, n, "cast_to_compute",
                   [&](uint16_t* o, const float* i, int64_t len) {
                     if (st_ == Storage::kBF16) {
                       cast_f32_to_bf16(o, i, len, stream_);
                     } else {
                       cast_f32_to_f16(o, i, len, stream_);
                     }
                   });
  }

  void cast_from_compute(float* out, const void* in, int64_t n) override {
    if (n <= 0) return;
    if (st_ == Storage::kF32) return copy(out, in, static_cast<size_t>(n) * sizeof(float));
    staged_convert(out, static_cast<const uint16_t*>(in), n, "cast_from_compute",
                   [&](float* o, const uint16_t* i, int64_t len) {
                     if (st_ == Storage::kBF16) {
                       cast_bf16_to_f32(o, i, len, stream_);
                     } else {
                       cast_f16_to_f32(o, i, len, stream_);
                     }
                   });
  }

  // ---- encoder ----------------------------------------------------------------------------------
  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                       int T, int C, const int32_t* doc_start) override {
    activate();
    cuda::encoder_forward(st_, out, tokens, wte, wpe, B, T, C, stream_, doc_start);
  }

  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* doc_start) override {
    activate();
    const size_t bytes = encoder_backward_scratch_bytes(static_cast<int64_t>(B) * T);
    cuda::encoder_backward(st_, dwte, dwpe, dout, tokens, B, T, C, scratch(bytes), bytes, stream_,
                           doc_start);
  }

  // ---- layernorm --------------------------------------------------------------------------------
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int64_t N, int C) override {
    activate();
    cuda::layernorm_forward(st_, out, mean, rstd, inp, weight, bias, N, C, stream_);
  }

  void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                  const void* b, const void* weight, const void* bias, int64_t N,
                                  int C) override {
    activate();
    cuda::residual_layernorm_forward(st_, res, out, mean, rstd, a, b, weight, bias, N, C, stream_);
  }

  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int64_t N,
                          int C) override {
    activate();
    float* partial = static_cast<float*>(scratch(layernorm_backward_scratch_bytes(N, C)));
    cuda::layernorm_backward(st_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                             partial, stream_);
  }

  // ---- matmul -----------------------------------------------------------------------------------
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                      int C, int OC) override {
    activate();
    matmul_->forward(out, inp, weight, bias, N, C, OC);
  }

  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int64_t N, int C, int OC,
                       bool accumulate_dinp) override {
    activate();
    matmul_->backward(dinp, dweight, dout, inp, weight, N, C, OC, accumulate_dinp);
    if (dbias != nullptr) {
      float* partial = static_cast<float*>(scratch(bias_backward_scratch_bytes(N, OC)));
      bias_backward(st_, dbias, dout, N, OC, partial, stream_);
    }
  }

  // The cuBLASLt GELU epilogues in 16-bit storage (fp32 keeps the separate GELU kernels, whose
  // results the CPU backend's match to 1e-5); each falls back to the separate ops when cuBLASLt
  // has no algorithm with the epilogue for the call.
  bool fuses_matmul_gelu() const override { return st_ != Storage::kF32; }

  void matmul_gelu_forward(void* out, void* pre, const void* inp, const void* weight,
                           const void* bias, int64_t N, int C, int OC) override {
    activate();
    if (st_ != Storage::kF32 && matmul_->forward_gelu(out, pre, inp, weight, bias, N, C, OC))
      return;
    matmul_->forward(pre, inp, weight, bias, N, C, OC);
    cuda::gelu_forward(st_, out, pre, N * OC, stream_);
  }

  void matmul_backward_dgelu(void* dpre, void* dweight, void* dbias, const void* dout,
                             const void* inp, const void* weight, const void* pre, int64_t N, int C,
                             int OC) override {
    activate();
    if (st_ != Storage::kF32 && matmul_->backward_dgelu(dpre, dout, weight, pre, N, C, OC)) {
      matmul_->backward(nullptr, dweight, dout, inp, weight, N, C, OC, false);
    } else {
      matmul_->backward(dpre, dweight, dout, inp, weight, N, C, OC, false);
      cuda::gelu_backward(st_, dpre, pre, dpre, N * C, stream_);
    }
    if (dbias != nullptr) {
      float* partial = static_cast<float*>(scratch(bias_backward_scratch_bytes(N, OC)));
      bias_backward(st_, dbias, dout, N, OC, partial, stream_);
    }
  }

  // ---- attention --------------------------------------------------------------------------------
  void attention_forward(void* out, float* lse, const void* qkv, const AttentionShape& s) override {
    check_attention(s);
    activate();
    cuda::attention_forward(st_, out, lse, qkv, dims(s), stream_);
  }

  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionShape& s) override {
    check_attention(s);
    activate();
    const AttentionDims d = dims(s);
    float* D = static_cast<float*>(scratch(attention_backward_scratch_bytes(d)));
    cuda::attention_backward(st_, dqkv, dout, qkv, out, lse, d, D, stream_);
  }

  void attention_kv_cache(void* out, const void* qkv, void* kcache, void* vcache, int pos0,
                          int maxT, const AttentionShape& s) override {
    check_attention(s);
    const int64_t end = static_cast<int64_t>(pos0) + s.T;  // (no braces inside ZD_CHECK)
    ZD_CHECK(pos0 >= 0 && end <= maxT,
             "attention_kv_cache: positions {}..{} do not fit a cache of {} positions", pos0,
             end - 1, maxT);
    ZD_CHECK(s.doc_start == nullptr, "attention_kv_cache: document masking is not supported");
    activate();
    cuda::attention_kv_cache(st_, out, qkv, kcache, vcache, pos0, maxT, dims(s), stream_);
  }

  void attention_block_forward(void* out, float* lse, const void* qkv, const int32_t* qpos,
                               const void* kv, const int32_t* kpos, int Tk, const AttentionShape& s,
                               bool first_block) override {
    check_attention(s);
    ZD_CHECK(Tk >= 0, "attention_block_forward: negative key count Tk={}", Tk);
    ZD_CHECK(s.doc_start == nullptr, "attention_block_forward: document masking is not supported");
    activate();
    cuda::attention_block_forward(st_, out, lse, qkv, qpos, kv, kpos, Tk, dims(s), first_block,
                                  stream_);
  }

  void attention_block_backward(void* dqkv, void* dkv, const void* dout, const void* qkv,
                                const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                                const void* out, const float* lse, const AttentionShape& s,
                                bool accumulate_dkv) override {
    check_attention(s);
    ZD_CHECK(Tk >= 0, "attention_block_backward: negative key count Tk={}", Tk);
    ZD_CHECK(s.doc_start == nullptr, "attention_block_backward: document masking is not supported");
    activate();
    const AttentionDims d = dims(s);
    float* D = static_cast<float*>(scratch(attention_block_backward_scratch_bytes(d)));
    cuda::attention_block_backward(st_, dqkv, dkv, dout, qkv, qpos, kv, kpos, Tk, out, lse, d,
                                   accumulate_dkv, D, stream_);
  }

  // ---- RMSNorm ----------------------------------------------------------------------------------
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int64_t N,
                       int C, float eps) override {
    activate();
    cuda::rmsnorm_forward(st_, out, rstd, inp, weight, N, C, eps, stream_);
  }

  void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                        const void* weight, const float* rstd, int64_t N, int C) override {
    activate();
    float* partial = static_cast<float*>(scratch(rmsnorm_backward_scratch_bytes(N, C)));
    cuda::rmsnorm_backward(st_, dinp, dweight, dout, inp, weight, rstd, N, C, partial, stream_);
  }

  // ---- rotary position embedding ----------------------------------------------------------------
  void rope_forward(void* qkv, const float* cos, const float* sin,
                    const AttentionShape& s) override {
    check_rope(s);
    activate();
    cuda::rope_forward(st_, qkv, cos, sin, s.B, s.T, s.NH, s.KVH, s.HS, stream_, s.doc_start);
  }

  void rope_backward(void* dqkv, const float* cos, const float* sin,
                     const AttentionShape& s) override {
    check_rope(s);
    activate();
    cuda::rope_backward(st_, dqkv, cos, sin, s.B, s.T, s.NH, s.KVH, s.HS, stream_, s.doc_start);
  }

  // ---- SwiGLU -----------------------------------------------------------------------------------
  void swiglu_forward(void* out, const void* gu, int64_t N, int I) override {
    activate();
    cuda::swiglu_forward(st_, out, gu, N, I, stream_);
  }

  void swiglu_backward(void* dgu, const void* dout, const void* gu, int64_t N, int I) override {
    activate();
    cuda::swiglu_backward(st_, dgu, dout, gu, N, I, stream_);
  }

  // ---- elementwise ------------------------------------------------------------------------------
  void gelu_forward(void* out, const void* inp, int64_t n) override {
    activate();
    cuda::gelu_forward(st_, out, inp, n, stream_);
  }

  void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    activate();
    cuda::gelu_backward(st_, dinp, inp, dout, n, stream_);
  }

  void residual_forward(void* out, const void* a, const void* b, int64_t n) override {
    activate();
    cuda::residual_forward(st_, out, a, b, n, stream_);
  }

  // ---- cross-entropy ----------------------------------------------------------------------------
  void crossentropy_forward(float* losses, const void* logits, const int32_t* targets, int64_t N,
                            int V, int Vp) override {
    check_vocab(V, Vp);
    activate();
    cuda::crossentropy_forward(st_, losses, logits, targets, N, V, Vp, stream_);
  }

  void crossentropy_fused(float* losses, void* logits_to_dlogits, const int32_t* targets, int64_t N,
                          int V, int Vp, float dloss) override {
    check_vocab(V, Vp);
    activate();
    cuda::crossentropy_fused(st_, losses, logits_to_dlogits, targets, N, V, Vp, dloss, stream_);
  }

  void crossentropy_shard_stats(float* stats, const void* logits, const int32_t* targets, int64_t N,
                                int real, int Vl, int v0) override {
    check_shard(real, Vl, v0);
    activate();
    cuda::crossentropy_shard_stats(st_, stats, logits, targets, N, real, Vl, v0, stream_);
  }

  void crossentropy_shard_sumexp(float* stats, const void* logits, int64_t N, int real,
                                 int Vl) override {
    check_shard(real, Vl, 0);
    activate();
    cuda::crossentropy_shard_sumexp(st_, stats, logits, N, real, Vl, stream_);
  }

  void crossentropy_shard_finish(float* losses, void* logits_to_dlogits, const int32_t* targets,
                                 const float* stats, int64_t N, int real, int Vl, int v0,
                                 float dloss) override {
    check_shard(real, Vl, v0);
    activate();
    cuda::crossentropy_shard_finish(st_, losses, logits_to_dlogits, targets, stats, N, real, Vl, v0,
                                    dloss, stream_);
  }

  // ---- optimizer --------------------------------------------------------------------------------
  void optimizer_update(float* master, float* m, float* v, const void* grad, void* param_out,
                        int64_t n, const OptimizerParams& p) override {
    if (p.kind != OptimizerKind::kAdam) return other_update(master, m, v, grad, param_out, n, p);
    const cpu::AdamWConstants c = cpu::adamw_constants(p);  // the CPU's constants, bit for bit
    AdamWStep k{};
    k.neg_lr = c.neg_lr;
    k.beta1 = c.beta1;
    k.beta2 = c.beta2;
    k.one_minus_beta1 = c.one_minus_beta1;
    k.one_minus_beta2 = c.one_minus_beta2;
    k.eps = c.eps;
    k.weight_decay = c.weight_decay;
    k.grad_scale = c.grad_scale;
    k.bias_correction1 = c.bias_correction1;
    k.sqrt_bias_correction2 = c.sqrt_bias_correction2;
    k.l2_decay = c.l2_decay;
    k.decoupled_decay = c.decoupled_decay;
    activate();
    cuda::adamw_update(st_, master, m, v, grad, param_out, n, k, stream_);
  }
  // SGD, Adagrad, Lion: the CPU's constants, bit for bit.
  void other_update(float* master, float* m, float* v, const void* grad, void* param_out, int64_t n,
                    const OptimizerParams& p) {
    ZD_CHECK(p.kind != OptimizerKind::kLamb,
             "Lamb has no one-pass step (lamb_moments and lamb_apply, zero/lamb_step.cc)");
    const cpu::OptimConstants c = cpu::optim_constants(p);
    cuda::OptimStep k{};
    switch (p.kind) {
      case OptimizerKind::kSgd:
        k.kind = p.momentum == 0.0 ? cuda::OptimKind::kSgd
                 : p.nesterov      ? cuda::OptimKind::kSgdNesterov
                                   : cuda::OptimKind::kSgdMomentum;
        break;
      case OptimizerKind::kAdagrad:
        k.kind = cuda::OptimKind::kAdagrad;
        break;
      case OptimizerKind::kMuon:
        ZD_THROW("Muon is not an elementwise step (ZeroEngine runs it on the host)");
      default:
        k.kind = cuda::OptimKind::kLion;
        break;
    }
    k.first = c.first;
    k.grad_scale = c.grad_scale;
    k.weight_decay = c.weight_decay;
    k.neg_lr = c.neg_lr;
    k.momentum = c.momentum;
    k.one_minus_dampening = c.one_minus_dampening;
    k.neg_clr = c.neg_clr;
    k.eps = c.eps;
    k.initial_value = c.initial_value;
    k.decay = c.decay;
    k.beta1 = c.beta1;
    k.one_minus_beta1 = c.one_minus_beta1;
    k.beta2 = c.beta2;
    k.one_minus_beta2 = c.one_minus_beta2;
    activate();
    cuda::optim_update(st_, master, m, v, grad, param_out, n, k, stream_);
  }

  // Lamb: the CPU's constants, bit for bit; the two sums come back to the host (one sync).
  static cuda::LambStep lamb_step_of(const OptimizerParams& p) {
    const cpu::LambConstants c = cpu::lamb_constants(p);
    return {c.grad_scale, c.beta1,        c.one_minus_beta1, c.beta2,          c.one_minus_beta2,
            c.eps,        c.weight_decay, c.step_size,       c.eps_inside_sqrt};
  }
  LambSums lamb_moments(float* master, float* m, float* v, const void* grad, int64_t n,
                        const OptimizerParams& p) override {
    if (n <= 0) return {};
    activate();
    auto* partial = static_cast<double*>(scratch(2 * cuda::kLambMaxBlocks * sizeof(double)));
    const int k = cuda::lamb_moments(st_, master, m, v, grad, n, lamb_step_of(p), partial, stream_);
    std::vector<double> host(2 * static_cast<size_t>(k));
    check(cudaMemcpyAsync(host.data(), partial, host.size() * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_),
          "lamb_moments: cudaMemcpyAsync");
    synchronize();
    LambSums s;
    for (int b = 0; b < k; ++b) {
      s.w2 += host[2 * static_cast<size_t>(b)];
      s.u2 += host[2 * static_cast<size_t>(b) + 1];
    }
    return s;
  }
  void lamb_apply(float* master, const float* m, const float* v, void* param_out, int64_t n,
                  const OptimizerParams& p, float coeff) override {
    activate();
    cuda::lamb_apply(st_, master, m, v, param_out, n, lamb_step_of(p), coeff, stream_);
  }

  // (One piece: its partials added in order, the same bits as before the pieces call existed.)
  double sum_squares(const void* x, int64_t n) override {
    if (n <= 0) return 0.0;
    return sum_squares_pieces({{x, n}});
  }

  // Every piece's partial sums to its own slice of the scratch, one copy back, one wait; each
  // piece's partials are added in order, then the pieces' totals in order.
  double sum_squares_pieces(const std::vector<std::pair<const void*, int64_t>>& pieces) override {
    if (pieces.empty()) return 0.0;
    activate();
    auto* partial =
        static_cast<double*>(scratch(pieces.size() * kSumSquaresMaxBlocks * sizeof(double)));
    std::vector<int> counts(pieces.size(), 0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].second <= 0) continue;
      counts[i] = sum_squares_partials(st_, partial + i * kSumSquaresMaxBlocks, pieces[i].first,
                                       pieces[i].second, stream_);
    }
    std::vector<double> host(pieces.size() * kSumSquaresMaxBlocks);
    check(cudaMemcpyAsync(host.data(), partial, host.size() * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_),
          "sum_squares_pieces: cudaMemcpyAsync");
    synchronize();
    double total = 0.0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      double piece = 0.0;
      for (int j = 0; j < counts[i]; ++j) piece += host[i * kSumSquaresMaxBlocks + j];
      total += piece;
    }
    return total;
  }

  void scale(void* x, float s, int64_t n) override {
    activate();
    cuda::scale(st_, x, s, n, stream_);
  }

 private:
  // Makes this backend's device current for the calling thread (cheap when it already is).
  void activate() { check(cudaSetDevice(device_), "cudaSetDevice"); }

  // A cudaMalloc of `bytes` for `what` failed: the user-facing error (core/device_oom.h, exit 2)
  // with the device's free and total memory. A status other than out-of-memory is a CUDA error.
  [[noreturn]] void out_of_memory(size_t bytes, const std::string& what, int64_t held,
                                  cudaError_t status) {
    if (status != cudaErrorMemoryAllocation) {
      ZD_THROW("cudaMalloc of {} bytes for {} on device {}: CUDA error {}: {}", bytes, what,
               device_, cudaGetErrorName(status), cudaGetErrorString(status));
    }
    size_t free_bytes = 0, total_bytes = 0;
    const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    if (!known) cudaGetLastError();
    throw_device_oom(device_, bytes, what, known ? static_cast<int64_t>(free_bytes) : -1,
                     known ? static_cast<int64_t>(total_bytes) : -1, held,
                     cudaGetErrorString(status));
  }

  // Device scratch of at least `bytes`, owned by the backend and reused by every op (all ops are
  // ordered on one stream). Growing it waits for the stream (cudaFree synchronizes).
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      const size_t grown = align_up(std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2));
      synchronize();
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      const cudaError_t status = cudaMalloc(&scratch_, grown);
      if (status != cudaSuccess) {
        cudaGetLastError();
        out_of_memory(grown, "kernel scratch", -1, status);
      }
      scratch_bytes_ = grown;
    }
    return scratch_;
  }

  // out (n) = convert(in (n)) on the device, either side host memory or device memory: a host
  // side goes through device scratch, kStageElems at a time, and is done when this returns
  // (the scratch is reused by the next piece). convert(out, in, len) queues a kernel on stream_.
  template <class In, class Out, class Convert>
  void staged_convert(Out* out, const In* in, int64_t n, const char* what, Convert convert) {
    activate();
    const bool in_dev = on_device(in, device_), out_dev = on_device(out, device_);
    const std::string copy_in = std::string(what) + ": cudaMemcpyAsync in";
    const std::string copy_out = std::string(what) + ": cudaMemcpyAsync out";
    for (int64_t i0 = 0; i0 < n; i0 += kStageElems) {
      const int64_t len = std::min(kStageElems, n - i0);
      const size_t in_bytes = static_cast<size_t>(len) * sizeof(In);
      const size_t out_bytes = static_cast<size_t>(len) * sizeof(Out);
      // The scratch: [staged input (aligned) | staged output], each only when needed.
      const size_t in_stage = in_dev ? 0 : align_up(in_bytes);
      char* base = static_cast<char*>(scratch(in_stage + (out_dev ? 0 : out_bytes)));
      const In* src = in + i0;
      Out* dst = out + i0;
      if (!in_dev) {
        check(cudaMemcpyAsync(base, src, in_bytes, cudaMemcpyDefault, stream_), copy_in.c_str());
        src = reinterpret_cast<const In*>(base);
      }
      Out* staged_out = reinterpret_cast<Out*>(base + in_stage);
      convert(out_dev ? dst : staged_out, src, len);
      if (!out_dev) {
        check(cudaMemcpyAsync(dst, staged_out, out_bytes, cudaMemcpyDefault, stream_),
              copy_out.c_str());
      }
      if (!in_dev || !out_dev) synchronize();
    }
  }

  static AttentionDims dims(const AttentionShape& s) {
    AttentionDims d;
    d.B = s.B;
    d.T = s.T;
    d.NH = s.NH;
    d.KVH = s.KVH;
    d.HS = s.HS;
    d.window = s.window;
    d.doc_start = s.doc_start;
    return d;
  }

  static void check_attention(const AttentionShape& s) {
    ZD_CHECK(s.B >= 0 && s.T >= 0, "attention: negative shape B={} T={}", s.B, s.T);
    ZD_CHECK(s.NH > 0 && s.KVH > 0 && s.NH % s.KVH == 0,
             "attention: query heads NH={} must be a positive multiple of key/value heads KVH={}",
             s.NH, s.KVH);
    ZD_CHECK(s.HS >= 1 && s.HS <= kAttentionMaxHeadSize,
             "CUDA attention supports head sizes 1..{}, got {}", kAttentionMaxHeadSize, s.HS);
    ZD_CHECK(s.window >= 0, "attention: negative window {}", s.window);
  }

  static void check_rope(const AttentionShape& s) {
    ZD_CHECK(s.B >= 0 && s.T >= 0 && s.NH >= 0 && s.KVH >= 0,
             "rope: negative shape B={} T={} NH={} KVH={}", s.B, s.T, s.NH, s.KVH);
    ZD_CHECK(s.HS > 0 && s.HS % 2 == 0, "rope needs an even head size, got HS={}", s.HS);
  }

  static void check_vocab(int V, int Vp) {
    ZD_CHECK(V > 0 && V <= Vp, "cross-entropy vocabulary V={} must be in [1, Vp={}]", V, Vp);
  }
  // The shape checks of the CPU's vocabulary-parallel cross-entropy (the targets stay on the
  // device: one in the padding gives NaN, see kernels/cuda/crossentropy.h).
  static void check_shard(int real, int Vl, int v0) {
    ZD_CHECK(Vl > 0 && real >= 0 && real <= Vl && v0 >= 0,
             "cross-entropy shard: real={} must be in [0, Vl={}], v0={} >= 0", real, Vl, v0);
  }

  DType dtype_;
  Storage st_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(DType compute_dtype, int device) {
  return std::make_unique<cuda::CudaBackend>(compute_dtype, device);
}

}  // namespace zerod
