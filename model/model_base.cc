#include "model/model_base.h"

#include <cmath>

#include "core/error.h"
#include "model/document_mask.h"
#include "model/op_timing.h"

namespace zerod {

ModelBase::ModelBase(const ModelSpec& spec, Backend& backend, int B, int T,
                     bool activation_checkpointing, MemoryTracker* tracker, TensorShard shard,
                     ContextShard context, LayerRange stage, int slots)
    : layout_(spec, 16, shard, stage),
      be_(backend),
      B_(B),
      T_(T),
      checkpointing_(activation_checkpointing),
      rounding_(backend.compute_dtype() != DType::kF32 &&
                backend.compute_elem_size() == sizeof(float)),
      esz_(backend.compute_elem_size()),
      tracker_(tracker),
      exchange_(&identity_),
      context_(context),
      seq_(T) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK(B > 0 && T > 0 && T <= s.seq_len, "micro-batch {}x{} (seq_len {})", B, T, s.seq_len);
  if (context_parallel()) {
    positions_ = context_positions(T, context);  // (InputError when T does not split 2C ways)
    T_ = T / context.size;
    for (int i = 0; i < T_; ++i) {
      const int p = positions_[static_cast<size_t>(i)];
      if (i > 0 && p == positions_[static_cast<size_t>(i) - 1] + 1) {
        ++position_runs_.back().len;
      } else {
        position_runs_.push_back({i, p, 1});
      }
    }
  }
  const size_t N = static_cast<size_t>(B) * T_;
  ZD_CHECK_INPUT(!sequence_parallel() || N % static_cast<size_t>(shard.size) == 0,
                 "sequence parallelism over {} tensor ranks: the {} x {} = {} positions of a "
                 "micro-batch (sequences x tokens{}) do not split into {} equal parts ({} is not a "
                 "multiple of {})",
                 shard.size, B, T_, N, context_parallel() ? " of this context rank" : "",
                 shard.size, N, shard.size);
  ZD_CHECK(slots >= 1, "{} activation slots", slots);
  const LayerRange& st = layout_.stage();
  const size_t R = static_cast<size_t>(rows()), C = static_cast<size_t>(s.n_embd);
  slots_.resize(static_cast<size_t>(slots));
  for (Slot& sl : slots_) {
    if (last_stage()) sl.logits = act(N * static_cast<size_t>(layout_.local().vocab_rows));
    sl.losses = stat(N);
    sl.tokens = reinterpret_cast<int32_t*>(stat(N));  // (4-byte elements, as floats)
    sl.targets = reinterpret_cast<int32_t*>(stat(N));
    if (tensor_parallel()) sl.loss_stats = stat(3 * N);
    sl.res.assign(static_cast<size_t>(s.n_layer) + 1, nullptr);
    for (int l = st.begin; l <= st.end; ++l) sl.res[static_cast<size_t>(l)] = act(R * C);
  }
  dres_ = act(R * C);
  deferred_.resize(static_cast<size_t>(slots));
  if (tensor_parallel()) host_tokens_.resize(N);
  host_losses_.resize(N);
  // (The derived class selects slot 0 once its own buffers exist.)
  logits_ = slots_[0].logits;
  losses_ = slots_[0].losses;
  tokens_ = slots_[0].tokens;
  targets_ = slots_[0].targets;
  loss_stats_ = slots_[0].loss_stats;
  res_ = slots_[0].res;
  if (s.moe.enabled()) {
    // (Context parallelism: dropless only; capacity ranks the whole micro-batch's tokens.)
    ZD_CHECK_INPUT(!context_parallel() || !s.moe.drop_tokens,
                   "mixture-of-experts layers with capacity (drop_tokens) are not supported with "
                   "context parallelism (context {}): use dropless",
                   context.size);
    MoeHost host;
    host.act = [this](size_t n) { return act(n); };
    host.stat = [this](size_t n) { return stat(n); };
    host.round = [this](void* x, int64_t n) { round(x, n); };
    host.timer = [this] { return timer(); };
    host.times = &times_;
    host.tensor_sum = [this](float* x, int64_t n) { exchange_->loss_sum(x, n); };
    host.sequence_parallel = sequence_parallel();
    if (context_parallel())
      host.context_sum = [this](double* x, int64_t n) { exchange_->context_sum(x, n); };
    moe_ = std::make_unique<MoeLayers>(layout_, be_, static_cast<int64_t>(N), checkpointing_, slots,
                                       std::move(host));
  }
}

