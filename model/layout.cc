#include "model/layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/rng.h"

namespace zerod {

const char* model_arch_name(ModelArch a) {
  switch (a) {
    case ModelArch::kGpt2:
      return "gpt2";
    case ModelArch::kLlama:
      return "llama";
    case ModelArch::kMistral:
      return "mistral";
    case ModelArch::kQwen2:
      return "qwen2";
    case ModelArch::kMixtral:
      return "mixtral";
  }
  return "?";
}

namespace {
// One MLP of `width` channels: SwiGLU (gate, up, down; no biases with experts) or GPT-2's GELU
// MLP (c_fc and c_proj with biases).
int64_t mlp_parameters(const ModelSpec& s, int64_t width) {
  const int64_t C = s.n_embd;
  return s.llama_family() ? 3 * width * C : 2 * width * C + width + C;
}
}  // namespace

int64_t moe_mlp_parameters(const ModelSpec& s) {
  const MoeSpec& m = s.moe;
  if (!m.enabled()) return 0;
  const int64_t I = s.ffn(), Is = int64_t{m.shared_experts} * I;
  return int64_t{m.num_experts} * s.n_embd + m.num_experts * mlp_parameters(s, I) +
         (Is > 0 ? mlp_parameters(s, Is) : 0);
}

int64_t moe_expert_parameters(const ModelSpec& s) {
  const MoeSpec& m = s.moe;
  return int64_t{m.moe_layers(s.n_layer)} * m.num_experts * mlp_parameters(s, s.ffn());
}

std::string describe_moe(const ModelSpec& s) {
  const MoeSpec& m = s.moe;
  if (!m.enabled()) return "";
  auto human = [](double x) {
    const char* unit[] = {"", "K", "M", "B"};
    int i = 0;
    while (x >= 1000.0 && i < 3) {
      x /= 1000.0;
      ++i;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, i == 0 ? "%.0f%s" : "%.1f%s", x, unit[i]);
    return std::string(buf);
  };
  std::string blocks;
  int n = 0;
  for (int l = 0; l < s.n_layer; ++l) {
    if (!m.is_moe_layer(l)) continue;
    blocks += (n++ > 0 ? "," : "") + std::to_string(l);
  }
  const int64_t expert = mlp_parameters(s, s.ffn()), total = s.num_parameters();
  const int64_t experts = moe_expert_parameters(s);
  const int64_t active = total - experts + int64_t{m.moe_layers(s.n_layer)} * m.top_k * expert;
  std::string routing = "top-" + std::to_string(m.top_k) + (m.renormalize ? " renormalised" : "");
  char cap[96];
  std::snprintf(cap, sizeof cap, "capacity factor %g (eval %g, min %lld), dropping",
                m.capacity_factor, m.eval_capacity_factor, static_cast<long long>(m.min_capacity));
  char losses[128];
  std::snprintf(
      losses, sizeof losses, "aux loss %g x (%s), z-loss %g x", m.aux_loss_coef,
      m.aux_loss == MoeAuxLoss::kHuggingFace ? "Hugging Face, all layers" : "DeepSpeed, per layer",
      m.z_loss_coef);
  return "mixture of experts: blocks " + blocks + " (" + std::to_string(n) + " of " +
         std::to_string(s.n_layer) + "), " + std::to_string(m.num_experts) + " experts x " +
         human(static_cast<double>(expert)) + " parameters + router" +
         (m.shared_experts > 0 ? " + " + std::to_string(m.shared_experts) + " shared" : "") + ", " +
         routing + ", " + (m.drop_tokens ? std::string(cap) : "dropless") + ", " + losses +
         ": experts " + human(static_cast<double>(experts)) + " of " +
         human(static_cast<double>(total)) + " parameters, " + human(static_cast<double>(active)) +
         " active per token";
}

namespace {
int64_t count_parameters(const ModelSpec& s, int64_t vocab_rows) {
  const int64_t C = s.n_embd, L = s.n_layer;
  // A MoE block has, instead of its dense MLP, the router (E, C), E experts and the shared
  // experts' MLP (moe_mlp_parameters).
  const int64_t moe_layers = s.moe.moe_layers(s.n_layer);
  if (!s.llama_family()) {
    const int64_t mlp = (4 * C * C + 4 * C) + (4 * C * C + C);
    const int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + mlp;
    return vocab_rows * C + static_cast<int64_t>(s.seq_len) * C + L * block + 2 * C +
           moe_layers * (moe_mlp_parameters(s) - mlp);
  }
  const int64_t Q = s.q_dim(), QKV = s.qkv_dim(), I = s.ffn();
  const int64_t mlp = 2 * I * C + (s.mlp_bias ? 2 * I : 0) + C * I + (s.mlp_bias ? C : 0);
  const int64_t block = C + QKV * C + (s.qkv_bias ? QKV : 0) + C * Q + (s.o_bias ? C : 0) + C + mlp;
  return vocab_rows * C * (s.tied() ? 1 : 2) + L * block + C +
         moe_layers * (moe_mlp_parameters(s) - mlp);
}
}  // namespace

int64_t ModelSpec::num_parameters() const {
  return count_parameters(*this, vocab_size);
}
int64_t ModelSpec::num_parameters_padded() const {
  return count_parameters(*this, vp());
}

double ModelSpec::flops_per_token(int T) const {
  // An untied input embedding is a lookup, not a matmul.
  const double lookup = tied() ? 0.0 : static_cast<double>(vp()) * n_embd;
  return 6.0 * (static_cast<double>(num_parameters_padded()) - lookup) +
         6.0 * n_layer * static_cast<double>(T) * q_dim();
}

const TensorInfo& UnitLayout::tensor(const std::string& tname) const {
  for (const auto& t : tensors)
    if (t.name == tname) return t;
  ZD_THROW("unit {} has no tensor {}", name, tname);
}

namespace {
int64_t round_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

class UnitBuilder {
 public:
  UnitBuilder(std::string name, int64_t align, TensorShard shard) : align_(align), shard_(shard) {
    unit_.name = std::move(name);
  }
  // Between begin_packed() and end_packed() tensors follow each other with no alignment gap.
  void begin_packed() { packed_ = true; }
  void end_packed() {
    packed_ = false;
    cursor_ = round_up(cursor_, align_);
  }
  // A tensor of global shape `global`, stored as this rank's part under `split`. real_rows:
  // the rank's rows that exist in Hugging Face (vocabulary tensors), -1: all.
  int64_t add(std::string name, std::vector<int64_t> global, InitKind init,
              bool hf_transposed = false, int64_t real_rows = -1, Split split = Split::kReplicated,
              int parts = 1) {
    TensorInfo t;
    t.name = std::move(name);
    t.global_shape = global;
    t.split = shard_.size > 1 ? split : Split::kReplicated;
    t.parts = t.split == Split::kRows ? parts : 1;
    t.shape = std::move(global);
    if (t.split == Split::kRows) t.shape[0] /= shard_.size;
    if (t.split == Split::kColumns) t.shape[1] /= shard_.size;
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= d;
    t.offset = cursor_;
    t.decay = t.shape.size() >= 2;
    t.hf_transposed = hf_transposed;
    t.real_rows = real_rows;
    t.init = init;
    cursor_ = packed_ ? cursor_ + t.numel : round_up(cursor_ + t.numel, align_);
    unit_.tensors.push_back(std::move(t));
    return unit_.tensors.back().offset;
  }
  TensorInfo& last() { return unit_.tensors.back(); }
  int64_t size() const { return cursor_; }
  UnitLayout finish() {
    unit_.numel = cursor_;
    return std::move(unit_);
  }

