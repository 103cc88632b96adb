// A test backend that behaves like a GPU's as far as host code can tell: it computes with the CPU
// reference kernels, but the memory allocate() returns is page-protected (PROT_NONE) except while
// one of its own ops runs. Host code that reads or writes "device" memory directly, instead of
// through copy() and the casts, crashes the test with SIGSEGV. device_memory() is true, so the
// ZeRO engine, the model and the checkpointer take their GPU paths (host staging, host-side
// CPU Adam for offloaded states, the self communicator's copies through the backend).
//
// Results equal the plain CPU backend's bit for bit: the same kernels run on the same values.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "kernels/backend.h"

namespace zerod::test {

class StrictDeviceBackend final : public Backend {
 public:
  explicit StrictDeviceBackend(DType dtype) : cpu_(make_cpu_backend(dtype)) {}

  const char* name() const override { return "strict-device"; }
  DType compute_dtype() const override { return cpu_->compute_dtype(); }
  size_t compute_elem_size() const override { return cpu_->compute_elem_size(); }
  bool device_memory() const override { return true; }

  Buffer allocate(size_t bytes, MemCategory category, MemoryTracker* tracker) override {
    if (bytes == 0) return Buffer(nullptr, 0, nullptr, category, tracker);
    const size_t mapped = round_pages(bytes);
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ZD_CHECK(p != MAP_FAILED, "mmap {} bytes", mapped);
    ZD_CHECK(mprotect(p, mapped, PROT_NONE) == 0, "mprotect");
    std::lock_guard<std::mutex> lock(regions_mu());
    regions()[p] = Region{mapped, this};
    return Buffer(p, bytes, release, category, tracker);
  }
  void memset_zero(void* p, size_t bytes) override {
    Open open(this);
    cpu_->memset_zero(p, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    Open open(this);
    ++copies_;
    std::memmove(dst, src, bytes);
  }
  void copy_2d(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows,
               int64_t cols) override {
    run([&] { cpu_->copy_2d(dst, dst_ld, src, src_ld, rows, cols); });
  }

  void round_to_compute(void* x, int64_t n) override {
    run([&] { cpu_->round_to_compute(x, n); });
  }
  void cast_to_compute(void* out, const float* in, int64_t n) override {
    run([&] { cpu_->cast_to_compute(out, in, n); });
  }
  void cast_from_compute(float* out, const void* in, int64_t n) override {
    run([&] { cpu_->cast_from_compute(out, in, n); });
  }
  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                       int T, int C, const int32_t* doc_start) override {
    run([&] { cpu_->encoder_forward(out, tokens, wte, wpe, B, T, C, doc_start); });
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B,
                        int T, int C, const int32_t* doc_start) override {
    run([&] { cpu_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C, doc_start); });
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int64_t N, int C) override {
    run([&] { cpu_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                  const void* b, const void* weight, const void* bias, int64_t N,
                                  int C) override {
    run([&] { cpu_->residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, N, C); });
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int64_t N,
                          int C) override {
    run([&] {
      cpu_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    });
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                      int C, int OC) override {
    run([&] { cpu_->matmul_forward(out, inp, weight, bias, N, C, OC); });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int64_t N, int C, int OC,
                       bool accumulate_dinp) override {
    run([&] {
      cpu_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, accumulate_dinp);
    });
  }
  void attention_forward(void* out, float* lse, const void* qkv, const AttentionShape& s) override {
    run([&] { cpu_->attention_forward(out, lse, qkv, s); });
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionShape& s) override {
    run([&] { cpu_->attention_backward(dqkv, dout, qkv, out, lse, s); });
  }
  void attention_kv_cache(void* out, const void* qkv, void* kcache, void* vcache, int pos0,
                          int maxT, const AttentionShape& s) override {
    run([&] { cpu_->attention_kv_cache(out, qkv, kcache, vcache, pos0, maxT, s); });
  }
  void attention_block_forward(void* out, float* lse, const void* qkv, const int32_t* qpos,
                               const void* kv, const int32_t* kpos, int Tk, const AttentionShape& s,
                               bool first_block) override {
    run([&] { cpu_->attention_block_forward(out, lse, qkv, qpos, kv, kpos, Tk, s, first_block); });
  }
  void attention_block_backward(void* dqkv, void* dkv, const void* dout, const void* qkv,
                                const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                                const void* out, const float* lse, const AttentionShape& s,
                                bool accumulate_dkv) override {
    run([&] {
      cpu_->attention_block_backward(dqkv, dkv, dout, qkv, qpos, kv, kpos, Tk, out, lse, s,
                                     accumulate_dkv);
    });
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int64_t N,
                       int C, float eps) override {
    run([&] { cpu_->rmsnorm_forward(out, rstd, inp, weight, N, C, eps); });
  }
  void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                        const void* weight, const float* rstd, int64_t N, int C) override {
    run([&] { cpu_->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); });
  }
  void rope_forward(void* qkv, const float* cos, const float* sin,
                    const AttentionShape& s) override {
    run([&] { cpu_->rope_forward(qkv, cos, sin, s); });
  }
  void rope_backward(void* dqkv, const float* cos, const float* sin,
                     const AttentionShape& s) override {
    run([&] { cpu_->rope_backward(dqkv, cos, sin, s); });
  }
  void swiglu_forward(void* out, const void* gu, int64_t N, int I) override {
    run([&] { cpu_->swiglu_forward(out, gu, N, I); });
  }
  void swiglu_backward(void* dgu, const void* dout, const void* gu, int64_t N, int I) override {
    run([&] { cpu_->swiglu_backward(dgu, dout, gu, N, I); });
  }
  void gelu_forward(void* out, const void* inp, int64_t n) override {
    run([&] { cpu_->gelu_forward(out, inp, n); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    run([&] { cpu_->gelu_backward(dinp, inp, dout, n); });
  }
  void residual_forward(void* out, const void* a, const void* b, int64_t n) override {
    run([&] { cpu_->residual_forward(out, a, b, n); });
  }
  void crossentropy_forward(float* losses, const void* logits, const int32_t* targets, int64_t N,
                            int V, int Vp) override {
    run([&] { cpu_->crossentropy_forward(losses, logits, targets, N, V, Vp); });
  }
  void crossentropy_fused(float* losses, void* logits, const int32_t* targets, int64_t N, int V,
                          int Vp, float dloss) override {
    run([&] { cpu_->crossentropy_fused(losses, logits, targets, N, V, Vp, dloss); });
  }
  void crossentropy_shard_stats(float* stats, const void* logits, const int32_t* targets, int64_t N,
                                int real, int Vl, int v0) override {
    run([&] { cpu_->crossentropy_shard_stats(stats, logits, targets, N, real, Vl, v0); });
  }
  void crossentropy_shard_sumexp(float* stats, const void* logits, int64_t N, int real,
                                 int Vl) override {
    run([&] { cpu_->crossentropy_shard_sumexp(stats, logits, N, real, Vl); });
  }
  void crossentropy_shard_finish(float* losses, void* logits, const int32_t* targets,
                                 const float* stats, int64_t N, int real, int Vl, int v0,
                                 float dloss) override {
    run([&] {
      cpu_->crossentropy_shard_finish(losses, logits, targets, stats, N, real, Vl, v0, dloss);
    });
  }
  void optimizer_update(float* master, float* m, float* v, const void* grad, void* param_out,
                        int64_t n, const OptimizerParams& p) override {
    ++device_adam_;
    run([&] { cpu_->optimizer_update(master, m, v, grad, param_out, n, p); });
  }
  LambSums lamb_moments(float* master, float* m, float* v, const void* grad, int64_t n,
                        const OptimizerParams& p) override {
    ++device_adam_;
    LambSums r;
    run([&] { r = cpu_->lamb_moments(master, m, v, grad, n, p); });
    return r;
  }
  void lamb_apply(float* master, const float* m, const float* v, void* param_out, int64_t n,
                  const OptimizerParams& p, float coeff) override {
    run([&] { cpu_->lamb_apply(master, m, v, param_out, n, p, coeff); });
  }
  double sum_squares(const void* x, int64_t n) override {
    double r = 0;
    run([&] { r = cpu_->sum_squares(x, n); });
    return r;
  }
  void scale(void* x, float s, int64_t n) override {
    run([&] { cpu_->scale(x, s, n); });
  }

  void register_host(void* p, size_t bytes) override {
    ZD_CHECK(p != nullptr && bytes > 0, "register_host({}, {})", p, bytes);
    ZD_CHECK(registered_.emplace(p, bytes).second, "{} registered twice", p);
    ++registrations_;
  }
  void unregister_host(void* p) override {
    ZD_CHECK(registered_.erase(p) == 1, "{} unregistered but not registered", p);
  }

  int64_t copies() const { return copies_; }                // copy() calls
  int64_t registrations() const { return registrations_; }  // register_host() calls
  size_t registered_now() const { return registered_.size(); }
  int64_t device_adam() const { return device_adam_; }  // optimizer_update() calls (device states)

  // Bytes of "device" memory currently mapped (all instances).
  static size_t mapped_bytes() {
    std::lock_guard<std::mutex> lock(regions_mu());
    size_t total = 0;
    for (const auto& [p, r] : regions()) total += r.bytes;
    return total;
  }

 private:
  // While alive, every device region is readable and writable (nesting allowed).
  // Opens this backend's memory (each instance is one rank's device: its regions only, so a
  // rank's op never opens another rank's memory to that rank's host code) while an op runs.
  class Open {
   public:
    explicit Open(const StrictDeviceBackend* owner) : owner_(owner) {
      set(PROT_READ | PROT_WRITE, +1);
    }
    ~Open() { set(PROT_NONE, -1); }

   private:
    void set(int prot, int delta) {
      std::lock_guard<std::mutex> lock(regions_mu());
      int& depth = open_depth()[owner_];
      const bool change = delta > 0 ? depth++ == 0 : --depth == 0;
      if (!change) return;
      for (const auto& [p, r] : regions())
        if (r.owner == owner_) mprotect(p, r.bytes, prot);
    }
    const StrictDeviceBackend* owner_;
  };
  template <class F>
  void run(F&& f) {
    Open open(this);
    f();
  }
  static size_t round_pages(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }
  static void release(void* p, size_t) {
    std::lock_guard<std::mutex> lock(regions_mu());
    auto it = regions().find(p);
    if (it == regions().end()) return;
    munmap(p, it->second.bytes);
    regions().erase(it);
  }
  struct Region {
    size_t bytes;
    const StrictDeviceBackend* owner;
  };
  static std::map<void*, Region>& regions() {
    static std::map<void*, Region> r;
    return r;
  }
  static std::mutex& regions_mu() {
    static std::mutex m;
    return m;
  }
  static std::map<const StrictDeviceBackend*, int>& open_depth() {
    static std::map<const StrictDeviceBackend*, int> d;
    return d;
  }

  std::unique_ptr<Backend> cpu_;
  int64_t copies_ = 0, device_adam_ = 0, registrations_ = 0;
  std::map<void*, size_t> registered_;
};

}  // namespace zerod::test