void ModelBase::select_slot(int k) {
  ZD_CHECK(k >= 0 && k < slots(), "activation slot {} of {}", k, slots());
  const Slot& sl = slots_[static_cast<size_t>(k)];
  logits_ = sl.logits;
  losses_ = sl.losses;
  tokens_ = sl.tokens;
  targets_ = sl.targets;
  doc_start_ = sl.doc_start;
  loss_stats_ = sl.loss_stats;
  res_ = sl.res;
  slot_ = k;
  if (moe_) moe_->select_slot(k);
  select_saved(k);
}

void* ModelBase::stage_input(int slot) {
  ZD_CHECK(!first_stage(), "stage_input on the first pipeline stage");
  return slots_.at(static_cast<size_t>(slot)).res[static_cast<size_t>(layout_.stage().begin)];
}

const void* ModelBase::stage_output(int slot) {
  ZD_CHECK(!last_stage(), "stage_output on the last pipeline stage");
  return slots_.at(static_cast<size_t>(slot)).res[static_cast<size_t>(layout_.stage().end)];
}

void* ModelBase::stage_output_grad() {
  ZD_CHECK(!last_stage(), "stage_output_grad on the last pipeline stage");
  return dres_;
}

const void* ModelBase::stage_input_grad() {
  ZD_CHECK(!first_stage(), "stage_input_grad on the first pipeline stage");
  return dres_;
}

float ModelBase::stage_forward(int slot, const int32_t* inputs, const int32_t* targets,
                               ParamSource& params, float loss_weight) {
  select_slot(slot);
  take_rows(inputs, targets);  // (context parallelism: this rank's positions)
  upload(inputs, targets);
  if (moe_) moe_->begin_forward(true, loss_weight);
  const float dloss = last_stage() ? loss_gradient(targets, loss_weight) : 0.0f;
  stage_forward_impl(params, dloss, /*hold=*/false);
  return last_stage() ? mean_loss(targets) : 0.0f;
}

void ModelBase::stage_backward(int slot, ParamSource& params, GradSink& grads) {
  select_slot(slot);
  stage_backward_impl(params, grads, /*held=*/false);
}

void ModelBase::stage_backward_input(int slot, ParamSource& params, GradSink& grads) {
  select_slot(slot);
  std::vector<Deferred>& d = deferred_.at(static_cast<size_t>(slot));
  ZD_CHECK(d.empty(), "stage_backward_input of slot {} again before its stage_backward_weight",
           slot);
  split_ = &d;
  split_bases_.clear();
  try {
    stage_backward_impl(params, grads, /*held=*/false);
  } catch (...) {
    split_ = nullptr;
    throw;
  }
  split_ = nullptr;
}

void ModelBase::stage_backward_weight(int slot, GradSink& grads) {
  std::vector<Deferred>& d = deferred_.at(static_cast<size_t>(slot));
  auto free_stash = [&](int i) {
    if (i >= 0) stash_busy_[static_cast<size_t>(i)] = false;
  };
  try {
    for (const Deferred& op : d) {
      char* g = static_cast<char*>(grads.grad_buffer(op.unit));
      if (op.offset < 0) {
        round(g, layout_.unit(op.unit).numel);
        grads.unit_done(op.unit);
        continue;
      }
      const void* dout = op.dout >= 0 ? stash_[static_cast<size_t>(op.dout)].data() : op.dout_ptr;
      timed(timer(), times_.matmul_bwd, [&] {
        be_.matmul_backward(nullptr, g + op.offset, nullptr, dout,
                            stash_[static_cast<size_t>(op.inp)].data(), nullptr, op.N, op.C, op.OC,
                            false);
      });
      free_stash(op.dout);
      free_stash(op.inp);
    }
  } catch (...) {
    for (const Deferred& op : d) free_stash(op.dout), free_stash(op.inp);
    d.clear();
    throw;
  }
  d.clear();
}

