#include "model/moe_block.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/moe_router.h"
#include "model/op_timing.h"

namespace zerod {

namespace {
// The widths of a spec's experts on a rank of a tensor group of `tensor`: I (the activation), H
// (the first matmul's output: gate | up for SwiGLU) and the shared experts' Is, Hs (each split
// `tensor` ways as the dense MLP's width).
struct ExpertDims {
  int64_t E, k, C, I, H, Is, Hs;
};
ExpertDims expert_dims(const ModelSpec& s, int tensor) {
  ExpertDims d{};
  d.E = s.moe.num_experts;
  d.k = s.moe.top_k;
  d.C = s.n_embd;
  d.I = s.ffn() / std::max(tensor, 1);
  const int64_t mult = s.llama_family() ? 2 : 1;
  d.H = mult * d.I;
  d.Is = int64_t{s.moe.shared_experts} * d.I;
  d.Hs = mult * d.Is;
  return d;
}
}  // namespace

int64_t MoeLayers::saved_bytes(const ModelSpec& s, int64_t N, int n_moe,
                               bool activation_checkpointing, size_t esz, int tensor,
                               bool keep_input) {
  if (activation_checkpointing || n_moe == 0) return 0;
  const ExpertDims d = expert_dims(s, tensor);
  const int64_t R = N * d.k, e = static_cast<int64_t>(esz);
  // logits, xp, h, a, yp, sh, sa (compute dtype); probs, lse, expert, weight, slot_row,
  // row_token (4 bytes).
  const int64_t layer =
      (N * d.E + R * (2 * d.C + d.H + d.I) + N * (d.Hs + d.Is) + (keep_input ? N * d.C : 0)) * e +
      (N * d.E + N + 3 * N * d.k + R) * 4;
  return n_moe * layer;
}

int64_t MoeLayers::shared_bytes(const ModelSpec& s, int64_t N, bool activation_checkpointing,
                                size_t esz, int tensor, bool keep_input) {
  const ExpertDims d = expert_dims(s, tensor);
  const int64_t R = N * d.k, e = static_cast<int64_t>(esz);
  const int64_t work =
      activation_checkpointing ? saved_bytes(s, N, 1, false, esz, tensor, keep_input) : 0;
  // dlogits (N,E), dyp (R,C), dh, da; dweight (N,k) fp32.
  return work +
         (N * d.E + R * d.C + std::max(R * d.H, N * d.Hs) + std::max(R * d.I, N * d.Is)) * e +
         N * d.k * 4;
}

MoeLayers::ModelBytes MoeLayers::model_bytes(const ModelSpec& s, int64_t N, const LayerRange& stage,
                                             bool activation_checkpointing, size_t esz,
                                             int64_t dense_mlp, int tensor, bool keep_input) {
  ModelBytes b;
  if (!s.moe.enabled()) return b;
  int n_moe = 0;
  for (int l = stage.begin; l < stage.end; ++l) n_moe += s.moe.is_moe_layer(l) ? 1 : 0;
  const bool any_dense = s.moe.moe_layers(s.n_layer) < s.n_layer;
  b.per_slot = saved_bytes(s, N, n_moe, activation_checkpointing, esz, tensor, keep_input) -
               (activation_checkpointing ? 0 : n_moe * dense_mlp);
  b.shared = shared_bytes(s, N, activation_checkpointing, esz, tensor, keep_input) -
             (activation_checkpointing && !any_dense ? dense_mlp : 0);
  return b;
}

MoeLayers::MoeLayers(const ParamLayout& layout, Backend& be, int64_t N,
                     bool activation_checkpointing, int slots, MoeHost host)
    : layout_(layout),
      be_(be),
      host_(std::move(host)),
      esz_(be.compute_elem_size()),
      N_(N),
      checkpointing_(activation_checkpointing) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK(s.moe.enabled(), "MoE layers for a dense model");
  const ExpertDims d = expert_dims(s, layout_.shard().size);
  slots_.resize(static_cast<size_t>(slots));
  const LayerRange& st = layout_.stage();
  for (Slot& sl : slots_) {
    sl.layers.resize(static_cast<size_t>(s.n_layer));
    if (!checkpointing_) {
      for (int l = st.begin; l < st.end; ++l)
        if (s.moe.is_moe_layer(l)) sl.layers[static_cast<size_t>(l)] = make_acts();
    }
  }
  if (checkpointing_) work_ = make_acts();
  const size_t n = static_cast<size_t>(N), R = n * static_cast<size_t>(d.k);
  dlogits_ = host_.act(n * d.E);
  dyp_ = host_.act(R * d.C);
  dh_ = host_.act(std::max(R * d.H, n * d.Hs));
  da_ = host_.act(std::max(R * d.I, n * d.Is));
  dweight_ = host_.stat(n * d.k);
}

