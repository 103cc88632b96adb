#include "model/gpt.h"

#include "core/error.h"
#include "core/timer.h"

namespace zerod {

double OpTimes::total() const {
  return encoder + layernorm + matmul_fwd + matmul_bwd + attention_fwd + attention_bwd + gelu +
         residual + classifier + rounding;
}

namespace {
// Decorators that add the time spent in the ZeRO seams to a counter (timing only).
class TimedParams : public ParamSource {
 public:
  TimedParams(ParamSource& inner, double& seconds) : inner_(inner), seconds_(seconds) {}
  const void* acquire(int u) override {
    Stopwatch sw;
    const void* p = inner_.acquire(u);
    seconds_ += sw.seconds();
    return p;
  }
  void release(int u) override {
    Stopwatch sw;
    inner_.release(u);
    seconds_ += sw.seconds();
  }
  void prefetch(int u) override {
    Stopwatch sw;
    inner_.prefetch(u);
    seconds_ += sw.seconds();
  }

 private:
  ParamSource& inner_;
  double& seconds_;
};

class TimedGrads : public GradSink {
 public:
  TimedGrads(GradSink& inner, double& seconds) : inner_(inner), seconds_(seconds) {}
  void* grad_buffer(int u) override {
    Stopwatch sw;
    void* p = inner_.grad_buffer(u);
    seconds_ += sw.seconds();
    return p;
  }
  void unit_done(int u) override {
    Stopwatch sw;
    inner_.unit_done(u);
    seconds_ += sw.seconds();
  }

 private:
  GradSink& inner_;
  double& seconds_;
};

// Runs f, adding its wall time to *slot when timing is on (be not null). The backend is
// synchronized around f, so asynchronous (GPU) work is charged to the op that queued it.
template <class F>
void timed(Backend* be, double& slot, F&& f) {
  if (be == nullptr) {
    f();
    return;
  }
  be->synchronize();
  Stopwatch sw;
  f();
  be->synchronize();
  slot += sw.seconds();
}

const char* at(const void* base, int64_t elems, size_t esz) {
  return static_cast<const char*>(base) + elems * static_cast<int64_t>(esz);
}
char* at(void* base, int64_t elems, size_t esz) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esz);
}
}  // namespace

Gpt::Gpt(const GptSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
         MemoryTracker* tracker)
    : layout_(spec),
      be_(backend),
      B_(B),
      T_(T),
      checkpointing_(activation_checkpointing),
      rounding_(backend.compute_dtype() != DType::kF32 &&
                backend.compute_elem_size() == sizeof(float)),
      esz_(backend.compute_elem_size()),
      tracker_(tracker) {
  const GptSpec& s = layout_.spec();
  ZD_CHECK(B > 0 && T > 0 && T <= s.seq_len, "micro-batch {}x{} (seq_len {})", B, T, s.seq_len);
  ZD_CHECK(s.n_embd % s.n_head == 0, "n_embd {} % n_head {}", s.n_embd, s.n_head);
  const size_t BT = static_cast<size_t>(B) * T, C = s.n_embd, NH = s.n_head;
  // One allocation per buffer keeps each 64-byte aligned and visible in the memory report.
  auto make_block = [&]() {
    BlockActs a{};
    a.ln1 = act(BT * C);
    a.ln1_mean = stat(BT);
    a.ln1_rstd = stat(BT);
    a.qkv = act(BT * 3 * C);
    a.atty = act(BT * C);
    a.lse = stat(BT * NH);
    a.res2 = act(BT * C);
    a.ln2 = act(BT * C);
    a.ln2_mean = stat(BT);
    a.ln2_rstd = stat(BT);
    a.fch = act(BT * 4 * C);
    a.fch_gelu = act(BT * 4 * C);
    return a;
  };
  if (checkpointing_) {
    work_ = make_block();
  } else {
    for (int l = 0; l < s.n_layer; ++l) blocks_.push_back(make_block());
  }
  for (int l = 0; l <= s.n_layer; ++l) res_.push_back(act(BT * C));
  proj_tmp_ = act(BT * C);
  lnf_ = act(BT * C);
  lnf_mean_ = stat(BT);
  lnf_rstd_ = stat(BT);
  logits_ = act(BT * static_cast<size_t>(s.vp()));
  losses_ = stat(BT);
  tokens_ = reinterpret_cast<int32_t*>(stat(BT));  // (4-byte elements, as floats)
  targets_ = reinterpret_cast<int32_t*>(stat(BT));
  host_losses_.resize(BT);
  dres_ = act(BT * C);
  d_a_ = act(BT * 4 * C);
  d_b_ = act(BT * 3 * C);
  d_c_ = act(BT * C);
}

