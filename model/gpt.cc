#include "model/gpt.h"

#include "core/error.h"
#include "core/timer.h"
#include "model/op_timing.h"

namespace zerod {

Gpt::Gpt(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
         MemoryTracker* tracker, TensorShard shard)
    : ModelBase(spec, backend, B, T, activation_checkpointing, tracker, shard) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK(s.n_embd % s.n_head == 0, "n_embd {} % n_head {}", s.n_embd, s.n_head);
  const LocalDims& d = layout_.local();
  const size_t BT = static_cast<size_t>(B) * T, C = s.n_embd, NH = d.n_head, A = d.q_dim, F = d.ffn;
  // One allocation per buffer keeps each 64-byte aligned and visible in the memory report.
  auto make_block = [&]() {
    BlockActs a{};
    a.ln1 = act(BT * C);
    a.ln1_mean = stat(BT);
    a.ln1_rstd = stat(BT);
    a.qkv = act(BT * 3 * A);
    a.atty = act(BT * A);
    a.lse = stat(BT * NH);
    a.res2 = act(BT * C);
    a.ln2 = act(BT * C);
    a.ln2_mean = stat(BT);
    a.ln2_rstd = stat(BT);
    a.fch = act(BT * F);
    a.fch_gelu = act(BT * F);
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
  dres_ = act(BT * C);
  d_a_ = act(BT * F);
  d_b_ = act(BT * 3 * A);
  d_c_ = act(BT * C);
}

int64_t Gpt::activation_bytes(const ModelSpec& s, const LocalDims& d, int B, int T,
                              bool activation_checkpointing, size_t esz) {
  // Mirrors the constructor: per block ln1, qkv (3A), atty (A), res2, ln2, fch (F), fch_gelu
  // (F) and the statistics ln1/ln2 mean and rstd and lse (NH/T); then the residual stream
  // (L + 1), proj_tmp, lnf, dres, d_a (F), d_b (3A), d_c and lnf mean/rstd, then the base
  // buffers (logits, losses, tokens, targets).
  const int64_t BT = int64_t{B} * T, C = s.n_embd, NH = d.n_head, L = s.n_layer, A = d.q_dim,
                F = d.ffn;
  const int64_t e = static_cast<int64_t>(esz);
  const int64_t block = BT * ((3 * C + 4 * A + 2 * F) * e + (4 + NH) * 4);
  const int64_t blocks = activation_checkpointing ? 1 : L;
  const int tp = s.n_head / d.n_head;
  return blocks * block + BT * (((L + 1) * C + 4 * C + F + 3 * A) * e + 2 * 4) +
         base_activation_bytes(d, tp, B, T, esz);
}

void Gpt::encoder(const int32_t* inputs, ParamSource& params) {
  const ModelSpec& s = spec();
  const void* w = params.acquire(layout_.embedding_unit());
  timed(timer(), times_.encoder, [&] {
    be_.encoder_forward(
        res_[0], inputs, w,
        elem_at(w, layout_.wpe_offset() + int64_t{position_offset()} * s.n_embd, esz_), B_, T_,
        s.n_embd);
  });
  params.release(layout_.embedding_unit());
  round(res_[0], int64_t{B_} * T_ * s.n_embd);
  // Vocabulary-parallel: each rank looked up the tokens of its shard (and rank 0 the positions).
  exchange_forward(ExchangePoint::kEmbedding, res_[0], int64_t{B_} * T_ * s.n_embd);
}

void Gpt::block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, NH = layout_.local().n_head, A = layout_.local().q_dim,
            F = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_;
  const auto& o = layout_.block();
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, res_in, elem_at(w, o.ln1_w, esz_),
                          elem_at(w, o.ln1_b, esz_), N, C);
  });
  round(a.ln1, N * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.qkv, a.ln1, elem_at(w, o.qkv_w, esz_), elem_at(w, o.qkv_b, esz_), N, C,
                       3 * A);
  });
  round(a.qkv, N * 3 * A);
  timed(timer(), times_.attention_fwd, [&] {
    attend(l, a.atty, a.lse, a.qkv, AttentionShape{B_, T_, NH, NH, s.n_embd / s.n_head, 0});
  });
  round(a.atty, N * A);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.atty, elem_at(w, o.attproj_w, esz_),
                       elem_at(w, o.attproj_b, esz_), N, A, C);
  });
  round(proj_tmp_, N * C);
  exchange_forward(ExchangePoint::kAttentionOut, proj_tmp_, N * C);
  // res2 = res_in + proj (stored rounded), ln2 = layernorm(res2): one fused op.
  timed(timer(), times_.layernorm, [&] {
    be_.residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, res_in, proj_tmp_,
                                   elem_at(w, o.ln2_w, esz_), elem_at(w, o.ln2_b, esz_), N, C);
  });
  round(a.ln2, N * C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.fch, a.ln2, elem_at(w, o.fc_w, esz_), elem_at(w, o.fc_b, esz_), N, C, F);
  });
  round(a.fch, N * F);
  timed(timer(), times_.gelu, [&] { be_.gelu_forward(a.fch_gelu, a.fch, N * F); });
  round(a.fch_gelu, N * F);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.fch_gelu, elem_at(w, o.fcproj_w, esz_),
                       elem_at(w, o.fcproj_b, esz_), N, F, C);
  });
  round(proj_tmp_, N * C);
  exchange_forward(ExchangePoint::kMlpOut, proj_tmp_, N * C);
  timed(timer(), times_.residual, [&] { be_.residual_forward(res_out, a.res2, proj_tmp_, N * C); });
  round(res_out, N * C);
}