void MoeLayers::set_expert_exchange(ExpertExchange* x) {
  if (x != nullptr && x->size() > 1) {
    const int E = layout_.spec().moe.num_experts;
    ZD_CHECK_INPUT(E % x->size() == 0,
                   "{} experts do not split over an expert-parallel group of {} ranks", E,
                   x->size());
  }
  ep_ = x != nullptr && x->size() > 1 ? x : nullptr;
}

MoeLayers::Acts MoeLayers::make_acts() {
  const ExpertDims d = expert_dims(layout_.spec(), layout_.shard().size);
  const size_t n = static_cast<size_t>(N_), R = n * static_cast<size_t>(d.k);
  auto ints = [&](size_t elems) { return reinterpret_cast<int32_t*>(host_.stat(elems)); };
  Acts a;
  a.logits = host_.act(n * d.E);
  a.probs = host_.stat(n * d.E);
  a.lse = host_.stat(n);
  a.expert = ints(n * d.k);
  a.weight = host_.stat(n * d.k);
  a.slot_row = ints(n * d.k);
  a.row_token = ints(R);
  a.xp = host_.act(R * d.C);
  a.h = host_.act(R * d.H);
  a.a = host_.act(R * d.I);
  a.yp = host_.act(R * d.C);
  if (d.Is > 0) {
    a.sh = host_.act(n * d.Hs);
    a.sa = host_.act(n * d.Is);
  }
  if (host_.sequence_parallel) a.x = host_.act(n * d.C);
  a.offsets.assign(static_cast<size_t>(d.E) + 1, 0);
  a.counts.assign(static_cast<size_t>(d.E), 0);
  a.kept.assign(static_cast<size_t>(d.E), 0);
  return a;
}

MoeLayers::Acts& MoeLayers::acts_for(int l) {
  if (checkpointing_) return work_;
  Acts& a = slots_.at(static_cast<size_t>(slot_)).layers.at(static_cast<size_t>(l));
  ZD_CHECK(a.logits != nullptr, "layer {} is not a MoE layer of this model", l);
  return a;
}

int MoeLayers::totals_size() const {
  const MoeSpec& m = layout_.spec().moe;
  if (layout_.whole_model() || m.aux_loss != MoeAuxLoss::kHuggingFace || m.aux_loss_coef == 0)
    return 0;
  return 2 * m.num_experts + 1;
}

void MoeLayers::totals(int slot, double* out) const {
  const Slot& sl = slots_.at(static_cast<size_t>(slot));
  const size_t E = sl.total_counts.size();
  const bool carry = !sl.final && !sl.carried_counts.empty();
  for (size_t e = 0; e < E; ++e) {
    out[e] = static_cast<double>(sl.total_counts[e] + (carry ? sl.carried_counts[e] : 0));
    out[E + e] = sl.total_prob_sum[e] + (carry ? sl.carried_prob_sum[e] : 0.0);
  }
  out[2 * E] = static_cast<double>(sl.total_tokens + (carry ? sl.carried_tokens : 0));
}