int64_t Gpt::activation_bytes(const GptSpec& s, int B, int T, bool activation_checkpointing,
                              size_t esz) {
  // Mirrors the constructor: per block ln1, qkv (3C), atty, res2, ln2, fch (4C), fch_gelu (4C)
  // and the statistics ln1/ln2 mean and rstd and lse (NH); then the residual stream (L + 1),
  // proj_tmp, lnf, logits (Vp), dres, d_a (4C), d_b (3C), d_c and lnf mean/rstd, losses and
  // the tokens and targets.
  const int64_t BT = int64_t{B} * T, C = s.n_embd, NH = s.n_head, L = s.n_layer;
  const int64_t e = static_cast<int64_t>(esz);
  const int64_t block = BT * (15 * C * e + (4 + NH) * 4);
  const int64_t blocks = activation_checkpointing ? 1 : L;
  return blocks * block + BT * (((L + 1) * C + 11 * C + s.vp()) * e + 5 * 4);
}

void* Gpt::act(size_t elems) {
  buffers_.push_back(be_.allocate(elems * esz_, MemCategory::kActivations, tracker_));
  return buffers_.back().data();
}

float* Gpt::stat(size_t elems) {
  buffers_.push_back(be_.allocate(elems * sizeof(float), MemCategory::kActivations, tracker_));
  return buffers_.back().as<float>();
}

void Gpt::round(void* x, int64_t n) {
  if (rounding_) timed(timer(), times_.rounding, [&] { be_.round_to_compute(x, n); });
}

void Gpt::encoder(const int32_t* inputs, ParamSource& params) {
  const GptSpec& s = spec();
  const void* w = params.acquire(layout_.embedding_unit());
  timed(timer(), times_.encoder, [&] {
    be_.encoder_forward(res_[0], inputs, w, at(w, layout_.wpe_offset(), esz_), B_, T_, s.n_embd);
  });
  params.release(layout_.embedding_unit());
  round(res_[0], int64_t{B_} * T_ * s.n_embd);
}

void Gpt::block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out) {
  const GptSpec& s = spec();
  const int C = s.n_embd, NH = s.n_head;
  const int64_t N = int64_t{B_} * T_;
  const auto& o = layout_.block();
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, res_in, at(w, o.ln1_w, esz_),
                          at(w, o.ln1_b, esz_), N, C);
  });
  round(a.ln1, N * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.qkv, a.ln1, at(w, o.qkv_w, esz_), at(w, o.qkv_b, esz_), N, C, 3 * C);
  });
  round(a.qkv, N * 3 * C);
  timed(timer(), times_.attention_fwd,
        [&] { be_.attention_forward(a.atty, a.lse, a.qkv, B_, T_, C, NH); });
  round(a.atty, N * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.atty, at(w, o.attproj_w, esz_), at(w, o.attproj_b, esz_), N, C,
                       C);
  });
  round(proj_tmp_, N * C);
  // res2 = res_in + proj (stored rounded), ln2 = layernorm(res2): one fused op.
  timed(timer(), times_.layernorm, [&] {
    be_.residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, res_in, proj_tmp_,
                                   at(w, o.ln2_w, esz_), at(w, o.ln2_b, esz_), N, C);
  });
  round(a.ln2, N * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.fch, a.ln2, at(w, o.fc_w, esz_), at(w, o.fc_b, esz_), N, C, 4 * C);
  });
  round(a.fch, N * 4 * C);
  timed(timer(), times_.gelu, [&] { be_.gelu_forward(a.fch_gelu, a.fch, N * 4 * C); });
  round(a.fch_gelu, N * 4 * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.fch_gelu, at(w, o.fcproj_w, esz_), at(w, o.fcproj_b, esz_), N,
                       4 * C, C);
  });
  round(proj_tmp_, N * C);
  timed(timer(), times_.residual, [&] { be_.residual_forward(res_out, a.res2, proj_tmp_, N * C); });
  round(res_out, N * C);
  (void)l;
}

