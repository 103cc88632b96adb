#include "model/llama.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/op_timing.h"

namespace zerod {

namespace {
// 1 / base^(float(2i) / HS) in fp32, as transformers computes the default frequencies.
std::vector<float> default_inv_freq(float base, int HS) {
  std::vector<float> inv(static_cast<size_t>(HS / 2));
  for (int i = 0; i < HS / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(HS);
    inv[static_cast<size_t>(i)] = 1.0f / powf(base, e);
  }
  return inv;
}

// YaRN (arXiv 2309.00071; transformers' _compute_yarn_parameters): channels that turn more
// than beta_fast times over the pretraining length keep their frequency (extrapolation), those
// under beta_slow turns are divided by the factor (interpolation), with a linear ramp between.
std::vector<float> yarn_inv_freq(const RopeScaling& r, float base, int HS) {
  const int dim = HS;
  const double length = r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                                               : r.max_position_embeddings;
  ZD_CHECK(length > 0, "rope yarn needs max_position_embeddings");
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(length / (rotations * 2.0 * M_PI)) / (2.0 * std::log(double{base}));
  };
  const double low = std::max(std::floor(correction_dim(r.beta_fast)), 0.0);
  float high = static_cast<float>(std::min(std::ceil(correction_dim(r.beta_slow)), dim - 1.0));
  const float lo = static_cast<float>(low);
  if (lo == high) high += 0.001f;  // transformers' guard against a zero-width ramp
  const float factor = static_cast<float>(r.factor);
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float pos_freq = powf(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - lo) / (high - lo), 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // the share of the unscaled frequency
    inv[static_cast<size_t>(i)] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv;
}
}  // namespace

double rope_attention_factor(const RopeScaling& r) {
  if (r.type != RopeScaling::Type::kYarn) return 1.0;
  if (r.attention_factor > 0) return r.attention_factor;
  return r.factor <= 1.0 ? 1.0 : 0.1 * std::log(r.factor) + 1.0;
}