 private:
  int64_t align_;
  TensorShard shard_;
  int64_t cursor_ = 0;
  bool packed_ = false;
  UnitLayout unit_;
};
// The MLP of a MoE block (ParamLayout::MoeBlockOffsets), its names under prefix p: the router
// and the shared experts into the block's unit (add_router), the routed experts into a unit of
// their own (add_routed). Under tensor parallelism each expert (and the shared experts) splits as
// the dense MLP does: the first matmul's rows (w1 and w3, c_fc and its bias) and the second's
// columns (w2, c_proj; c_proj's bias on rank 0 only); the router (gate) is replicated.
void add_router(UnitBuilder& u, const ModelSpec& s, const std::string& p,
                ParamLayout::MoeBlockOffsets& o) {
  const int64_t C = s.n_embd, E = s.moe.num_experts;
  const int64_t Is = int64_t{s.moe.shared_experts} * s.ffn();
  const InitKind normal = InitKind::kNormal;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  if (s.llama_family()) {  // Mixtral: gate, (experts), shared_experts
    o.gate_w = u.add(p + "gate.weight", {E, C}, normal);
    if (Is > 0) {
      u.begin_packed();
      o.shared_w13 = u.add(p + "shared_experts.gate_proj.weight", {Is, C}, normal, false, -1, rows);
      u.add(p + "shared_experts.up_proj.weight", {Is, C}, normal, false, -1, rows);
      u.end_packed();
      o.shared_w2 = u.add(p + "shared_experts.down_proj.weight", {C, Is}, normal, false, -1, cols);
    }
    return;
  }
  // GPT-2 (DeepSpeed-MoE's module names): gate.wg, shared_experts.{c_fc, c_proj}.
  const InitKind resid = InitKind::kNormalResidual;
  o.gate_w = u.add(p + "gate.wg.weight", {E, C}, normal);
  if (Is > 0) {
    o.shared_w13 = u.add(p + "shared_experts.c_fc.weight", {Is, C}, normal, false, -1, rows);
    o.shared_b13 = u.add(p + "shared_experts.c_fc.bias", {Is}, InitKind::kZeros, false, -1, rows);
    o.shared_w2 = u.add(p + "shared_experts.c_proj.weight", {C, Is}, resid, false, -1, cols);
    o.shared_b2 = u.add(p + "shared_experts.c_proj.bias", {C}, InitKind::kZeros, false, -1, rank0);
  }
}
// The routed experts [first, first + count) of n, expert by expert (each expert's tensors back
// to back, the block padded to the alignment: o.expert_stride elements), so a rank's experts
// are one contiguous range of the unit that holds all of them, at first x expert_stride.
void add_routed(UnitBuilder& u, const ModelSpec& s, const std::string& p, int first, int count,
                ParamLayout::MoeBlockOffsets& o) {
  const int64_t C = s.n_embd, I = s.ffn(), E = s.moe.num_experts;
  const InitKind normal = InitKind::kNormal, resid = InitKind::kNormalResidual;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  // Each tensor's index among every expert's tensors in the order Hugging Face's modules list
  // them per kind (all w1, w3 pairs, then all w2; GPT-2: all c_fc weights, biases, c_proj
  // weights, biases) goes in `stream` for push_moe_units.
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, InitKind init, Split split,
                    int64_t index) {
    const int64_t off = u.add(name, std::move(shape), init, false, -1, split);
    u.last().stream = static_cast<uint64_t>(index);
    return off;
  };
  int64_t start = -1;
  for (int64_t e = first; e < first + count; ++e) {
    u.begin_packed();
    ParamLayout::MoeBlockOffsets x;
    if (s.llama_family()) {  // Mixtral: experts.E.{w1, w3, w2}
      const std::string n = p + "experts." + std::to_string(e) + ".";
      x.w13 = tensor(n + "w1.weight", {I, C}, normal, rows, 2 * e);
      tensor(n + "w3.weight", {I, C}, normal, rows, 2 * e + 1);
      x.w2 = tensor(n + "w2.weight", {C, I}, normal, cols, 2 * E + e);
    } else {  // GPT-2: experts.deepspeed_experts.E.{c_fc, c_proj}, initialised as its MLP
      const std::string n = p + "experts.deepspeed_experts." + std::to_string(e) + ".";
      x.w13 = tensor(n + "c_fc.weight", {I, C}, normal, rows, e);
      x.b13 = tensor(n + "c_fc.bias", {I}, InitKind::kZeros, rows, E + e);
      x.w2 = tensor(n + "c_proj.weight", {C, I}, resid, cols, 2 * E + e);
      x.b2 = tensor(n + "c_proj.bias", {C}, InitKind::kZeros, rank0, 3 * E + e);
    }
    u.end_packed();
    if (e == first) {
      start = x.w13;
      o.w13 = x.w13;
      o.b13 = x.b13;
      o.w2 = x.w2;
      o.b2 = x.b2;
    } else if (e == first + 1) {
      o.expert_stride = x.w13 - start;
    }
  }
  if (count == 1) o.expert_stride = u.size() - start;
}
}  // namespace