// dres_ holds d(block output) on entry and d(block input) on exit. dw: the unit's gradients (+=).
void Gpt::block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a) {
  const GptSpec& s = spec();
  const int C = s.n_embd, NH = s.n_head;
  const int64_t N = int64_t{B_} * T_;
  const auto& o = layout_.block();
  // MLP: res_out = res2 + fcproj(gelu(fc(ln2(res2))))
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_a_, at(dw, o.fcproj_w, esz_), at(dw, o.fcproj_b, esz_), dres_, a.fch_gelu,
                        at(w, o.fcproj_w, esz_), N, 4 * C, C, false);
  });
  round(d_a_, N * 4 * C);
  timed(timer(), times_.gelu, [&] { be_.gelu_backward(d_a_, a.fch, d_a_, N * 4 * C); });
  round(d_a_, N * 4 * C);
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, at(dw, o.fc_w, esz_), at(dw, o.fc_b, esz_), d_a_, a.ln2,
                        at(w, o.fc_w, esz_), N, C, 4 * C, false);
  });
  round(d_c_, N * C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, at(dw, o.ln2_w, esz_), at(dw, o.ln2_b, esz_), d_c_, a.res2,
                           at(w, o.ln2_w, esz_), a.ln2_mean, a.ln2_rstd, N, C);
  });
  round(dres_, N * C);
  // Attention: res2 = res_in + attproj(attention(qkv(ln1(res_in))))
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, at(dw, o.attproj_w, esz_), at(dw, o.attproj_b, esz_), dres_, a.atty,
                        at(w, o.attproj_w, esz_), N, C, C, false);
  });
  round(d_c_, N * C);
  timed(timer(), times_.attention_bwd,
        [&] { be_.attention_backward(d_b_, d_c_, a.qkv, a.atty, a.lse, B_, T_, C, NH); });
  round(d_b_, N * 3 * C);
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, at(dw, o.qkv_w, esz_), at(dw, o.qkv_b, esz_), d_b_, a.ln1,
                        at(w, o.qkv_w, esz_), N, C, 3 * C, false);
  });
  round(d_c_, N * C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, at(dw, o.ln1_w, esz_), at(dw, o.ln1_b, esz_), d_c_, res_in,
                           at(w, o.ln1_w, esz_), a.ln1_mean, a.ln1_rstd, N, C);
  });
  round(dres_, N * C);
  (void)l;
}

const void* Gpt::forward_to_logits(const int32_t* inputs, ParamSource& params,
                                   const void** wte_unit) {
  const GptSpec& s = spec();
  const int C = s.n_embd, Vp = s.vp();
  const int64_t N = int64_t{B_} * T_;
  encoder(inputs, params);
  for (int l = 0; l < s.n_layer; ++l) {
    const int u = layout_.block_unit(l);
    if (l + 1 < s.n_layer) params.prefetch(u + 1);
    const void* w = params.acquire(u);
    block_forward(l, w, res_[static_cast<size_t>(l)], acts_for(l),
                  res_[static_cast<size_t>(l) + 1]);
    params.release(u);
  }
  const void* wf = params.acquire(layout_.final_unit());
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, res_[static_cast<size_t>(s.n_layer)],
                          at(wf, layout_.lnf_w_offset(), esz_),
                          at(wf, layout_.lnf_b_offset(), esz_), N, C);
  });
  round(lnf_, N * C);
  const void* we = params.acquire(layout_.embedding_unit());
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(logits_, lnf_, at(we, layout_.wte_offset(), esz_), nullptr, N, C, Vp);
  });
  round(logits_, N * Vp);
  *wte_unit = we;
  return wf;
}

void Gpt::upload(const int32_t* inputs, const int32_t* targets) {
  const size_t bytes = static_cast<size_t>(B_) * T_ * sizeof(int32_t);
  be_.copy(tokens_, inputs, bytes);
  be_.copy(targets_, targets, bytes);
}

float Gpt::mean_loss(const int32_t* targets) {
  const int64_t N = int64_t{B_} * T_;
  be_.copy(host_losses_.data(), losses_, static_cast<size_t>(N) * sizeof(float));
  double sum = 0;
  int n = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += host_losses_[static_cast<size_t>(i)];
    ++n;
  }
  return n > 0 ? static_cast<float>(sum / n) : 0.0f;
}