void MoeLayers::set_totals(int slot, const double* in, bool final) {
  Slot& sl = slots_.at(static_cast<size_t>(slot));
  const size_t E = static_cast<size_t>(layout_.spec().moe.num_experts);
  std::vector<int64_t>& counts = final ? sl.total_counts : sl.carried_counts;
  std::vector<double>& probs = final ? sl.total_prob_sum : sl.carried_prob_sum;
  counts.resize(E);
  probs.resize(E);
  for (size_t e = 0; e < E; ++e) {
    counts[e] = static_cast<int64_t>(in[e]);
    probs[e] = in[E + e];
  }
  (final ? sl.total_tokens : sl.carried_tokens) = static_cast<int64_t>(in[2 * E]);
  sl.final = final;
}

void MoeLayers::begin_forward(bool training, float loss_weight) {
  Slot& sl = slots_.at(static_cast<size_t>(slot_));
  sl.training = training;
  sl.loss_weight = loss_weight;
  sl.final = false;  // (the carried sums stay: they arrived before this forward)
  const size_t E = static_cast<size_t>(layout_.spec().moe.num_experts);
  sl.total_counts.assign(E, 0);
  sl.total_prob_sum.assign(E, 0.0);
  sl.total_tokens = 0;
  sl.z_sum = sl.aux_sum = 0;
  sl.order.clear();
  sl.kept.clear();
  sl.dropped.clear();
  sl.layer_aux.clear();
  sl.layer_z.clear();
}