void rope_tables(const ModelSpec& s, std::vector<float>* cos_t, std::vector<float>* sin_t) {
  const int HS = s.head_size(), half = HS / 2;
  ZD_CHECK(HS % 2 == 0, "rotary embedding needs an even head size, got {}", HS);
  const RopeScaling& r = s.rope_scaling;
  float base = static_cast<float>(s.rope_theta);
  if (r.type == RopeScaling::Type::kDynamic) {
    // NTK-aware scaling: past max_position_embeddings the base grows with the sequence, which
    // here is the model's whole length (transformers takes the largest position + 1).
    ZD_CHECK(r.max_position_embeddings > 0, "rope dynamic needs max_position_embeddings");
    const double max_pos = r.max_position_embeddings;
    const double len = std::max<double>(s.seq_len, max_pos);
    if (len > max_pos) {
      base = static_cast<float>(
          s.rope_theta * std::pow(r.factor * len / max_pos - (r.factor - 1), HS / (HS - 2.0)));
    }
  }
  std::vector<float> inv =
      r.type == RopeScaling::Type::kYarn ? yarn_inv_freq(r, base, HS) : default_inv_freq(base, HS);
  if (r.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f = f / static_cast<float>(r.factor);
  } else if (r.type == RopeScaling::Type::kLlama3) {
    const float factor = static_cast<float>(r.factor), lo = static_cast<float>(r.low_freq_factor),
                hi = static_cast<float>(r.high_freq_factor),
                old_len = static_cast<float>(r.original_max_position_embeddings);
    const float lo_wavelen = old_len / lo, hi_wavelen = old_len / hi;
    const float two_pi = static_cast<float>(2.0 * M_PI);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      float scaled = wavelen > lo_wavelen ? f / factor : f;
      const bool medium = !(wavelen < hi_wavelen) && !(wavelen > lo_wavelen);
      if (medium) {
        const float smooth = (old_len / wavelen - lo) / (hi - lo);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  // yarn scales cos and sin (as attention logits scaled by its square).
  const float scale = static_cast<float>(rope_attention_factor(r));
  cos_t->assign(static_cast<size_t>(s.seq_len) * half, 0.0f);
  sin_t->assign(static_cast<size_t>(s.seq_len) * half, 0.0f);
  for (int t = 0; t < s.seq_len; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv[static_cast<size_t>(i)];
      const size_t k = static_cast<size_t>(t) * half + i;
      (*cos_t)[k] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
      (*sin_t)[k] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    }
  }
}

namespace {
void check_spec(const ModelSpec& s) {
  ZD_CHECK(s.llama_family(), "Llama model built for a {} spec", model_arch_name(s.arch));
  ZD_CHECK(s.kv_heads() > 0 && s.n_head % s.kv_heads() == 0,
           "num_attention_heads {} is not a multiple of num_key_value_heads {}", s.n_head,
           s.kv_heads());
  ZD_CHECK(s.head_size() > 0 && s.head_size() % 2 == 0, "head size {} (must be even)",
           s.head_size());
}
}  // namespace

Llama::Llama(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
             MemoryTracker* tracker, TensorShard shard, ContextShard context, LayerRange stage,
             int slots)
    : ModelBase(spec, backend, B, T, activation_checkpointing, tracker, shard, context, stage,
                slots) {
  const ModelSpec& s = layout_.spec();
  check_spec(s);
  const LocalDims& d = layout_.local();
  // N: all rows (matmuls, attention; context-parallel: this rank's B x T/C); R: the rows of the
  // norm and residual regions (N / T under sequence parallelism).
  const size_t N = static_cast<size_t>(B) * T_, R = static_cast<size_t>(rows()), C = s.n_embd,
               NH = d.n_head, Q = d.q_dim, QKV = d.qkv_dim, I = d.ffn;
  // A MoE block's MLP keeps its state in moe_ (gu and act stay null).
  auto make_block = [&](bool dense_mlp) {
    BlockActs a{};
    a.ln1 = act(R * C);
    a.ln1_rstd = stat(R);
    a.qkv = act(N * QKV);
    a.atty = act(N * Q);
    a.lse = stat(N * NH);
    a.res2 = act(R * C);
    a.ln2 = act(R * C);
    a.ln2_rstd = stat(R);
    if (dense_mlp) {
      a.gu = act(N * 2 * I);
      a.act = act(N * I);
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
      sv.lnf_rstd = stat(R);
    }
  }
  proj_tmp_ = act(N * C);
  const size_t table = static_cast<size_t>(s.seq_len) * (s.head_size() / 2);
  rope_cos_ = stat(table);
  rope_sin_ = stat(table);
  std::vector<float> cos_t, sin_t;
  rope_tables(s, &cos_t, &sin_t);
  be_.copy(rope_cos_, cos_t.data(), table * sizeof(float));
  be_.copy(rope_sin_, sin_t.data(), table * sizeof(float));
  if (context_parallel()) {
    // The table rows of this rank's positions, one per row of a sequence.
    const size_t half = static_cast<size_t>(s.head_size() / 2);
    std::vector<float> rc, rs;
    for (int32_t p : positions()) {
      const size_t k = static_cast<size_t>(p) * half;
      rc.insert(rc.end(), cos_t.begin() + k, cos_t.begin() + k + half);
      rs.insert(rs.end(), sin_t.begin() + k, sin_t.begin() + k + half);
    }
    rows_cos_ = stat(rc.size());
    rows_sin_ = stat(rs.size());
    be_.copy(rows_cos_, rc.data(), rc.size() * sizeof(float));
    be_.copy(rows_sin_, rs.data(), rs.size() * sizeof(float));
  }
  d_a_ = act(N * std::max(2 * I, QKV));
  d_b_ = act(N * std::max(I, Q));
  d_c_ = act(N * C);
  if (sequence_parallel()) part_ = act(R * C);
  select_slot(0);
}

void Llama::select_saved(int k) {
  Saved& sv = saved_.at(static_cast<size_t>(k));
  blocks_ = sv.blocks;
  lnf_ = sv.lnf;
  lnf_rstd_ = sv.lnf_rstd;
}

int64_t Llama::activation_bytes(const ModelSpec& s, const TensorShard& shard, int B, int T,
                                bool activation_checkpointing, size_t esz, int context,
                                LayerRange stage, int slots) {
  // Mirrors the constructors (ModelBase's, then this one's). Per slot: each of the stage's n
  // blocks' ln1, res2, ln2 (R rows), qkv, atty (Q), gu (2I), act (I) (N rows) and statistics
  // ln1/ln2 rstd (R) and lse (NH, N), unless checkpointing; the residual stream (n + 1 of (R,C));
  // on the last stage lnf (R,C) with its rstd (R) and the base buffers' logits; the base buffers
  // (losses, tokens, targets). Shared: the recompute block (checkpointing), dres (R,C), proj_tmp,
  // d_a, d_b, d_c (N rows), the rope tables, under sequence parallelism part (R,C).
  // Context-parallel: T/C rows per sequence, and the tables' rows of their positions.
  T /= context;
  if (stage.end < 0) stage.end = s.n_layer;
  const bool last = stage.end == s.n_layer;
  const LocalDims d = local_dims(s, shard);
  const int64_t N = int64_t{B} * T, R = local_rows(shard, B, T), C = s.n_embd, NH = d.n_head,
                n = stage.end - stage.begin, Q = d.q_dim, QKV = d.qkv_dim, I = d.ffn;
  const int64_t e = static_cast<int64_t>(esz);
  const int64_t block = (3 * C * R + (QKV + Q + 3 * I) * N) * e + (2 * R + NH * N) * 4;
  // A MoE block saves no gu / act (its MLP's state is MoeLayers').
  const MoeLayers::ModelBytes moe =
      MoeLayers::model_bytes(s, N, stage, activation_checkpointing, esz, 3 * I * N * e, shard.size,
                             shard.size > 1 && shard.sequence_parallel);
  const int64_t per_slot = (activation_checkpointing ? 0 : n * block) + moe.per_slot +
                           (n + 1) * R * C * e + (last ? R * C * e + R * 4 : 0) +
                           base_activation_bytes(d, shard.size, B, T, esz, last);
  const int64_t part = R < N ? R * C : 0;  // (sequence parallelism)
  const int64_t shared = moe.shared + (activation_checkpointing ? block : 0) +
                         (R * C + part + (2 * C + std::max(2 * I, QKV) + std::max(I, Q)) * N) * e;
  const int64_t tables = 2 * (int64_t{s.seq_len} + (context > 1 ? T : 0)) * (s.head_size() / 2) * 4;
  return slots * per_slot + shared + tables;
}

AttentionShape Llama::attn_shape(int l) const {
  const ModelSpec& s = spec();
  AttentionShape a;
  a.B = B_;
  a.T = T_;
  a.NH = layout_.local().n_head;
  a.KVH = layout_.local().n_kv_head;
  a.HS = s.head_size();
  a.window = s.window_of(l);
  a.doc_start = doc_start();
  return a;
}

void Llama::block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Q = layout_.local().q_dim, QKV = layout_.local().qkv_dim,
            I = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const float eps = static_cast<float>(s.rms_norm_eps);
  const auto& o = layout_.llama_block();
  const AttentionShape as = attn_shape(l);
  auto bias = [&](int64_t off) -> const void* {
    return off >= 0 ? elem_at(w, off, esz_) : nullptr;
  };
  // Under sequence parallelism the norms and residuals see R = N/T rows; the inputs of the
  // column-parallel matmuls are gathered into proj_tmp_ (all N rows), the outputs of the
  // row-parallel ones (N rows in proj_tmp_, partial sums) reduce-scattered into part_.
  void* proj = sp_or(part_, proj_tmp_);
  timed(timer(), times_.layernorm, [&] {
    be_.rmsnorm_forward(a.ln1, a.ln1_rstd, res_in, elem_at(w, o.ln1_w, esz_), R, C, eps);
  });
  round(a.ln1, R * C);
  void* ln1 = sp_or(proj_tmp_, a.ln1);
  exchange_forward(ExchangePoint::kAttentionIn, a.ln1, ln1, C);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(a.qkv, ln1, elem_at(w, o.qkv_w, esz_), bias(o.qkv_b), N, C, QKV);
  });
  round(a.qkv, N * QKV);
  timed(timer(), times_.attention_fwd, [&] {
    if (context_parallel()) {
      be_.rope_forward(a.qkv, rows_cos_, rows_sin_, as);
      return;
    }
    const int64_t rot = int64_t{position_offset()} * (s.head_size() / 2);
    be_.rope_forward(a.qkv, rope_cos_ + rot, rope_sin_ + rot, as);
  });
  round(a.qkv, N * QKV);
  timed(timer(), times_.attention_fwd, [&] { attend(l, a.atty, a.lse, a.qkv, as); });
  round(a.atty, N * Q);
  timed(timer(), times_.matmul_fwd, [&] {
    be_.matmul_forward(proj_tmp_, a.atty, elem_at(w, o.o_w, esz_), bias(o.o_b), N, Q, C);
  });
  round(proj_tmp_, N * C);
  exchange_forward(ExchangePoint::kAttentionOut, proj, proj_tmp_, C);
  timed(timer(), times_.residual, [&] { be_.residual_forward(a.res2, res_in, proj, R * C); });
  round(a.res2, R * C);
  timed(timer(), times_.layernorm, [&] {
    be_.rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, elem_at(w, o.ln2_w, esz_), R, C, eps);
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
    timed(timer(), times_.matmul_fwd, [&] {
      be_.matmul_forward(a.gu, ln2, elem_at(w, o.gu_w, esz_), bias(o.gu_b), N, C, 2 * I);
    });
    round(a.gu, N * 2 * I);
    timed(timer(), times_.gelu, [&] { be_.swiglu_forward(a.act, a.gu, N, I); });
    round(a.act, N * I);
    timed(timer(), times_.matmul_fwd, [&] {
      be_.matmul_forward(proj_tmp_, a.act, elem_at(w, o.down_w, esz_), bias(o.down_b), N, I, C);
    });
    round(proj_tmp_, N * C);
  }
  exchange_forward(ExchangePoint::kMlpOut, proj, mlp_out, C);
  timed(timer(), times_.residual, [&] { be_.residual_forward(res_out, a.res2, proj, R * C); });
  round(res_out, R * C);
}

