#include "model/gpt.h"

#include "core/error.h"
#include "core/timer.h"
#include "model/op_timing.h"

namespace zerod {

Gpt::Gpt(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
         MemoryTracker* tracker, TensorShard shard, ContextShard context, LayerRange stage,
         int slots)
    : ModelBase(spec, backend, B, T, activation_checkpointing, tracker, shard, context, stage,
                slots) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK(s.n_embd % s.n_head == 0, "n_embd {} % n_head {}", s.n_embd, s.n_head);
  const LocalDims& d = layout_.local();
  // BT: all rows (matmuls, attention; context-parallel: this rank's B x T/C); R: the rows of
  // the norm and residual regions (BT / T under sequence parallelism).
  const size_t BT = static_cast<size_t>(B) * T_, R = static_cast<size_t>(rows()), C = s.n_embd,
               NH = d.n_head, A = d.q_dim, F = d.ffn;
  // One allocation per buffer keeps each 64-byte aligned and visible in the memory report.
  // A MoE block's MLP keeps its state in moe_ (fch and fch_gelu stay null).
  auto make_block = [&](bool dense_mlp) {
    BlockActs a{};
    a.ln1 = act(R * C);
    a.ln1_mean = stat(R);
    a.ln1_rstd = stat(R);
    a.qkv = act(BT * 3 * A);
    a.atty = act(BT * A);
    a.lse = stat(BT * NH);
    a.res2 = act(R * C);
    a.ln2 = act(R * C);
    a.ln2_mean = stat(R);
    a.ln2_rstd = stat(R);
    if (dense_mlp) {
      a.fch = act(BT * F);
      a.fch_gelu = act(BT * F);
    }
    return a;
  };
  if (checkpointing_) work_ = make_block(s.moe.moe_layers(s.n_layer) < s.n_layer);
  const LayerRange& st = layout_.stage();
  saved_.resize(static_cast<size_t>(slots));
  for (Saved& sv : saved_) {
    if (!checkpointing_) {
      sv.blocks.resize(static_cast<size_t>(s.n_layer));
      for (int l = st.begin; l < st.end; ++l)
        sv.blocks[static_cast<size_t>(l)] = make_block(!s.moe.is_moe_layer(l));
    }
    if (last_stage()) {
      sv.lnf = act(R * C);
      sv.lnf_mean = stat(R);
      sv.lnf_rstd = stat(R);
    }
  }
  proj_tmp_ = act(BT * C);
  d_a_ = act(BT * F);
  d_b_ = act(BT * 3 * A);
  d_c_ = act(BT * C);
  if (sequence_parallel()) part_ = act(R * C);
  select_slot(0);
}

void Gpt::select_saved(int k) {
  Saved& sv = saved_.at(static_cast<size_t>(k));
  blocks_ = sv.blocks;
  lnf_ = sv.lnf;
  lnf_mean_ = sv.lnf_mean;
  lnf_rstd_ = sv.lnf_rstd;
}

int64_t Gpt::activation_bytes(const ModelSpec& s, const TensorShard& shard, int B, int T,
                              bool activation_checkpointing, size_t esz, int context,
                              LayerRange stage, int slots) {
  // Mirrors the constructors (ModelBase's, then this one's). Per slot: each of the stage's n
  // blocks' ln1, res2, ln2 (R rows), qkv (3A), atty (A), fch (F), fch_gelu (F) (BT rows) and
  // statistics ln1/ln2 mean and rstd (R) and lse (NH/T, BT), unless checkpointing; the residual
  // stream (n + 1 of (R,C)); on the last stage lnf (R,C) with its mean and rstd (R) and the base
  // buffers' logits; the base buffers (losses, tokens, targets). Shared by the slots: the
  // recompute block (checkpointing), dres (R,C), proj_tmp, d_c (BT,C), d_a (F), d_b (3A) and
  // under sequence parallelism part (R,C). Context-parallel: T/C rows per sequence.
  T /= context;
  if (stage.end < 0) stage.end = s.n_layer;
  const bool last = stage.end == s.n_layer;
  const LocalDims d = local_dims(s, shard);
  const int64_t BT = int64_t{B} * T, R = local_rows(shard, B, T), C = s.n_embd, NH = d.n_head,
                n = stage.end - stage.begin, A = d.q_dim, F = d.ffn;
  const int64_t e = static_cast<int64_t>(esz);
  const int64_t block = (3 * C * R + (4 * A + 2 * F) * BT) * e + (4 * R + NH * BT) * 4;
  // A MoE block saves no fch / fch_gelu (its MLP's state is MoeLayers').
  const MoeLayers::ModelBytes moe =
      MoeLayers::model_bytes(s, BT, stage, activation_checkpointing, esz, 2 * F * BT * e,
                             shard.size, shard.size > 1 && shard.sequence_parallel);
  const int64_t per_slot = (activation_checkpointing ? 0 : n * block) + moe.per_slot +
                           (n + 1) * R * C * e + (last ? R * C * e + 2 * R * 4 : 0) +
                           base_activation_bytes(d, shard.size, B, T, esz, last);
  const int64_t part = R < BT ? R * C : 0;  // (sequence parallelism)
  const int64_t shared = moe.shared + (activation_checkpointing ? block : 0) +
                         (R * C + part + (2 * C + F + 3 * A) * BT) * e;
  return slots * per_slot + shared;
}