void MoeLayers::forward(int l, const void* w, const void* ew, const void* x, void* y, int64_t n) {
  const ModelSpec& s = layout_.spec();
  const ExpertDims d = expert_dims(s, layout_.shard().size);
  const int E = static_cast<int>(d.E), k = static_cast<int>(d.k), C = static_cast<int>(d.C);
  ZD_CHECK(n <= N_, "{} rows into MoE layers sized for {}", n, N_);
  const ParamLayout::MoeBlockOffsets& o = layout_.moe_block();
  Slot& sl = slots_.at(static_cast<size_t>(slot_));
  const MoeRouterOptions opt = s.moe.router(sl.training);
  const bool recompute = std::find(sl.order.begin(), sl.order.end(), l) != sl.order.end();
  Acts& a = acts_for(l);
  a.n = n;
  if (a.x != nullptr) be_.copy(a.x, x, static_cast<size_t>(n * C) * esz_);
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  auto at = [&](int64_t off) -> const void* { return off >= 0 ? elem_at(w, off, esz_) : nullptr; };
  timed(tm, t.matmul_fwd, [&] { be_.matmul_forward(a.logits, x, at(o.gate_w), nullptr, n, C, E); });
  host_.round(a.logits, n * E);
  timed(tm, t.moe, [&] {
    a.stats = be_.moe_router_forward(a.probs, a.lse, a.expert, a.weight, a.counts.data(),
                                     a.kept.data(), a.logits, n, opt);
  });
  int64_t R = 0;
  timed(tm, t.moe, [&] {
    R = be_.moe_permute_plan(a.offsets.data(), a.row_token, a.slot_row, a.expert, n, k, E);
    be_.moe_permute_forward(a.xp, x, a.row_token, R, C);
  });
  if (ep_ != nullptr) {
    dispatch_forward(a, ew, R);
  } else {
    experts_forward(ew, a.xp, a.h, a.a, a.yp, a.offsets.data(), E, 0, R);
  }
  timed(tm, t.moe, [&] { be_.moe_unpermute_forward(y, a.yp, a.weight, a.slot_row, n, k, C); });
  host_.round(y, n * C);
  if (d.Is > 0) {  // shared experts: y += down(act(up(x))), every token
    const int Is = static_cast<int>(d.Is), Hs = static_cast<int>(d.Hs);
    timed(tm, t.matmul_fwd,
          [&] { be_.matmul_forward(a.sh, x, at(o.shared_w13), at(o.shared_b13), n, C, Hs); });
    host_.round(a.sh, n * Hs);
    timed(tm, t.gelu, [&] {
      if (swiglu()) {
        be_.swiglu_forward(a.sa, a.sh, n, Is);
      } else {
        be_.gelu_forward(a.sa, a.sh, n * Is);
      }
    });
    host_.round(a.sa, n * Is);
    // The shared output into dyp_ (free in forward), then added to y.
    timed(tm, t.matmul_fwd,
          [&] { be_.matmul_forward(dyp_, a.sa, at(o.shared_w2), at(o.shared_b2), n, Is, C); });
    host_.round(dyp_, n * C);
    timed(tm, t.residual, [&] { be_.residual_forward(y, y, dyp_, n * C); });
    host_.round(y, n * C);
  }
  if (recompute) return;
  // The probabilities' column sums for Hugging Face's all-layer aux loss (its value only: the
  // backward needs the counts alone).
  std::vector<float> probs(static_cast<size_t>(n * E));
  be_.copy(probs.data(), a.probs, probs.size() * sizeof(float));
  std::vector<double> psum(static_cast<size_t>(E), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int e = 0; e < E; ++e)
      psum[static_cast<size_t>(e)] += probs[static_cast<size_t>(r * E + e)];
  std::vector<int64_t> counts(a.counts.begin(), a.counts.end());
  int64_t rows = n;
  double aux = a.stats.aux_loss, z = a.stats.z_loss;
  if (host_.context_sum) {
    // The whole micro-batch's statistics: counts, probability sums, z-loss sum and rows summed
    // over the context group (every rank then has the layer's losses and their gradients' sums).
    std::vector<double> g(static_cast<size_t>(2 * E + 2));
    for (int e = 0; e < E; ++e) {
      g[static_cast<size_t>(e)] = static_cast<double>(counts[static_cast<size_t>(e)]);
      g[static_cast<size_t>(E + e)] = psum[static_cast<size_t>(e)];
    }
    g[static_cast<size_t>(2 * E)] = z * static_cast<double>(n);
    g[static_cast<size_t>(2 * E + 1)] = static_cast<double>(n);
    timed(tm, t.moe, [&] { host_.context_sum(g.data(), static_cast<int64_t>(g.size())); });
    for (int e = 0; e < E; ++e) {
      counts[static_cast<size_t>(e)] = static_cast<int64_t>(g[static_cast<size_t>(e)]);
      psum[static_cast<size_t>(e)] = g[static_cast<size_t>(E + e)];
    }
    rows = static_cast<int64_t>(g[static_cast<size_t>(2 * E + 1)]);
    z = rows > 0 ? g[static_cast<size_t>(2 * E)] / static_cast<double>(rows) : 0.0;
    aux = cpu::moe_load_balancing_loss(counts.data(), psum.data(), rows, opt);
  }
  sl.layer_counts.resize(static_cast<size_t>(s.n_layer));
  sl.layer_rows.resize(static_cast<size_t>(s.n_layer), 0);
  sl.layer_counts[static_cast<size_t>(l)] = counts;
  sl.layer_rows[static_cast<size_t>(l)] = rows;
  for (int e = 0; e < E; ++e) {
    sl.total_prob_sum[static_cast<size_t>(e)] += psum[static_cast<size_t>(e)];
    sl.total_counts[static_cast<size_t>(e)] += counts[static_cast<size_t>(e)];
  }
  sl.total_tokens += rows;
  sl.z_sum += z;
  sl.aux_sum += aux;
  sl.order.push_back(l);
  sl.kept.push_back(a.kept);  // (this rank's rows: the metrics sum them over the ranks)
  sl.dropped.push_back(a.stats.dropped);
  sl.layer_aux.push_back(aux);
  sl.layer_z.push_back(z);
  sl.tokens = n;
}

