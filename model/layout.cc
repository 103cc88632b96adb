#include "model/layout.h"

#include <algorithm>
#include <cmath>

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
  }
  return "?";
}

const char* rope_scaling_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kNone:
      return "none";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
  }
  return "?";
}

namespace {
int64_t count_parameters(const ModelSpec& s, int64_t vocab_rows) {
  const int64_t C = s.n_embd, L = s.n_layer;
  if (!s.llama_family()) {
    const int64_t block =
        2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
    return vocab_rows * C + static_cast<int64_t>(s.seq_len) * C + L * block + 2 * C;
  }
  const int64_t Q = s.q_dim(), QKV = s.qkv_dim(), I = s.ffn();
  const int64_t block = C + QKV * C + (s.qkv_bias ? QKV : 0) + C * Q + (s.o_bias ? C : 0) + C +
                        2 * I * C + (s.mlp_bias ? 2 * I : 0) + C * I + (s.mlp_bias ? C : 0);
  return vocab_rows * C * (s.tied() ? 1 : 2) + L * block + C;
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
  spec_.padded_vocab_size = spec.vp();
  local_ = local_dims(spec_, shard_);
  if (spec_.llama_family()) {
    build_llama();
  } else {
    build_gpt2();
  }
  keep_stage_units();
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
  layer_unit_.assign(static_cast<size_t>(L), -1);
  std::vector<UnitLayout> kept;
  // Global units: 0 embedding, 1 + l block l, L + 1 final.
  for (int g = 0; g < static_cast<int>(units_.size()); ++g) {
    const bool keep = g == 0       ? first || (last && spec_.tied())
                      : g == L + 1 ? last
                                   : held[static_cast<size_t>(g - 1)];
    if (!keep) continue;
    const int u = static_cast<int>(kept.size());
    if (g == 0) embedding_unit_ = u;
    if (g >= 1 && g <= L) layer_unit_[static_cast<size_t>(g - 1)] = u;
    if (g == L + 1) final_unit_ = u;
    global_unit_.push_back(g);
    kept.push_back(std::move(units_[static_cast<size_t>(g)]));
  }
  if (!first) {
    embedding_unit_ = last && spec_.tied() ? 0 : -1;
    tied_copy_unit_ = embedding_unit_;
  }
  if (!last) final_unit_ = -1;
  units_ = std::move(kept);
}

void ParamLayout::build_llama() {
  const ModelSpec& s = spec_;
  const int64_t C = s.n_embd, Vp = s.padded_vocab_size, Q = s.q_dim(), KV = s.kv_dim(), I = s.ffn();
  const int64_t real = local_.vocab_real;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  {
    UnitBuilder u("embedding", align_, shard_);
    u.add("model.embed_tokens.weight", {Vp, C}, InitKind::kNormal, false, real, rows);
    units_.push_back(u.finish());
  }
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
    if (l == 0) llama_block_ = o;
    units_.push_back(u.finish());
  }
  {
    UnitBuilder u("norm", align_, shard_);
    u.add("model.norm.weight", {C}, InitKind::kOnes);
    lm_head_offset_ =
        s.tied() ? -1 : u.add("lm_head.weight", {Vp, C}, InitKind::kNormal, false, real, rows);
    units_.push_back(u.finish());
  }
}

void ParamLayout::build_gpt2() {
  const int64_t C = spec_.n_embd, Vp = spec_.padded_vocab_size;
  const Split rows = Split::kRows, cols = Split::kColumns, rank0 = Split::kOwnerOnly;
  {
    UnitBuilder u("embedding", align_, shard_);
    u.add("wte.weight", {Vp, C}, InitKind::kNormal, false, local_.vocab_real, rows);
    wpe_offset_ = u.add("wpe.weight", {spec_.seq_len, C}, InitKind::kNormal, false, -1, rank0);
    units_.push_back(u.finish());
  }
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
    o.fc_w = u.add(p + "mlp.c_fc.weight", {4 * C, C}, InitKind::kNormal, true, -1, rows);
    o.fc_b = u.add(p + "mlp.c_fc.bias", {4 * C}, InitKind::kZeros, false, -1, rows);
    o.fcproj_w =
        u.add(p + "mlp.c_proj.weight", {C, 4 * C}, InitKind::kNormalResidual, true, -1, cols);
    o.fcproj_b = u.add(p + "mlp.c_proj.bias", {C}, InitKind::kZeros, false, -1, rank0);
    if (l == 0) block_ = o;
    units_.push_back(u.finish());
  }
  {
    UnitBuilder u("ln_f", align_, shard_);
    u.add("ln_f.weight", {C}, InitKind::kOnes);
    lnf_b_offset_ = u.add("ln_f.bias", {C}, InitKind::kZeros);
    units_.push_back(u.finish());
  }
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
    const uint64_t stream = (static_cast<uint64_t>(global_unit(u)) << 16) | ti;
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