AttentionShape Gpt::attn_shape() const {
  const ModelSpec& s = spec();
  AttentionShape a{B_, T_, layout_.local().n_head, layout_.local().n_head, s.n_embd / s.n_head, 0};
  a.doc_start = doc_start();
  return a;
}

void Gpt::encoder(const int32_t* inputs, ParamSource& params) {
  const ModelSpec& s = spec();
  const void* w = params.acquire(layout_.embedding_unit());
  // Every position's embedding (under sequence parallelism into proj_tmp_, then this rank's rows).
  void* full = sp_or(proj_tmp_, res_[0]);
  timed(timer(), times_.encoder, [&] {
    if (!context_parallel()) {
      be_.encoder_forward(
          full, inputs, w,
          elem_at(w, layout_.wpe_offset() + int64_t{position_offset()} * s.n_embd, esz_), B_, T_,
          s.n_embd, doc_start());
      return;
    }
    // This rank's rows are runs of consecutive global positions: one lookup per sequence and run.
    for (int b = 0; b < B_; ++b) {
      for (const PositionRun& r : position_runs()) {
        const int64_t row = int64_t{b} * T_ + r.row;
        be_.encoder_forward(elem_at(full, row * s.n_embd, esz_), inputs + row, w,
                            elem_at(w, layout_.wpe_offset() + int64_t{r.pos} * s.n_embd, esz_), 1,
                            r.len, s.n_embd, nullptr);
      }
    }
  });
  params.release(layout_.embedding_unit());
  round(full, int64_t{B_} * T_ * s.n_embd);
  // Vocabulary-parallel: each rank looked up the tokens of its shard (and rank 0 the positions).
  exchange_forward(ExchangePoint::kEmbedding, res_[0], full, s.n_embd);
}