void MoeLayers::backward(int l, const void* w, void* dw, const void* ew, void* dew, const void* x,
                         const void* dy, void* dx) {
  const ModelSpec& s = layout_.spec();
  const ExpertDims d = expert_dims(s, layout_.shard().size);
  const int E = static_cast<int>(d.E), k = static_cast<int>(d.k), C = static_cast<int>(d.C);
  const ParamLayout::MoeBlockOffsets& o = layout_.moe_block();
  const Slot& sl = slots_.at(static_cast<size_t>(slot_));
  const MoeRouterOptions opt = s.moe.router(sl.training);
  const float loss_weight = sl.loss_weight;
  const Acts& a = acts_for(l);
  const int64_t n = a.n, R = a.offsets.back();
  if (a.x != nullptr) x = a.x;  // sequence parallelism: the gathered input kept in forward
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  auto at = [&](int64_t off) -> const void* { return off >= 0 ? elem_at(w, off, esz_) : nullptr; };
  auto dat = [&](int64_t off) -> void* { return off >= 0 ? elem_at(dw, off, esz_) : nullptr; };
  timed(tm, t.moe, [&] {
    be_.moe_unpermute_backward(dyp_, dweight_, dy, a.yp, a.weight, a.slot_row, n, k, C);
  });
  host_.round(dyp_, R * C);
  // Tensor parallelism: each rank's expert outputs are partial sums over its slice of the
  // experts' width, and so is the combine weights' gradient (dy . yp): summed over the group.
  const bool tensor_parallel = layout_.shard().size > 1;
  if (tensor_parallel) host_.tensor_sum(dweight_, n * k);
  if (ep_ != nullptr) {
    dispatch_backward(a, ew, dew);
  } else {  // dxp into dyp_ (read first)
    experts_backward(ew, dew, a.xp, a.h, a.a, dyp_, dyp_, da_, dh_, a.offsets.data(), E, 0, R);
  }
  be_.memset_zero(dx, static_cast<size_t>(n * C) * esz_);
  timed(tm, t.moe, [&] { be_.moe_permute_backward(dx, dyp_, a.slot_row, n, k, C); });
  if (d.Is > 0) {
    const int Is = static_cast<int>(d.Is), Hs = static_cast<int>(d.Hs);
    timed(tm, t.matmul_bwd, [&] {
      be_.matmul_backward(da_, dat(o.shared_w2), dat(o.shared_b2), dy, a.sa, at(o.shared_w2), n, Is,
                          C, false);
    });
    host_.round(da_, n * Is);
    timed(tm, t.gelu, [&] {
      if (swiglu()) {
        be_.swiglu_backward(dh_, da_, a.sh, n, Is);
      } else {
        be_.gelu_backward(dh_, a.sh, da_, n * Is);
      }
    });
    host_.round(dh_, n * Hs);
    timed(tm, t.matmul_bwd, [&] {
      be_.matmul_backward(dx, dat(o.shared_w13), dat(o.shared_b13), dh_, x, at(o.shared_w13), n, C,
                          Hs, true);
    });
  }
  // The router: the combine weights' gradient plus the aux and z losses.
  MoeRouterLossGrad lg;
  lg.aux_coef = static_cast<float>(s.moe.aux_loss_coef) * loss_weight;
  lg.z_coef = static_cast<float>(s.moe.z_loss_coef) * loss_weight;
  // The layer's own counts and rows (DeepSpeed's per-layer loss), or Hugging Face's over every
  // layer (a pipeline stage's: the whole model's sums, received back or carried in on the last
  // stage); the z-loss over the layer's rows.
  const int64_t rows = sl.layer_rows.at(static_cast<size_t>(l));
  lg.aux_counts = sl.layer_counts.at(static_cast<size_t>(l)).data();
  lg.aux_tokens = rows;
  lg.z_tokens = rows;
  std::vector<int64_t> whole_counts;
  if (s.moe.aux_loss == MoeAuxLoss::kHuggingFace) {
    std::vector<double> whole(static_cast<size_t>(2 * E + 1));
    totals(slot_, whole.data());
    whole_counts.assign(whole.begin(), whole.begin() + E);
    lg.aux_counts = whole_counts.data();
    lg.aux_tokens = static_cast<int64_t>(whole[static_cast<size_t>(2 * E)]);
  }
  timed(tm, t.moe,
        [&] { be_.moe_router_backward(dlogits_, dweight_, a.probs, a.lse, a.expert, n, opt, lg); });
  host_.round(dlogits_, n * E);
  // The router is replicated: every tensor rank computes the same gradients through it, which
  // the tensor group's sums must count once. Without sequence parallelism (the group sums the
  // input gradient, not the replicated weights') rank 0 adds the input gradient and the others
  // compute it into a scratch buffer (dyp_, free now) for the weight gradient; with it (the group
  // sums both) each rank takes its part's rows [r n/T, (r+1) n/T) of both.
  const TensorShard& sh = layout_.shard();
  int64_t r0 = 0, rn = n;
  if (host_.sequence_parallel) {
    rn = n / sh.size;
    r0 = sh.rank * rn;
  }
  const bool router_dx = !tensor_parallel || host_.sequence_parallel || sh.rank == 0;
  timed(tm, t.matmul_bwd, [&] {
    be_.matmul_backward(router_dx ? elem_at(dx, r0 * C, esz_) : dyp_, dat(o.gate_w), nullptr,
                        elem_at(dlogits_, r0 * E, esz_), elem_at(x, r0 * C, esz_), at(o.gate_w),
                        static_cast<int>(rn), C, E, router_dx);
  });
  host_.round(dx, n * C);
}