ParamLayout::ParamLayout(const ModelSpec& spec, int64_t align_elems, TensorShard shard,
                         LayerRange stage)
    : ParamLayout(spec, align_elems, shard, std::vector<LayerRange>{stage}) {}

ParamLayout::ParamLayout(const ModelSpec& spec, int64_t align_elems, TensorShard shard,
                         std::vector<LayerRange> chunks)
    : spec_(spec), align_(align_elems), shard_(shard), chunks_(std::move(chunks)) {
  ZD_CHECK(align_ > 0, "alignment {}", align_);
  ZD_CHECK(!chunks_.empty(), "a layout of no pipeline stage");
  for (LayerRange& c : chunks_) {
    if (c.end < 0) c.end = spec.n_layer;
    ZD_CHECK(0 <= c.begin && c.begin < c.end && c.end <= spec.n_layer,
             "pipeline stage of layers [{}, {}) in a model of {} layers", c.begin, c.end,
             spec.n_layer);
  }
  for (size_t i = 1; i < chunks_.size(); ++i)
    ZD_CHECK(chunks_[i - 1].end <= chunks_[i].begin,
             "pipeline chunks [{}, {}) and [{}, {}) overlap or are out of order",
             chunks_[i - 1].begin, chunks_[i - 1].end, chunks_[i].begin, chunks_[i].end);
  stage_ = chunks_.front();
  ZD_CHECK(shard_.expert_size >= 1 && 0 <= shard_.expert_rank &&
               shard_.expert_rank < shard_.expert_size &&
               (shard_.expert_size == 1 ||
                (spec.moe.enabled() && spec.moe.num_experts % shard_.expert_size == 0)),
           "expert rank {} of {} in a model of {} experts", shard_.expert_rank, shard_.expert_size,
           spec.moe.enabled() ? spec.moe.num_experts : 0);
  spec_.padded_vocab_size = spec.vp();
  local_ = local_dims(spec_, shard_);
  if (spec_.llama_family()) {
    build_llama();
  } else {
    build_gpt2();
  }
  keep_stage_units();
}