float Gpt::forward(const int32_t* inputs, const int32_t* targets, ParamSource& params) {
  const GptSpec& s = spec();
  const int64_t N = int64_t{B_} * T_;
  const void* wte_unit = nullptr;
  upload(inputs, targets);
  forward_to_logits(tokens_, params, &wte_unit);
  timed(timer(), times_.classifier,
        [&] { be_.crossentropy_forward(losses_, logits_, targets_, N, s.vocab_size, s.vp()); });
  params.release(layout_.embedding_unit());
  params.release(layout_.final_unit());
  return mean_loss(targets);
}

float Gpt::forward_backward(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                            GradSink& grads, float loss_weight) {
  if (!timing_) return forward_backward_impl(inputs, targets, params, grads, loss_weight);
  double seam = 0;
  TimedParams timed_params(params, seam);
  TimedGrads timed_grads(grads, seam);
  Stopwatch sw;
  phase_seam_ = &seam;
  phase_clock_ = &sw;
  forward_seam_ = forward_wall_ = -1;
  const float loss = forward_backward_impl(inputs, targets, timed_params, timed_grads, loss_weight);
  const double wall = sw.seconds();
  times_.forward += forward_wall_ - forward_seam_;
  times_.backward += (wall - forward_wall_) - (seam - forward_seam_);
  times_.zero_wait += seam;
  phase_seam_ = nullptr;
  phase_clock_ = nullptr;
  return loss;
}

float Gpt::forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                                 GradSink& grads, float loss_weight) {
  const GptSpec& s = spec();
  const int C = s.n_embd, Vp = s.vp();
  const int64_t N = int64_t{B_} * T_;
  const void* we = nullptr;
  upload(inputs, targets);
  const void* wf = forward_to_logits(tokens_, params, &we);

  // Loss and dlogits (in place). Every position with a target weighs 1/valid in the mean.
  int valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += targets[i] >= 0;
  const float dloss = valid > 0 ? loss_weight / static_cast<float>(valid) : 0.0f;
  timed(timer(), times_.classifier,
        [&] { be_.crossentropy_fused(losses_, logits_, targets_, N, s.vocab_size, Vp, dloss); });
  round(logits_, N * Vp);
  if (phase_clock_ != nullptr) {  // the forward phase ends with the loss
    be_.synchronize();
    forward_wall_ = phase_clock_->seconds();
    forward_seam_ = *phase_seam_;
  }

  // Head: logits = lnf @ wte^T (tied), then the final LayerNorm.
  void* dwe = grads.grad_buffer(layout_.embedding_unit());
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, at(dwe, layout_.wte_offset(), esz_), nullptr, logits_, lnf_,
                        at(we, layout_.wte_offset(), esz_), N, C, Vp, false);
  });
  params.release(layout_.embedding_unit());
  round(d_c_, N * C);
  void* dwf = grads.grad_buffer(layout_.final_unit());
  be_.memset_zero(dres_, static_cast<size_t>(N * C) * esz_);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, at(dwf, layout_.lnf_w_offset(), esz_),
                           at(dwf, layout_.lnf_b_offset(), esz_), d_c_,
                           res_[static_cast<size_t>(s.n_layer)],
                           at(wf, layout_.lnf_w_offset(), esz_), lnf_mean_, lnf_rstd_, N, C);
  });
  params.release(layout_.final_unit());
  round(dres_, N * C);
  round(dwf, layout_.unit(layout_.final_unit()).numel);
  grads.unit_done(layout_.final_unit());

  for (int l = s.n_layer - 1; l >= 0; --l) {
    const int u = layout_.block_unit(l);
    if (l > 0) params.prefetch(u - 1);
    const void* w = params.acquire(u);
    const void* res_in = res_[static_cast<size_t>(l)];
    if (checkpointing_) block_forward(l, w, res_in, work_, proj_tmp_);  // recompute (output unused)
    void* dw = grads.grad_buffer(u);
    block_backward(l, w, dw, res_in, acts_for(l));
    params.release(u);
    round(dw, layout_.unit(u).numel);
    grads.unit_done(u);
  }

  timed(timer(), times_.encoder, [&] {
    be_.encoder_backward(at(dwe, layout_.wte_offset(), esz_), at(dwe, layout_.wpe_offset(), esz_),
                         dres_, tokens_, B_, T_, C);
  });
  round(dwe, layout_.unit(layout_.embedding_unit()).numel);
  grads.unit_done(layout_.embedding_unit());
  // The losses are read back last: a GPU has the whole backward queued by then.
  return mean_loss(targets);
}

}  // namespace zerod