MoeStepStats MoeLayers::stats() const {
  const ModelSpec& s = layout_.spec();
  const Slot& sl = slots_.at(static_cast<size_t>(slot_));
  MoeStepStats st;
  st.layers = sl.order;
  st.tokens = static_cast<int>(sl.tokens);
  st.kept = sl.kept;
  st.dropped = sl.dropped;
  st.layer_aux = sl.layer_aux;
  st.layer_z = sl.layer_z;
  const int n = s.moe.num_experts;
  if (s.moe.aux_loss == MoeAuxLoss::kHuggingFace) {
    // (On a pipeline stage: over the layers up to this stage's, the whole model's on the last.)
    std::vector<double> t(static_cast<size_t>(2 * n + 1));
    totals(slot_, t.data());
    const double T = t[static_cast<size_t>(2 * n)];
    double sum = 0;
    for (int e = 0; e < n; ++e) sum += (t[e] / T) * (t[static_cast<size_t>(n + e)] / T);
    st.aux_loss = T > 0 ? n * sum : 0.0;
  } else {
    st.aux_loss = sl.aux_sum;
  }
  st.z_loss = sl.z_sum;
  st.objective = s.moe.aux_loss_coef * st.aux_loss + s.moe.z_loss_coef * st.z_loss;
  return st;
}

int64_t MoeLayers::stored_expert(int first, int experts) const {
  const int lo = layout_.first_expert();
  ZD_CHECK(lo <= first && first + experts <= lo + layout_.local_experts(),
           "experts [{}, {}) are not among the [{}, {}) this rank stores", first, first + experts,
           lo, lo + layout_.local_experts());
  return first - lo;
}

void MoeLayers::experts_forward(const void* w, const void* x, void* h, void* act, void* out,
                                const int64_t* offsets, int experts, int first, int64_t R) {
  const ExpertDims d = expert_dims(layout_.spec(), layout_.shard().size);
  const int C = static_cast<int>(d.C), I = static_cast<int>(d.I), H = static_cast<int>(d.H);
  const ParamLayout::MoeBlockOffsets& o = layout_.moe_block();
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  // Expert e's tensors lie (e - the unit's first expert) x expert_stride after the first's.
  const int64_t skip = stored_expert(first, experts) * o.expert_stride;
  auto at = [&](int64_t off) -> const void* {
    return off >= 0 ? elem_at(w, off + skip, esz_) : nullptr;
  };
  const int64_t stride = o.expert_stride;
  timed(tm, t.matmul_fwd, [&] {
    be_.grouped_matmul_forward(h, x, at(o.w13), at(o.b13), offsets, experts, C, H, stride, stride);
  });
  host_.round(h, R * H);
  timed(tm, t.gelu, [&] {
    if (swiglu()) {
      be_.swiglu_forward(act, h, R, I);
    } else {
      be_.gelu_forward(act, h, R * I);
    }
  });
  host_.round(act, R * I);
  timed(tm, t.matmul_fwd, [&] {
    be_.grouped_matmul_forward(out, act, at(o.w2), at(o.b2), offsets, experts, I, C, stride,
                               stride);
  });
  host_.round(out, R * C);
}