void ModelBase::prefetch_block(ParamSource& params, int l) {
  params.prefetch(layout_.block_unit(l));
  if (const int e = layout_.experts_unit(l); e >= 0) params.prefetch(e);
}

const void* ModelBase::acquire_block(ParamSource& params, int l) {
  const void* w = params.acquire(layout_.block_unit(l));
  const int e = layout_.experts_unit(l);
  experts_w_ = e >= 0 ? params.acquire(e) : nullptr;
  return w;
}

void ModelBase::release_block(ParamSource& params, int l) {
  if (const int e = layout_.experts_unit(l); e >= 0) params.release(e);
  params.release(layout_.block_unit(l));
  experts_w_ = nullptr;
}

void* ModelBase::block_grads(GradSink& grads, int l) {
  void* dw = grad_buffer(grads, layout_.block_unit(l));
  const int e = layout_.experts_unit(l);
  experts_dw_ = e >= 0 ? grad_buffer(grads, e) : nullptr;
  return dw;
}

void ModelBase::block_done(GradSink& grads, int l, void* dw) {
  if (const int e = layout_.experts_unit(l); e >= 0) unit_done(grads, e, experts_dw_);
  unit_done(grads, layout_.block_unit(l), dw);
  experts_dw_ = nullptr;
}

void* ModelBase::grad_buffer(GradSink& grads, int u) {
  void* g = grads.grad_buffer(u);
  if (split_ != nullptr) split_bases_.emplace_back(u, static_cast<const char*>(g));
  return g;
}

void ModelBase::matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                const void* inp, const void* weight, int64_t N, int C, int OC,
                                bool accumulate_dinp, bool dout_kept) {
  if (split_ == nullptr || dweight == nullptr) {
    be_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, accumulate_dinp);
    return;
  }
  be_.matmul_backward(dinp, nullptr, dbias, dout, inp, weight, N, C, OC, accumulate_dinp);
  Deferred op;
  const char* p = static_cast<const char*>(dweight);
  bool found = false;
  for (const auto& [u, base] : split_bases_) {
    const int64_t bytes = layout_.unit(u).numel * static_cast<int64_t>(esz_);
    if (p >= base && p < base + bytes) {
      op.unit = u;
      op.offset = p - base;
      found = true;
      break;
    }
  }
  ZD_CHECK(found, "split backward: a weight gradient outside the units' gradient buffers");
  op.N = N;
  op.C = C;
  op.OC = OC;
  if (dout_kept) {
    op.dout_ptr = dout;
  } else {
    op.dout = stash(dout, static_cast<size_t>(N * OC) * esz_);
  }
  op.inp = stash(inp, static_cast<size_t>(N * C) * esz_);
  split_->push_back(op);
}

void ModelBase::unit_done(GradSink& grads, int u, void* dw) {
  if (split_ != nullptr) {
    Deferred op;
    op.unit = u;
    split_->push_back(op);
    return;
  }
  round(dw, layout_.unit(u).numel);
  grads.unit_done(u);
}

int ModelBase::stash(const void* src, size_t bytes) {
  int i = -1;
  for (size_t k = 0; k < stash_.size() && i < 0; ++k)
    if (!stash_busy_[k] && stash_[k].bytes() == bytes) i = static_cast<int>(k);
  if (i < 0) {
    stash_.push_back(be_.allocate(bytes, MemCategory::kActivations, tracker_));
    stash_busy_.push_back(false);
    i = static_cast<int>(stash_.size()) - 1;
  }
  stash_busy_[static_cast<size_t>(i)] = true;
  be_.copy(stash_[static_cast<size_t>(i)].data(), src, bytes);
  return i;
}

int64_t ModelBase::base_activation_bytes(const LocalDims& d, int tensor_parallel, int B, int T,
                                         size_t esz, bool last_stage) {
  const int64_t N = int64_t{B} * T;
  return N * ((last_stage ? d.vocab_rows * static_cast<int64_t>(esz) : 0) + 3 * 4 +
              (tensor_parallel > 1 ? 12 : 0));
}