// dres_ holds d(block output) on entry and d(block input) on exit. dw: the unit's gradients (+=).
void Llama::block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Q = layout_.local().q_dim, QKV = layout_.local().qkv_dim,
            I = layout_.local().ffn;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const auto& o = layout_.llama_block();
  const AttentionShape as = attn_shape(l);
  auto dbias = [&](int64_t off) -> void* { return off >= 0 ? elem_at(dw, off, esz_) : nullptr; };
  // Under sequence parallelism dres_ holds R rows: the row-parallel backward reads all N rows of
  // it gathered into proj_tmp_, the column-parallel one its input gathered again into proj_tmp_,
  // and its input gradient (N rows, partial sums) is reduce-scattered into part_.
  void* dout = sp_or(proj_tmp_, dres_);
  void* dln = sp_or(part_, d_c_);
  // MLP: res_out = res2 + down(swiglu(gu(ln2(res2)))), or the experts'
  exchange_backward(ExchangePoint::kMlpOut, dres_, dout, C);
  if (s.moe.is_moe_layer(l)) {
    moe_->backward(l, w, dw, experts_w_, experts_dw_, a.ln2, dout, d_c_);
  } else {
    timed(timer(), times_.matmul_bwd, [&] {
      matmul_backward(d_b_, elem_at(dw, o.down_w, esz_), dbias(o.down_b), dout, a.act,
                      elem_at(w, o.down_w, esz_), N, I, C, false);
    });
    round(d_b_, N * I);
    timed(timer(), times_.gelu, [&] { be_.swiglu_backward(d_a_, d_b_, a.gu, N, I); });
    round(d_a_, N * 2 * I);
    void* ln2 = sp_or(proj_tmp_, a.ln2);
    exchange_forward(ExchangePoint::kMlpIn, a.ln2, ln2, C);
    timed(timer(), times_.matmul_bwd, [&] {
      matmul_backward(d_c_, elem_at(dw, o.gu_w, esz_), dbias(o.gu_b), d_a_, ln2,
                      elem_at(w, o.gu_w, esz_), N, C, 2 * I, false);
    });
    round(d_c_, N * C);
  }
  exchange_backward(ExchangePoint::kMlpIn, dln, d_c_, C);
  timed(timer(), times_.layernorm, [&] {
    be_.rmsnorm_backward(dres_, elem_at(dw, o.ln2_w, esz_), dln, a.res2, elem_at(w, o.ln2_w, esz_),
                         a.ln2_rstd, R, C);
  });
  round(dres_, R * C);
  // Attention: res2 = res_in + o(attention(rope(qkv(ln1(res_in)))))
  exchange_backward(ExchangePoint::kAttentionOut, dres_, dout, C);
  timed(timer(), times_.matmul_bwd, [&] {
    matmul_backward(d_b_, elem_at(dw, o.o_w, esz_), dbias(o.o_b), dout, a.atty,
                    elem_at(w, o.o_w, esz_), N, Q, C, false);
  });
  round(d_b_, N * Q);
  timed(timer(), times_.attention_bwd,
        [&] { attend_backward(d_a_, d_b_, a.qkv, a.atty, a.lse, as); });
  round(d_a_, N * QKV);
  timed(timer(), times_.attention_bwd, [&] {
    be_.rope_backward(d_a_, context_parallel() ? rows_cos_ : rope_cos_,
                      context_parallel() ? rows_sin_ : rope_sin_, as);
  });
  round(d_a_, N * QKV);
  void* ln1 = sp_or(proj_tmp_, a.ln1);
  exchange_forward(ExchangePoint::kAttentionIn, a.ln1, ln1, C);
  timed(timer(), times_.matmul_bwd, [&] {
    matmul_backward(d_c_, elem_at(dw, o.qkv_w, esz_), dbias(o.qkv_b), d_a_, ln1,
                    elem_at(w, o.qkv_w, esz_), N, C, QKV, false);
  });
  round(d_c_, N * C);
  exchange_backward(ExchangePoint::kAttentionIn, dln, d_c_, C);
  timed(timer(), times_.layernorm, [&] {
    be_.rmsnorm_backward(dres_, elem_at(dw, o.ln1_w, esz_), dln, res_in, elem_at(w, o.ln1_w, esz_),
                         a.ln1_rstd, R, C);
  });
  round(dres_, R * C);
}