void MoeLayers::experts_backward(const void* w, void* dw, const void* x, const void* h,
                                 const void* act, const void* dout, void* dx, void* da, void* dh,
                                 const int64_t* offsets, int experts, int first, int64_t R) {
  const ExpertDims d = expert_dims(layout_.spec(), layout_.shard().size);
  const int C = static_cast<int>(d.C), I = static_cast<int>(d.I), H = static_cast<int>(d.H);
  const ParamLayout::MoeBlockOffsets& o = layout_.moe_block();
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  const int64_t skip = stored_expert(first, experts) * o.expert_stride;
  auto at = [&](int64_t off) -> const void* {
    return off >= 0 ? elem_at(w, off + skip, esz_) : nullptr;
  };
  auto dat = [&](int64_t off) -> void* {
    return off >= 0 ? elem_at(dw, off + skip, esz_) : nullptr;
  };
  const int64_t stride = o.expert_stride;
  timed(tm, t.matmul_bwd, [&] {
    be_.grouped_matmul_backward(da, dat(o.w2), dat(o.b2), dout, act, at(o.w2), offsets, experts, I,
                                C, false, stride, stride);
  });
  host_.round(da, R * I);
  timed(tm, t.gelu, [&] {
    if (swiglu()) {
      be_.swiglu_backward(dh, da, h, R, I);
    } else {
      be_.gelu_backward(dh, h, da, R * I);
    }
  });
  host_.round(dh, R * H);
  timed(tm, t.matmul_bwd, [&] {
    be_.grouped_matmul_backward(dx, dat(o.w13), dat(o.b13), dh, x, at(o.w13), offsets, experts, C,
                                H, false, stride, stride);
  });
  host_.round(dx, R * C);
}

namespace {
// Expert parallelism's blocks: the rows of (source rank s, local expert j) arrive source-major
// (s, then j) and the grouped matmul wants them expert-major (j, then s). Copies every block
// between the two orders (to_expert_major: source-major src into expert-major dst; else back).
// counts (P x El): rows of block (s, j) at s El + j.
void regroup(Backend& be, void* dst, const void* src, const std::vector<int64_t>& counts, int P,
             int El, int64_t width, size_t esz, bool to_expert_major) {
  std::vector<int64_t> src_major(counts.size()), expert_major(counts.size());
  int64_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {  // s-major order is the array's
    src_major[i] = off;
    off += counts[i];
  }
  off = 0;
  for (int j = 0; j < El; ++j) {
    for (int s = 0; s < P; ++s) {
      const size_t i = static_cast<size_t>(s) * El + j;
      expert_major[i] = off;
      off += counts[i];
    }
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const int64_t from = to_expert_major ? src_major[i] : expert_major[i];
    const int64_t to = to_expert_major ? expert_major[i] : src_major[i];
    be.copy(elem_at(dst, to * width, esz), elem_at(src, from * width, esz),
            static_cast<size_t>(counts[i] * width) * esz);
  }
}
}  // namespace