int64_t ModelBase::local_rows(const TensorShard& shard, int B, int T) {
  const int64_t N = int64_t{B} * T;
  return shard.size > 1 && shard.sequence_parallel ? N / shard.size : N;
}

void ModelBase::set_exchange(Exchange* exchange) {
  if (exchange == nullptr) exchange = &identity_;
  ZD_CHECK(!tensor_parallel() || exchange->sequence_parallel() == sequence_parallel(),
           "tensor rank {} built {} sequence parallelism, its exchange {}", layout_.shard().rank,
           sequence_parallel() ? "with" : "without",
           exchange->sequence_parallel() ? "splits the sequence" : "does not split it");
  ZD_CHECK(exchange->context_size() == context_.size,
           "context rank {} of {} given an exchange over a context group of {}", context_.rank,
           context_.size, exchange->context_size());
  exchange_ = exchange;
}

void ModelBase::set_document_masking(int32_t eos_token_id) {
  ZD_CHECK_INPUT(eos_token_id < 0 || !context_parallel(),
                 "document masking with context parallelism (C = {}) is not supported: each rank "
                 "holds only part of every sequence",
                 context_.size);
  if (eos_token_id >= 0 && slots_[0].doc_start == nullptr) {
    const size_t N = static_cast<size_t>(B_) * T_;
    for (Slot& sl : slots_)
      sl.doc_start = reinterpret_cast<int32_t*>(stat(N));  // (4-byte elements, as floats)
    doc_start_ = slots_[static_cast<size_t>(slot_)].doc_start;
    host_doc_start_.resize(N);
  }
  eos_token_id_ = eos_token_id;
}

void ModelBase::select_rows(const int32_t* in, std::vector<int32_t>& out) const {
  out.resize(static_cast<size_t>(B_) * T_);
  for (int b = 0; b < B_; ++b)
    for (int i = 0; i < T_; ++i)
      out[static_cast<size_t>(b) * T_ + i] =
          in[static_cast<size_t>(b) * seq_ + positions_[static_cast<size_t>(i)]];
}

void ModelBase::take_rows(const int32_t*& inputs, const int32_t*& targets) {
  if (!context_parallel()) return;
  ZD_CHECK(exchange_->context_size() == context_.size,
           "context rank {} of {} has no context-parallel exchange", context_.rank, context_.size);
  global_valid_ = 0;
  for (int64_t i = 0; i < int64_t{B_} * seq_; ++i) global_valid_ += targets[i] >= 0;
  select_rows(inputs, cp_inputs_);
  select_rows(targets, cp_targets_);
  inputs = cp_inputs_.data();
  targets = cp_targets_.data();
}

void* ModelBase::act(size_t elems) {
  buffers_.push_back(be_.allocate(elems * esz_, MemCategory::kActivations, tracker_));
  return buffers_.back().data();
}

float* ModelBase::stat(size_t elems) {
  buffers_.push_back(be_.allocate(elems * sizeof(float), MemCategory::kActivations, tracker_));
  return buffers_.back().as<float>();
}

void ModelBase::round(void* x, int64_t n) {
  if (rounding_) timed(timer(), times_.rounding, [&] { be_.round_to_compute(x, n); });
}

void ModelBase::upload(const int32_t* inputs, const int32_t* targets) {
  const size_t n = static_cast<size_t>(B_) * T_, bytes = n * sizeof(int32_t);
  if (eos_token_id_ >= 0) {  // (from the token ids, before a vocabulary shard's renumbering)
    document_starts(inputs, B_, T_, eos_token_id_, host_doc_start_.data());
    be_.copy(doc_start_, host_doc_start_.data(), bytes);
  }
  if (tensor_parallel()) {
    // The embedding shard holds rows [v0, v0 + Vl): other tokens look up nothing here.
    const int v0 = layout_.local().vocab_begin, Vl = layout_.local().vocab_rows;
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = inputs[i] - v0;
      host_tokens_[i] = t >= 0 && t < Vl ? t : -1;
    }
    inputs = host_tokens_.data();
  }
  be_.copy(tokens_, inputs, bytes);
  be_.copy(targets_, targets, bytes);
}