void Gpt::block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, A = layout_.local().q_dim, F = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const auto& o = layout_.block();
  // Under sequence parallelism the norms and residuals see R = N/T rows; the inputs of the
  // column-parallel matmuls are gathered into proj_tmp_ (all N rows), the outputs of the
  // row-parallel ones (N rows in proj_tmp_, partial sums) reduce-scattered into part_.
  void* proj = sp_or(part_, proj_tmp_);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, res_in, elem_at(w, o.ln1_w, esz_),
                          elem_at(w, o.ln1_b, esz_), R, C);
  });
  round(a.ln1, R * C);
  void* ln1 = sp_or(proj_tmp_, a.ln1);
  exchange_forward(ExchangePoint::kAttentionIn, a.ln1, ln1, C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.qkv, ln1, elem_at(w, o.qkv_w, esz_), elem_at(w, o.qkv_b, esz_), N, C,
                       3 * A);
  });
  round(a.qkv, N * 3 * A);
  timed(timer(), times_.attention_fwd, [&] { attend(l, a.atty, a.lse, a.qkv, attn_shape()); });
  round(a.atty, N * A);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.atty, elem_at(w, o.attproj_w, esz_),
                       elem_at(w, o.attproj_b, esz_), N, A, C);
  });
  round(proj_tmp_, N * C);
  exchange_forward(ExchangePoint::kAttentionOut, proj, proj_tmp_, C);
  // res2 = res_in + proj (stored rounded), ln2 = layernorm(res2): one fused op.
  timed(timer(), times_.layernorm, [&] {
    be_.residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, res_in, proj,
                                   elem_at(w, o.ln2_w, esz_), elem_at(w, o.ln2_b, esz_), R, C);
  });
  round(a.ln2, R * C);
  void* ln2 = sp_or(proj_tmp_, a.ln2);
  exchange_forward(ExchangePoint::kMlpIn, a.ln2, ln2, C);
  // The experts' MLP (model/moe_block.h) writes d_c_ (free in forward) under sequence
  // parallelism, where ln2 is proj_tmp_ (its input, gathered).
  void* mlp_out = proj_tmp_;
  if (s.moe.is_moe_layer(l)) {
    mlp_out = sp_or(d_c_, proj_tmp_);
    moe_->forward(l, w, experts_w_, ln2, mlp_out, N);
  } else {
    if (be_.fuses_matmul_gelu()) {  // one op (no rounding to emulate: a real 16-bit backend)
      timed(timer(), times_.matmul_fwd, [&] {
        be_.matmul_gelu_forward(a.fch_gelu, a.fch, ln2, elem_at(w, o.fc_w, esz_),
                                elem_at(w, o.fc_b, esz_), N, C, F);
      });
    } else {
      timed(timer(), times_.matmul_fwd, [&] {
        be_.matmul_forward(a.fch, ln2, elem_at(w, o.fc_w, esz_), elem_at(w, o.fc_b, esz_), N, C, F);
      });
      round(a.fch, N * F);
      timed(timer(), times_.gelu, [&] { be_.gelu_forward(a.fch_gelu, a.fch, N * F); });
      round(a.fch_gelu, N * F);
    }
    timed(timer(), times_.matmul_fwd, [&] {
      be_.matmul_forward(proj_tmp_, a.fch_gelu, elem_at(w, o.fcproj_w, esz_),
                         elem_at(w, o.fcproj_b, esz_), N, F, C);
    });
    round(proj_tmp_, N * C);
  }
  exchange_forward(ExchangePoint::kMlpOut, proj, mlp_out, C);
  timed(timer(), times_.residual, [&] { be_.residual_forward(res_out, a.res2, proj, R * C); });
  round(res_out, R * C);
}

// dres_ holds d(block output) on entry and d(block input) on exit. dw: the unit's gradients (+=).
void Gpt::block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, A = layout_.local().q_dim, F = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const auto& o = layout_.block();
  // Under sequence parallelism dres_ holds R rows: the row-parallel backward reads all N rows of
  // it gathered into proj_tmp_, the column-parallel one its input gathered again into proj_tmp_,
  // and its input gradient (N rows, partial sums) is reduce-scattered into part_.
  void* dout = sp_or(proj_tmp_, dres_);
  void* dln = sp_or(part_, d_c_);
  // MLP: res_out = res2 + fcproj(gelu(fc(ln2(res2))))
  exchange_backward(ExchangePoint::kMlpOut, dres_, dout, C);
  if (s.moe.is_moe_layer(l)) {
    moe_->backward(l, w, dw, experts_w_, experts_dw_, a.ln2, dout, d_c_);
  } else {
    if (be_.fuses_matmul_gelu() && !splitting_backward()) {  // (split: dweight deferred)
      timed(timer(), times_.matmul_bwd, [&] {
        be_.matmul_backward_dgelu(d_a_, elem_at(dw, o.fcproj_w, esz_),
                                  elem_at(dw, o.fcproj_b, esz_), dout, a.fch_gelu,
                                  elem_at(w, o.fcproj_w, esz_), a.fch, N, F, C);
      });
    } else {
      timed(timer(), times_.matmul_bwd, [&] {
        matmul_backward(d_a_, elem_at(dw, o.fcproj_w, esz_), elem_at(dw, o.fcproj_b, esz_), dout,
                        a.fch_gelu, elem_at(w, o.fcproj_w, esz_), N, F, C, false);
      });
      round(d_a_, N * F);
      timed(timer(), times_.gelu, [&] { be_.gelu_backward(d_a_, a.fch, d_a_, N * F); });
      round(d_a_, N * F);
    }
    void* ln2 = sp_or(proj_tmp_, a.ln2);
    exchange_forward(ExchangePoint::kMlpIn, a.ln2, ln2, C);
    timed(timer(), times_.matmul_bwd, [&] {
      matmul_backward(d_c_, elem_at(dw, o.fc_w, esz_), elem_at(dw, o.fc_b, esz_), d_a_, ln2,
                      elem_at(w, o.fc_w, esz_), N, C, F, false);
    });
    round(d_c_, N * C);
  }
  exchange_backward(ExchangePoint::kMlpIn, dln, d_c_, C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, elem_at(dw, o.ln2_w, esz_), elem_at(dw, o.ln2_b, esz_), dln,
                           a.res2, elem_at(w, o.ln2_w, esz_), a.ln2_mean, a.ln2_rstd, R, C);
  });
  round(dres_, R * C);
  // Attention: res2 = res_in + attproj(attention(qkv(ln1(res_in))))
  exchange_backward(ExchangePoint::kAttentionOut, dres_, dout, C);
  timed(timer(), times_.matmul_bwd, [&] {
    matmul_backward(d_c_, elem_at(dw, o.attproj_w, esz_), elem_at(dw, o.attproj_b, esz_), dout,
                    a.atty, elem_at(w, o.attproj_w, esz_), N, A, C, false);
  });
  round(d_c_, N * A);
  timed(timer(), times_.attention_bwd,
        [&] { attend_backward(d_b_, d_c_, a.qkv, a.atty, a.lse, attn_shape()); });
  round(d_b_, N * 3 * A);
  void* ln1 = sp_or(proj_tmp_, a.ln1);
  exchange_forward(ExchangePoint::kAttentionIn, a.ln1, ln1, C);
  timed(timer(), times_.matmul_bwd, [&] {
    matmul_backward(d_c_, elem_at(dw, o.qkv_w, esz_), elem_at(dw, o.qkv_b, esz_), d_b_, ln1,
                    elem_at(w, o.qkv_w, esz_), N, C, 3 * A, false);
  });
  round(d_c_, N * C);
  exchange_backward(ExchangePoint::kAttentionIn, dln, d_c_, C);
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_backward(dres_, elem_at(dw, o.ln1_w, esz_), elem_at(dw, o.ln1_b, esz_), dln,
                           res_in, elem_at(w, o.ln1_w, esz_), a.ln1_mean, a.ln1_rstd, R, C);
  });
  round(dres_, R * C);
  (void)l;
}