void Llama::embed(const int32_t* tokens, ParamSource& params) {
  const int C = spec().n_embd;
  const int64_t N = int64_t{B_} * T_;
  const int eu = layout_.embedding_unit();
  const void* we = params.acquire(eu);
  // Every position's embedding (under sequence parallelism into proj_tmp_, then this rank's rows).
  void* emb = sp_or(proj_tmp_, res_[0]);
  timed(timer(), times_.encoder, [&] {
    be_.encoder_forward(emb, tokens, elem_at(we, layout_.wte_offset(), esz_), nullptr, B_, T_, C,
                        nullptr);
  });
  params.release(eu);
  round(emb, N * C);
  exchange_forward(ExchangePoint::kEmbedding, res_[0], emb, C);
}

void Llama::forward_blocks(ParamSource& params) {
  const LayerRange& st = layout_.stage();
  for (int l = st.begin; l < st.end; ++l) {
    if (l + 1 < st.end) prefetch_block(params, l + 1);
    const void* w = acquire_block(params, l);
    block_forward(l, w, res_[static_cast<size_t>(l)], acts_for(l),
                  res_[static_cast<size_t>(l) + 1]);
    release_block(params, l);
  }
}

const void* Llama::forward_to_logits(const int32_t* tokens, ParamSource& params,
                                     const void** emb_unit) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const int eu = layout_.embedding_unit();
  if (first_stage()) embed(tokens, params);
  forward_blocks(params);
  const void* wf = params.acquire(layout_.final_unit());
  timed(timer(), times_.layernorm, [&] {
    be_.rmsnorm_forward(lnf_, lnf_rstd_, res_[static_cast<size_t>(s.n_layer)],
                        elem_at(wf, layout_.lnf_w_offset(), esz_), R, C,
                        static_cast<float>(s.rms_norm_eps));
  });
  round(lnf_, R * C);
  // Under sequence parallelism all N rows of lnf into proj_tmp_ (kept there for the head's
  // backward).
  void* lnf = sp_or(proj_tmp_, lnf_);
  exchange_forward(ExchangePoint::kHeadIn, lnf_, lnf, C);
  const void* we = s.tied() ? params.acquire(eu) : nullptr;
  const void* head = s.tied() ? elem_at(we, layout_.wte_offset(), esz_)
                              : elem_at(wf, layout_.lm_head_offset(), esz_);
  timed(timer(), times_.matmul_fwd,
        [&] { be_.matmul_forward(logits_, lnf, head, nullptr, N, C, Vp); });
  *emb_unit = we;
  return wf;
}