void ModelBase::loss_and_dlogits(float dloss) {
  const ModelSpec& s = layout_.spec();
  const LocalDims& d = layout_.local();
  const int64_t N = int64_t{B_} * T_;
  if (!tensor_parallel()) {
    be_.crossentropy_fused(losses_, logits_, targets_, N, s.vocab_size, s.vp(), dloss);
    return;
  }
  // Megatron's vocabulary-parallel cross-entropy: the full logits are never gathered.
  round_logits();
  be_.crossentropy_shard_stats(loss_stats_, logits_, targets_, N, d.vocab_real, d.vocab_rows,
                               d.vocab_begin);
  exchange_->loss_max(loss_stats_, N);
  exchange_->loss_sum(loss_stats_ + N, N);  // the target logit (one rank holds it)
  be_.crossentropy_shard_sumexp(loss_stats_, logits_, N, d.vocab_real, d.vocab_rows);
  exchange_->loss_sum(loss_stats_ + 2 * N, N);
  be_.crossentropy_shard_finish(losses_, logits_, targets_, loss_stats_, N, d.vocab_real,
                                d.vocab_rows, d.vocab_begin, dloss);
  round_logits();  // (dlogits)
}

float ModelBase::mean_loss(const int32_t* targets) {
  const int64_t N = int64_t{B_} * T_;
  be_.copy(host_losses_.data(), losses_, static_cast<size_t>(N) * sizeof(float));
  if (context_parallel()) {
    double local = 0;
    for (int64_t i = 0; i < N; ++i)
      if (targets[i] >= 0) local += host_losses_[static_cast<size_t>(i)];
    const double sum = exchange_->context_sum(local);
    return global_valid_ > 0 ? static_cast<float>(sum / static_cast<double>(global_valid_)) : 0.0f;
  }
  double sum = 0;
  int n = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += host_losses_[static_cast<size_t>(i)];
    ++n;
  }
  return n > 0 ? static_cast<float>(sum / n) : 0.0f;
}

float ModelBase::loss_gradient(const int32_t* targets, float loss_weight) const {
  if (context_parallel())
    return global_valid_ > 0 ? loss_weight / static_cast<float>(global_valid_) : 0.0f;
  const int64_t N = int64_t{B_} * T_;
  int valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += targets[i] >= 0;
  return valid > 0 ? loss_weight / static_cast<float>(valid) : 0.0f;
}

void ModelBase::forward_phase_done() {
  if (phase_clock_ == nullptr) return;
  be_.synchronize();
  forward_wall_ = phase_clock_->seconds();
  forward_seam_ = *phase_seam_;
}

void ModelBase::attend(int l, void* out, float* lse, const void* qkv, const AttentionShape& s) {
  if (context_parallel()) {
    exchange_->attention_forward(out, lse, qkv, s);
    return;
  }
  if (cache_pos0_ < 0) {
    be_.attention_forward(out, lse, qkv, s);
    return;
  }
  be_.attention_kv_cache(out, qkv, kcache_[static_cast<size_t>(l)], vcache_[static_cast<size_t>(l)],
                         cache_pos0_, cache_len_, s);
}

void ModelBase::attend_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                const float* lse, const AttentionShape& s) {
  if (context_parallel()) {
    exchange_->attention_backward(dqkv, dout, qkv, out, lse, s);
    return;
  }
  be_.attention_backward(dqkv, dout, qkv, out, lse, s);
}

void ModelBase::start_generation(int max_len) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK_INPUT(layout_.whole_model(), "generation runs on the whole model, not a pipeline stage");
  select_slot(0);
  ZD_CHECK_INPUT(!tensor_parallel(), "generation runs on one rank, not tensor-parallel (T = {})",
                 layout_.shard().size);
  ZD_CHECK_INPUT(!context_parallel(), "generation runs on one rank, not context-parallel (C = {})",
                 context_.size);
  ZD_CHECK_INPUT(max_len >= 1 && max_len <= s.seq_len,
                 "generation of {} positions: the model has {} (seq_len)", max_len, s.seq_len);
  cache_buffers_.clear();
  kcache_.clear();
  vcache_.clear();
  const size_t bytes = static_cast<size_t>(B_) * max_len * layout_.local().kv_dim * esz_;
  for (int l = 0; l < s.n_layer; ++l) {
    cache_buffers_.push_back(be_.allocate(bytes, MemCategory::kActivations, tracker_));
    kcache_.push_back(cache_buffers_.back().data());
    cache_buffers_.push_back(be_.allocate(bytes, MemCategory::kActivations, tracker_));
    vcache_.push_back(cache_buffers_.back().data());
  }
  cache_len_ = max_len;
}