const void* Gpt::forward_to_logits(const int32_t* inputs, ParamSource& params,
                                   const void** wte_unit) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
  const int64_t N = int64_t{B_} * T_, R = rows();
  if (first_stage()) encoder(inputs, params);
  forward_blocks(params);
  const void* wf = params.acquire(layout_.final_unit());
  timed(timer(), times_.layernorm, [&] {
    be_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, res_[static_cast<size_t>(s.n_layer)],
                          elem_at(wf, layout_.lnf_w_offset(), esz_),
                          elem_at(wf, layout_.lnf_b_offset(), esz_), R, C);
  });
  round(lnf_, R * C);
  // Under sequence parallelism all N rows of lnf into proj_tmp_ (kept there for the head's
  // backward).
  void* lnf = sp_or(proj_tmp_, lnf_);
  exchange_forward(ExchangePoint::kHeadIn, lnf_, lnf, C);
  const void* we = params.acquire(layout_.embedding_unit());
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(logits_, lnf, elem_at(we, layout_.wte_offset(), esz_), nullptr, N, C, Vp);
  });
  *wte_unit = we;
  return wf;
}

void Gpt::forward_blocks(ParamSource& params) {
  const LayerRange& st = layout_.stage();
  for (int l = st.begin; l < st.end; ++l) {
    if (l + 1 < st.end) prefetch_block(params, l + 1);
    const void* w = acquire_block(params, l);
    block_forward(l, w, res_[static_cast<size_t>(l)], acts_for(l),
                  res_[static_cast<size_t>(l) + 1]);
    release_block(params, l);
  }
}

void Gpt::stage_forward_impl(ParamSource& params, float dloss, bool hold) {
  if (!last_stage()) {
    if (first_stage()) encoder(tokens_, params);
    forward_blocks(params);
    return;
  }
  const void* we = nullptr;
  const void* wf = forward_to_logits(tokens_, params, &we);
  // Loss and dlogits (in place). Every position with a target weighs 1/valid in the mean.
  timed(timer(), times_.classifier, [&] { loss_and_dlogits(dloss); });
  forward_phase_done();  // the forward phase ends with the loss
  if (hold) {
    held_wte_ = we;
    held_lnf_ = wf;
  } else {
    params.release(layout_.embedding_unit());
    params.release(layout_.final_unit());
  }
}