void ParamLayout::push_unit(UnitLayout unit, int layer) {
  const uint64_t block = static_cast<uint64_t>(layer + 1) << 16;
  for (size_t ti = 0; ti < unit.tensors.size(); ++ti) unit.tensors[ti].stream = block | ti;
  units_.push_back(std::move(unit));
  unit_layer_.push_back(layer);
}

void ParamLayout::push_moe_units(UnitLayout block, UnitLayout routed, int layer) {
  // The block's tensors up to the router, the routed experts (add_routed left their index among
  // every expert's tensors in `stream`), the shared experts.
  const uint64_t b = static_cast<uint64_t>(layer + 1) << 16;
  size_t gate = 0;
  while (block.tensors[gate].offset != moe_block_.gate_w) ++gate;
  const size_t routed_all =
      static_cast<size_t>(spec_.moe.num_experts) * (spec_.llama_family() ? 3 : 4);
  for (size_t ti = 0; ti < block.tensors.size(); ++ti)
    block.tensors[ti].stream = b | (ti <= gate ? ti : ti + routed_all);
  for (TensorInfo& t : routed.tensors) t.stream = b | (gate + 1 + t.stream);
  block.experts = false;
  routed.experts = true;
  units_.push_back(std::move(block));
  unit_layer_.push_back(layer);
  units_.push_back(std::move(routed));
  unit_layer_.push_back(layer);
}