void ModelBase::generate_step(const int32_t* tokens, int n, int pos0, ParamSource& params,
                              float* last_logits) {
  ZD_CHECK(cache_len_ > 0, "generate_step before start_generation");
  ZD_CHECK(n >= 1 && n <= T_ && pos0 >= 0 && pos0 + n <= cache_len_,
           "generate_step of {} positions at {} (micro-batch T {}, cache {})", n, pos0, T_,
           cache_len_);
  const int saved_T = T_;
  T_ = n;
  cache_pos0_ = pos0;
  try {
    be_.copy(tokens_, tokens, static_cast<size_t>(B_) * n * sizeof(int32_t));
    if (moe_) moe_->begin_forward(false, 0.0f);
    run_to_logits(params);
  } catch (...) {
    T_ = saved_T;
    cache_pos0_ = -1;
    throw;
  }
  T_ = saved_T;
  cache_pos0_ = -1;
  const int Vp = layout_.local().vocab_rows;
  for (int b = 0; b < B_; ++b) {
    const int64_t row = int64_t{b} * n + (n - 1);
    be_.cast_from_compute(last_logits + int64_t{b} * Vp,
                          static_cast<const char*>(logits_) + row * Vp * static_cast<int64_t>(esz_),
                          Vp);
  }
}

float ModelBase::forward(const int32_t* inputs, const int32_t* targets, ParamSource& params) {
  ZD_CHECK(layout_.whole_model(), "forward() on a pipeline stage: use stage_forward");
  select_slot(0);
  const ModelSpec& s = layout_.spec();
  const int64_t N = int64_t{B_} * T_;
  take_rows(inputs, targets);
  upload(inputs, targets);
  if (moe_) moe_->begin_forward(false, 0.0f);
  run_to_logits(params);
  if (!tensor_parallel()) {
    timed(timer(), times_.classifier,
          [&] { be_.crossentropy_forward(losses_, logits_, targets_, N, s.vocab_size, s.vp()); });
    return mean_loss(targets);
  }
  // The statistics of the vocabulary-parallel cross-entropy give each loss (the logits stay).
  const LocalDims& d = layout_.local();
  be_.crossentropy_shard_stats(loss_stats_, logits_, targets_, N, d.vocab_real, d.vocab_rows,
                               d.vocab_begin);
  exchange_->loss_max(loss_stats_, N);
  exchange_->loss_sum(loss_stats_ + N, N);
  be_.crossentropy_shard_sumexp(loss_stats_, logits_, N, d.vocab_real, d.vocab_rows);
  exchange_->loss_sum(loss_stats_ + 2 * N, N);
  std::vector<float> st(static_cast<size_t>(3 * N));
  be_.copy(st.data(), loss_stats_, st.size() * sizeof(float));
  for (int64_t i = 0; i < N; ++i) {
    const size_t k = static_cast<size_t>(i);
    host_losses_[k] =
        targets[i] < 0 ? 0.0f : std::log(st[k + 2 * N]) + st[k] - st[k + static_cast<size_t>(N)];
  }
  be_.copy(losses_, host_losses_.data(), static_cast<size_t>(N) * sizeof(float));
  return mean_loss(targets);
}

void ModelBase::read_logits(float* out) {
  be_.cast_from_compute(out, logits_, int64_t{B_} * T_ * layout_.local().vocab_rows);
}

float ModelBase::forward_backward(const int32_t* inputs, const int32_t* targets,
                                  ParamSource& params, GradSink& grads, float loss_weight) {
  ZD_CHECK(layout_.whole_model(), "forward_backward() on a pipeline stage: use the stage API");
  select_slot(0);
  take_rows(inputs, targets);
  if (moe_) moe_->begin_forward(true, loss_weight);
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

}  // namespace zerod