void MoeLayers::dispatch_forward(Acts& a, const void* w, int64_t R) {
  const ExpertDims d = expert_dims(layout_.spec(), layout_.shard().size);
  const int E = static_cast<int>(d.E), P = ep_->size(), r = ep_->rank(), El = E / P;
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  // The counts: this rank's rows per expert out, the group's rows per local expert in.
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) counts[e] = a.offsets[e + 1] - a.offsets[e];
  a.ep_recv.assign(static_cast<size_t>(E), 0);
  timed(tm, t.moe, [&] { ep_->exchange_counts(counts.data(), a.ep_recv.data(), E); });
  a.ep_send_rows.assign(static_cast<size_t>(P), 0);
  a.ep_recv_rows.assign(static_cast<size_t>(P), 0);
  a.ep_offsets.assign(static_cast<size_t>(El) + 1, 0);
  for (int p = 0; p < P; ++p) {
    a.ep_send_rows[p] = a.offsets[(p + 1) * El] - a.offsets[p * El];
    for (int j = 0; j < El; ++j) {
      a.ep_recv_rows[p] += a.ep_recv[static_cast<size_t>(p) * El + j];
      a.ep_offsets[j + 1] += a.ep_recv[static_cast<size_t>(p) * El + j];
    }
  }
  for (int j = 0; j < El; ++j) a.ep_offsets[j + 1] += a.ep_offsets[j];
  const int64_t Rl = a.ep_offsets.back();
  ZD_CHECK(R == a.offsets.back(), "{} permuted rows, offsets end at {}", R, a.offsets.back());
  const size_t row = static_cast<size_t>(d.C) * esz_;
  auto grow = [](std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
  };
  grow(ep_rows_, static_cast<size_t>(std::max(Rl, int64_t{1})) * row);
  grow(ep_d_, static_cast<size_t>(std::max(Rl, int64_t{1})) * row);
  a.xl.resize(static_cast<size_t>(std::max(Rl, int64_t{1})) * row);
  a.hl.resize(static_cast<size_t>(std::max(Rl, int64_t{1}) * d.H) * esz_);
  a.al.resize(static_cast<size_t>(std::max(Rl, int64_t{1}) * d.I) * esz_);
  // Dispatch: rank p's experts' rows (one block of xp) to rank p; regroup by local expert.
  timed(tm, t.moe, [&] {
    ep_->all_to_all_v(a.xp, a.ep_send_rows.data(), ep_rows_.data(), a.ep_recv_rows.data(), d.C);
    regroup(be_, a.xl.data(), ep_rows_.data(), a.ep_recv, P, El, d.C, esz_, true);
  });
  experts_forward(w, a.xl.data(), a.hl.data(), a.al.data(), ep_d_.data(), a.ep_offsets.data(), El,
                  r * El, Rl);
  // Combine: the outputs back to the ranks whose tokens they are, in their xp order.
  timed(tm, t.moe, [&] {
    regroup(be_, ep_rows_.data(), ep_d_.data(), a.ep_recv, P, El, d.C, esz_, false);
    ep_->all_to_all_v(ep_rows_.data(), a.ep_recv_rows.data(), a.yp, a.ep_send_rows.data(), d.C);
  });
}

void MoeLayers::dispatch_backward(const Acts& a, const void* w, void* dw) {
  const ExpertDims d = expert_dims(layout_.spec(), layout_.shard().size);
  const int E = static_cast<int>(d.E), P = ep_->size(), r = ep_->rank(), El = E / P;
  OpTimes& t = *host_.times;
  Backend* tm = host_.timer();
  const int64_t Rl = a.ep_offsets.back();
  const size_t rows = static_cast<size_t>(std::max(Rl, int64_t{1}));
  auto grow = [](std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
  };
  grow(ep_rows_, rows * d.C * esz_);
  grow(ep_d_, rows * d.C * esz_);
  grow(ep_dh_, rows * d.H * esz_);
  grow(ep_da_, rows * d.I * esz_);
  // dyp (R,C) to the experts' ranks, as the forward's rows went.
  timed(tm, t.moe, [&] {
    ep_->all_to_all_v(dyp_, a.ep_send_rows.data(), ep_rows_.data(), a.ep_recv_rows.data(), d.C);
    regroup(be_, ep_d_.data(), ep_rows_.data(), a.ep_recv, P, El, d.C, esz_, true);
  });
  // dxl over dyl (read first).
  experts_backward(w, dw, a.xl.data(), a.hl.data(), a.al.data(), ep_d_.data(), ep_d_.data(),
                   ep_da_.data(), ep_dh_.data(), a.ep_offsets.data(), El, r * El, Rl);
  // dxp back to the tokens' ranks, into dyp_.
  timed(tm, t.moe, [&] {
    regroup(be_, ep_rows_.data(), ep_d_.data(), a.ep_recv, P, El, d.C, esz_, false);
    ep_->all_to_all_v(ep_rows_.data(), a.ep_recv_rows.data(), dyp_, a.ep_send_rows.data(), d.C);
  });
}

}  // namespace zerod