// dres_ holds d(block output) on entry and d(block input) on exit. dw: the unit's gradients (+=).
void Gpt::block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, NH = layout_.local().n_head, A = layout_.local().q_dim,
            F = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_;
  const auto& o = layout_.block();
  // MLP: res_out = res2 + fcproj(gelu(fc(ln2(res2))))
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_a_, elem_at(dw, o.fcproj_w, esz_), elem_at(dw, o.fcproj_b, esz_), dres_,
                        a.fch_gelu, elem_at(w, o.fcproj_w, esz_), N, F, C, false);
  });
  round(d_a_, N * F);
  timed(timer(), times_.gelu, [&] { be_.gelu_backward(d_a_, a.fch, d_a_, N * F); });
  round(d_a_, N * F);
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, elem_at(dw, o.fc_w, esz_), elem_at(dw, o.fc_b, esz_), d_a_, a.ln2,
                        elem_at(w, o.fc_w, esz_), N, C, F, false);
  });
  round(d_c_, N * C);
  exchange_backward(ExchangePoint::kMlpIn, d_c_, N * C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, elem_at(dw, o.ln2_w, esz_), elem_at(dw, o.ln2_b, esz_), d_c_,
                           a.res2, elem_at(w, o.ln2_w, esz_), a.ln2_mean, a.ln2_rstd, N, C);
  });
  round(dres_, N * C);
  // Attention: res2 = res_in + attproj(attention(qkv(ln1(res_in))))
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, elem_at(dw, o.attproj_w, esz_), elem_at(dw, o.attproj_b, esz_), dres_,
                        a.atty, elem_at(w, o.attproj_w, esz_), N, A, C, false);
  });
  round(d_c_, N * A);
  timed(timer(), times_.attention_bwd, [&] {
    be_.attention_backward(d_b_, d_c_, a.qkv, a.atty, a.lse,
                           AttentionShape{B_, T_, NH, NH, s.n_embd / s.n_head, 0});
  });
  round(d_b_, N * 3 * A);
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, elem_at(dw, o.qkv_w, esz_), elem_at(dw, o.qkv_b, esz_), d_b_, a.ln1,
                        elem_at(w, o.qkv_w, esz_), N, C, 3 * A, false);
  });
  round(d_c_, N * C);
  exchange_backward(ExchangePoint::kAttentionIn, d_c_, N * C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, elem_at(dw, o.ln1_w, esz_), elem_at(dw, o.ln1_b, esz_), d_c_,
                           res_in, elem_at(w, o.ln1_w, esz_), a.ln1_mean, a.ln1_rstd, N, C);
  });
  round(dres_, N * C);
  (void)l;
}

const void* Gpt::forward_to_logits(const int32_t* inputs, ParamSource& params,
                                   const void** wte_unit) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
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
                          elem_at(wf, layout_.lnf_w_offset(), esz_),
                          elem_at(wf, layout_.lnf_b_offset(), esz_), N, C);
  });
  round(lnf_, N * C);
  const void* we = params.acquire(layout_.embedding_unit());
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(logits_, lnf_, elem_at(we, layout_.wte_offset(), esz_), nullptr, N, C, Vp);
  });
  round(logits_, N * Vp);
  *wte_unit = we;
  return wf;
}

float Gpt::forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                                 GradSink& grads, float loss_weight) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
  const int64_t N = int64_t{B_} * T_;
  const void* we = nullptr;
  upload(inputs, targets);
  const void* wf = forward_to_logits(tokens_, params, &we);

  // Loss and dlogits (in place). Every position with a target weighs 1/valid in the mean.
  const float dloss = loss_gradient(targets, loss_weight);
  timed(timer(), times_.classifier, [&] { loss_and_dlogits(dloss); });
  round(logits_, N * Vp);
  forward_phase_done();  // the forward phase ends with the loss

  // Head: logits = lnf @ wte^T (tied), then the final LayerNorm.
  void* dwe = grads.grad_buffer(layout_.embedding_unit());
  timed(timer(), times_.matmul_bwd, [&] {
    be_.matmul_backward(d_c_, elem_at(dwe, layout_.wte_offset(), esz_), nullptr, logits_, lnf_,
                        elem_at(we, layout_.wte_offset(), esz_), N, C, Vp, false);
  });
  params.release(layout_.embedding_unit());
  round(d_c_, N * C);
  exchange_backward(ExchangePoint::kHeadIn, d_c_, N * C);
  void* dwf = grads.grad_buffer(layout_.final_unit());
  be_.memset_zero(dres_, static_cast<size_t>(N * C) * esz_);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, elem_at(dwf, layout_.lnf_w_offset(), esz_),
                           elem_at(dwf, layout_.lnf_b_offset(), esz_), d_c_,
                           res_[static_cast<size_t>(s.n_layer)],
                           elem_at(wf, layout_.lnf_w_offset(), esz_), lnf_mean_, lnf_rstd_, N, C);
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
    be_.encoder_backward(elem_at(dwe, layout_.wte_offset(), esz_),
                         elem_at(dwe, layout_.wpe_offset(), esz_), dres_, tokens_, B_, T_, C);
  });
  round(dwe, layout_.unit(layout_.embedding_unit()).numel);
  grads.unit_done(layout_.embedding_unit());
  // The losses are read back last: a GPU has the whole backward queued by then.
  return mean_loss(targets);
}

void Gpt::run_to_logits(ParamSource& params) {
  const void* we = nullptr;
  forward_to_logits(tokens_, params, &we);
  params.release(layout_.embedding_unit());
  params.release(layout_.final_unit());
}

}  // namespace zerod