void ParamLayout::keep_stage_units() {
  const int L = spec_.n_layer;
  bool first = false, last = false;
  std::vector<bool> held(static_cast<size_t>(L), false);
  for (const LayerRange& c : chunks_) {
    first = first || c.begin == 0;
    last = last || c.end == L;
    for (int l = c.begin; l < c.end; ++l) held[static_cast<size_t>(l)] = true;
  }
  num_global_units_ = static_cast<int>(units_.size());
  layer_unit_.assign(static_cast<size_t>(L), -1);
  experts_unit_.assign(static_cast<size_t>(L), -1);
  std::vector<UnitLayout> kept;
  // Global units in order: the embedding (layer -1), each block (a MoE block's experts unit
  // right after it), the final unit (layer L).
  for (int g = 0; g < static_cast<int>(units_.size()); ++g) {
    const int layer = unit_layer_[static_cast<size_t>(g)];
    const bool keep = layer < 0    ? first || (last && spec_.tied())
                      : layer == L ? last
                                   : held[static_cast<size_t>(layer)];
    if (!keep) continue;
    const int u = static_cast<int>(kept.size());
    if (layer < 0) embedding_unit_ = u;
    if (layer >= 0 && layer < L)
      (units_[static_cast<size_t>(g)].experts ? experts_unit_
                                              : layer_unit_)[static_cast<size_t>(layer)] = u;
    if (layer == L) final_unit_ = u;
    global_unit_.push_back(g);
    kept.push_back(std::move(units_[static_cast<size_t>(g)]));
  }
  if (!first) {
    embedding_unit_ = last && spec_.tied() ? 0 : -1;
    tied_copy_unit_ = embedding_unit_;
  }
  if (!last) final_unit_ = -1;
  units_ = std::move(kept);
  unit_layer_.clear();
}