void Llama::stage_forward_impl(ParamSource& params, float dloss, bool hold) {
  if (!last_stage()) {
    if (first_stage()) embed(tokens_, params);
    forward_blocks(params);
    return;
  }
  const void* we = nullptr;
  const void* wf = forward_to_logits(tokens_, params, &we);
  timed(timer(), times_.classifier, [&] { loss_and_dlogits(dloss); });
  forward_phase_done();  // the forward phase ends with the loss
  if (hold) {
    held_emb_ = we;
    held_final_ = wf;
  } else {
    if (we != nullptr) params.release(layout_.embedding_unit());
    params.release(layout_.final_unit());
  }
}

void Llama::stage_backward_impl(ParamSource& params, GradSink& grads, bool held) {
  const ModelSpec& s = spec();
  const int C = s.n_embd, Vp = layout_.local().vocab_rows;
  const int64_t N = int64_t{B_} * T_, R = rows();
  const int eu = layout_.embedding_unit(), fu = layout_.final_unit();
  const LayerRange& st = layout_.stage();
  void* dwe = nullptr;
  if (last_stage()) {
    const void* we = held ? held_emb_ : (s.tied() ? params.acquire(eu) : nullptr);
    const void* wf = held ? held_final_ : params.acquire(fu);
    held_emb_ = held_final_ = nullptr;
    // Head: logits = lnf @ head^T, head = embed_tokens (tied) or lm_head (final unit).
    void* dwf = grad_buffer(grads, fu);
    dwe = s.tied() ? grad_buffer(grads, eu) : nullptr;
    const void* head = s.tied() ? elem_at(we, layout_.wte_offset(), esz_)
                                : elem_at(wf, layout_.lm_head_offset(), esz_);
    void* dhead = s.tied() ? elem_at(dwe, layout_.wte_offset(), esz_)
                           : elem_at(dwf, layout_.lm_head_offset(), esz_);
    void* lnf = sp_or(proj_tmp_, lnf_);  // all N rows of lnf (sequence parallelism: still there)
    timed(timer(), times_.matmul_bwd, [&] {
      matmul_backward(d_c_, dhead, nullptr, logits_, lnf, head, N, C, Vp, false,
                      /*dout_kept=*/true);  // (the slot's logits)
    });
    if (s.tied()) params.release(eu);
    round(d_c_, N * C);
    void* dlnf = sp_or(part_, d_c_);
    exchange_backward(ExchangePoint::kHeadIn, dlnf, d_c_, C);
    be_.memset_zero(dres_, static_cast<size_t>(R * C) * esz_);
    timed(timer(), times_.layernorm, [&] {
      be_.rmsnorm_backward(dres_, elem_at(dwf, layout_.lnf_w_offset(), esz_), dlnf,
                           res_[static_cast<size_t>(s.n_layer)],
                           elem_at(wf, layout_.lnf_w_offset(), esz_), lnf_rstd_, R, C);
    });
    params.release(fu);
    round(dres_, R * C);
    unit_done(grads, fu, dwf);
    if (!first_stage() && dwe != nullptr) {  // the tied embedding's copy: done with the head
      unit_done(grads, eu, dwe);
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
  if (dwe == nullptr) dwe = grad_buffer(grads, eu);
  // The embedding's gradient needs every position's (sequence parallelism: gathered).
  void* demb = sp_or(proj_tmp_, dres_);
  exchange_backward(ExchangePoint::kEmbedding, dres_, demb, C);
  timed(timer(), times_.encoder, [&] {
    be_.encoder_backward(elem_at(dwe, layout_.wte_offset(), esz_), nullptr, demb, tokens_, B_, T_,
                         C, nullptr);
  });
  unit_done(grads, eu, dwe);
}

float Llama::forward_backward_impl(const int32_t* inputs, const int32_t* targets,
                                   ParamSource& params, GradSink& grads, float loss_weight) {
  upload(inputs, targets);
  stage_forward_impl(params, loss_gradient(targets, loss_weight), /*hold=*/true);
  stage_backward_impl(params, grads, /*held=*/true);
  return mean_loss(targets);
}

void Llama::run_to_logits(ParamSource& params) {
  const void* we = nullptr;
  forward_to_logits(tokens_, params, &we);
  round_logits();
  if (we != nullptr) params.release(layout_.embedding_unit());
  params.release(layout_.final_unit());
}

}  // namespace zerod