void Gpt::stage_backward_impl(ParamSource& params, GradSink& grads, bool held) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const LayerRange& st = layout_.stage();
  void* dwe = nullptr;
  if (last_stage()) {
    const void* we = held ? held_wte_ : params.acquire(layout_.embedding_unit());
    const void* wf = held ? held_lnf_ : params.acquire(layout_.final_unit());
    held_wte_ = held_lnf_ = nullptr;
    // Head: logits = lnf @ wte^T (tied), then the final LayerNorm.
    dwe = grad_buffer(grads, layout_.embedding_unit());
    void* lnf = sp_or(proj_tmp_, lnf_);  // all N rows of lnf (sequence parallelism: still there)
    timed(timer(), times_.matmul_bwd, [&] {
      matmul_backward(d_c_, elem_at(dwe, layout_.wte_offset(), esz_), nullptr, logits_, lnf,
                      elem_at(we, layout_.wte_offset(), esz_), N, C, Vp, false,
                      /*dout_kept=*/true);  // (the slot's logits)
    });
    params.release(layout_.embedding_unit());
    round(d_c_, N * C);
    void* dlnf = sp_or(part_, d_c_);
    exchange_backward(ExchangePoint::kHeadIn, dlnf, d_c_, C);
    void* dwf = grad_buffer(grads, layout_.final_unit());
    be_.memset_zero(dres_, static_cast<size_t>(R * C) * esz_);
    timed(timer(), times_.layernorm, [&] {
      be_.layernorm_backward(dres_, elem_at(dwf, layout_.lnf_w_offset(), esz_),
                             elem_at(dwf, layout_.lnf_b_offset(), esz_), dlnf,
                             res_[static_cast<size_t>(s.n_layer)],
                             elem_at(wf, layout_.lnf_w_offset(), esz_), lnf_mean_, lnf_rstd_, R, C);
    });
    params.release(layout_.final_unit());
    round(dres_, R * C);
    unit_done(grads, layout_.final_unit(), dwf);
    if (!first_stage()) {  // the tied embedding's copy: done with the head
      unit_done(grads, layout_.embedding_unit(), dwe);
    }
  }
  // (Not the last stage: dres_ holds the gradient of the stage's output.)
  for (int l = st.end - 1; l >= st.begin; --l) {
    if (l > st.begin) prefetch_block(params, l - 1);
    const void* w = acquire_block(params, l);
    const void* res_in = res_[static_cast<size_t>(l)];
    if (checkpointing_) block_forward(l, w, res_in, work_, proj_tmp_);  // recompute (output unused)
    void* dw = block_grads(grads, l);
    block_backward(l, w, dw, res_in, acts_for(l));
    release_block(params, l);
    block_done(grads, l, dw);
  }
  if (!first_stage()) return;  // dres_: the gradient of the stage's input
  if (dwe == nullptr) dwe = grad_buffer(grads, layout_.embedding_unit());
  // The embedding's gradient needs every position's (sequence parallelism: gathered).
  void* demb = sp_or(proj_tmp_, dres_);
  exchange_backward(ExchangePoint::kEmbedding, dres_, demb, C);
  timed(timer(), times_.encoder, [&] {
    if (!context_parallel()) {
      be_.encoder_backward(elem_at(dwe, layout_.wte_offset(), esz_),
                           elem_at(dwe, layout_.wpe_offset(), esz_), demb, tokens_, B_, T_, C,
                           doc_start());
      return;
    }
    for (int b = 0; b < B_; ++b) {
      for (const PositionRun& r : position_runs()) {
        const int64_t row = int64_t{b} * T_ + r.row;
        be_.encoder_backward(elem_at(dwe, layout_.wte_offset(), esz_),
                             elem_at(dwe, layout_.wpe_offset() + int64_t{r.pos} * C, esz_),
                             elem_at(demb, row * C, esz_), tokens_ + row, 1, r.len, C, nullptr);
      }
    }
  });
  unit_done(grads, layout_.embedding_unit(), dwe);
}

float Gpt::forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                                 GradSink& grads, float loss_weight) {
  upload(inputs, targets);
  stage_forward_impl(params, loss_gradient(targets, loss_weight), /*hold=*/true);
  stage_backward_impl(params, grads, /*held=*/true);
  // The losses are read back last: a GPU has the whole backward queued by then.
  return mean_loss(targets);
}

void Gpt::run_to_logits(ParamSource& params) {
  const void* we = nullptr;
  forward_to_logits(tokens_, params, &we);
  round_logits();
  params.release(layout_.embedding_unit());
  params.release(layout_.final_unit());
}

}  // namespace zerod