void ParamLayout::build_llama() {
  const ModelSpec& s = spec_;
  const int64_t C = s.n_embd, Vp = s.padded_vocab_size, Q = s.q_dim(), KV = s.kv_dim(), I = s.ffn();
  const int64_t real = local_.vocab_real;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  {
    UnitBuilder u("embedding", align_, shard_);
    u.add("model.embed_tokens.weight", {Vp, C}, InitKind::kNormal, false, real, rows);
    push_unit(u.finish(), -1);
  }
  bool have_dense = false;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    UnitBuilder u("layers." + std::to_string(l), align_, shard_);
    LlamaBlockOffsets o{};
    o.ln1_w = u.add(p + "input_layernorm.weight", {C}, InitKind::kOnes);
    u.begin_packed();
    o.qkv_w = u.add(p + "self_attn.q_proj.weight", {Q, C}, InitKind::kNormal, false, -1, rows);
    u.add(p + "self_attn.k_proj.weight", {KV, C}, InitKind::kNormal, false, -1, rows);
    u.add(p + "self_attn.v_proj.weight", {KV, C}, InitKind::kNormal, false, -1, rows);
    u.end_packed();
    o.qkv_b = -1;
    if (s.qkv_bias) {
      u.begin_packed();
      o.qkv_b = u.add(p + "self_attn.q_proj.bias", {Q}, InitKind::kZeros, false, -1, rows);
      u.add(p + "self_attn.k_proj.bias", {KV}, InitKind::kZeros, false, -1, rows);
      u.add(p + "self_attn.v_proj.bias", {KV}, InitKind::kZeros, false, -1, rows);
      u.end_packed();
    }
    o.o_w = u.add(p + "self_attn.o_proj.weight", {C, Q}, InitKind::kNormal, false, -1, cols);
    o.o_b =
        s.o_bias ? u.add(p + "self_attn.o_proj.bias", {C}, InitKind::kZeros, false, -1, rank0) : -1;
    o.ln2_w = u.add(p + "post_attention_layernorm.weight", {C}, InitKind::kOnes);
    if (s.moe.is_moe_layer(l)) {
      add_router(u, s, p + "block_sparse_moe.", moe_block_);
      if (!have_dense) llama_block_ = o;  // (the MLP offsets: the first dense block's, below)
      UnitBuilder x("layers." + std::to_string(l) + ".experts", align_, shard_);
      add_routed(x, s, p + "block_sparse_moe.", first_expert(), local_experts(), moe_block_);
      push_moe_units(u.finish(), x.finish(), l);
      continue;
    }
    u.begin_packed();
    o.gu_w = u.add(p + "mlp.gate_proj.weight", {I, C}, InitKind::kNormal, false, -1, rows);
    u.add(p + "mlp.up_proj.weight", {I, C}, InitKind::kNormal, false, -1, rows);
    u.end_packed();
    o.gu_b = -1;
    if (s.mlp_bias) {
      u.begin_packed();
      o.gu_b = u.add(p + "mlp.gate_proj.bias", {I}, InitKind::kZeros, false, -1, rows);
      u.add(p + "mlp.up_proj.bias", {I}, InitKind::kZeros, false, -1, rows);
      u.end_packed();
    }
    o.down_w = u.add(p + "mlp.down_proj.weight", {C, I}, InitKind::kNormal, false, -1, cols);
    o.down_b =
        s.mlp_bias ? u.add(p + "mlp.down_proj.bias", {C}, InitKind::kZeros, false, -1, rank0) : -1;
    if (!have_dense) llama_block_ = o;
    have_dense = true;
    push_unit(u.finish(), l);
  }
  {
    UnitBuilder u("norm", align_, shard_);
    u.add("model.norm.weight", {C}, InitKind::kOnes);
    lm_head_offset_ =
        s.tied() ? -1 : u.add("lm_head.weight", {Vp, C}, InitKind::kNormal, false, real, rows);
    push_unit(u.finish(), s.n_layer);
  }
}

void ParamLayout::build_gpt2() {
  const int64_t C = spec_.n_embd, Vp = spec_.padded_vocab_size;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  {
    UnitBuilder u("embedding", align_, shard_);
    u.add("wte.weight", {Vp, C}, InitKind::kNormal, false, local_.vocab_real, rows);
    wpe_offset_ = u.add("wpe.weight", {spec_.seq_len, C}, InitKind::kNormal, false, -1, rank0);
    push_unit(u.finish(), -1);
  }
  bool have_dense = false;
  for (int l = 0; l < spec_.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    UnitBuilder u("h." + std::to_string(l), align_, shard_);
    BlockOffsets o{};
    o.ln1_w = u.add(p + "ln_1.weight", {C}, InitKind::kOnes);
    o.ln1_b = u.add(p + "ln_1.bias", {C}, InitKind::kZeros);
    o.qkv_w = u.add(p + "attn.c_attn.weight", {3 * C, C}, InitKind::kNormal, true, -1, rows, 3);
    o.qkv_b = u.add(p + "attn.c_attn.bias", {3 * C}, InitKind::kZeros, false, -1, rows, 3);
    o.attproj_w =
        u.add(p + "attn.c_proj.weight", {C, C}, InitKind::kNormalResidual, true, -1, cols);
    o.attproj_b = u.add(p + "attn.c_proj.bias", {C}, InitKind::kZeros, false, -1, rank0);
    o.ln2_w = u.add(p + "ln_2.weight", {C}, InitKind::kOnes);
    o.ln2_b = u.add(p + "ln_2.bias", {C}, InitKind::kZeros);
    if (spec_.moe.is_moe_layer(l)) {
      add_router(u, spec_, p + "mlp.deepspeed_moe.", moe_block_);
      if (!have_dense) block_ = o;  // (the MLP offsets: the first dense block's, below)
      UnitBuilder x("h." + std::to_string(l) + ".experts", align_, shard_);
      add_routed(x, spec_, p + "mlp.deepspeed_moe.", first_expert(), local_experts(), moe_block_);
      push_moe_units(u.finish(), x.finish(), l);
      continue;
    }
    o.fc_w = u.add(p + "mlp.c_fc.weight", {4 * C, C}, InitKind::kNormal, true, -1, rows);
    o.fc_b = u.add(p + "mlp.c_fc.bias", {4 * C}, InitKind::kZeros, false, -1, rows);
    o.fcproj_w =
        u.add(p + "mlp.c_proj.weight", {C, 4 * C}, InitKind::kNormalResidual, true, -1, cols);
    o.fcproj_b = u.add(p + "mlp.c_proj.bias", {C}, InitKind::kZeros, false, -1, rank0);
    if (!have_dense) block_ = o;
    have_dense = true;
    push_unit(u.finish(), l);
  }
  {
    UnitBuilder u("ln_f", align_, shard_);
    u.add("ln_f.weight", {C}, InitKind::kOnes);
    lnf_b_offset_ = u.add("ln_f.bias", {C}, InitKind::kZeros);
    push_unit(u.finish(), spec_.n_layer);
  }
}

int ParamLayout::local_experts() const {
  return spec_.moe.enabled() ? spec_.moe.num_experts / shard_.expert_size : 0;
}

int64_t ParamLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

void ParamLayout::init_range(int u, float* out, int64_t begin, int64_t end, uint64_t seed) const {
  const UnitLayout& unit = this->unit(u);
  ZD_CHECK(0 <= begin && begin <= end && end <= unit.numel, "range [{}, {}) of unit {} ({})", begin,
           end, unit.name, unit.numel);
  std::fill(out, out + (end - begin), 0.0f);
  for (size_t ti = 0; ti < unit.tensors.size(); ++ti) {
    const TensorInfo& t = unit.tensors[ti];
    if (t.offset >= end || t.offset + t.numel <= begin || t.init == InitKind::kZeros) continue;
    // Real (initialised) elements of the global tensor: padded vocabulary rows stay 0.
    int64_t global_numel = 1;
    for (int64_t d : t.global_shape) global_numel *= d;
    const int64_t row = t.global_shape.size() >= 2 ? t.global_shape.back() : global_numel;
    const int64_t real = t.real_rows >= 0 ? int64_t{spec_.vocab_size} * row : global_numel;
    double stddev = spec_.init_std;
    if (t.init == InitKind::kNormalResidual) stddev /= std::sqrt(2.0 * spec_.n_layer);
    // Stream: (unit, tensor) so every tensor draws its own sequence; the counter is the global
    // element, so a tensor-parallel part draws what the single-rank tensor draws there.
    const uint64_t stream = t.stream;
    for_each_run(t, shard_, [&](int64_t local, int64_t global, int64_t n) {
      n = std::min(n, real - global);  // the real part of the run
      const int64_t lo = std::max(begin, t.offset + local);
      const int64_t hi = std::min(end, t.offset + local + n);
      if (lo >= hi) return;
      float* dst = out + (lo - begin);
      if (t.init == InitKind::kOnes) {
        std::fill(dst, dst + (hi - lo), 1.0f);
      } else {
        fill_normal(dst, hi - lo, 0.0f, static_cast<float>(stddev), seed, stream,
                    global + (lo - t.offset - local));
      }
    });
  }
}

}  // namespace zerod
