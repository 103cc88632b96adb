#include "model/shard.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/layout.h"
#include "model/spec.h"

namespace zerod {

const char* split_name(Split s) {
  switch (s) {
    case Split::kReplicated:
      return "replicated";
    case Split::kRows:
      return "rows";
    case Split::kColumns:
      return "columns";
    case Split::kOwnerOnly:
      return "rank0";
  }
  return "?";
}

std::string tensor_parallel_problem(const ModelSpec& spec, int T) {
  if (T < 1) return fmt::format("tensor parallel size {} must be >= 1", T);
  if (T == 1) return "";
  std::vector<std::string> bad;
  if (spec.n_head % T != 0) bad.push_back(fmt::format("{} attention heads", spec.n_head));
  if (spec.kv_heads() % T != 0 && spec.kv_heads() != spec.n_head)
    bad.push_back(fmt::format("{} key/value heads", spec.kv_heads()));
  if (spec.ffn() % T != 0) bad.push_back(fmt::format("MLP width {}", spec.ffn()));
  if (spec.vp() % T != 0)
    bad.push_back(
        fmt::format("padded vocabulary {} (set model.padded_vocab_size to a multiple "
                    "of {})",
                    spec.vp(), T));
  if (bad.empty()) return "";
  std::string joined;
  for (size_t i = 0; i < bad.size(); ++i) joined += (i ? ", " : "") + bad[i];
  return fmt::format("tensor parallel size {} does not divide the {}", T, joined);
}

std::string context_parallel_problem(int seq, int C) {
  if (C < 1) return fmt::format("context parallel size {} must be >= 1", C);
  if (C == 1 || (seq > 0 && seq % (2 * C) == 0)) return "";
  return fmt::format(
      "context parallelism over {} ranks: a sequence of {} positions does not split into 2 x {} "
      "= {} equal chunks (the load-balanced causal split gives each rank chunks r and {}-r; {} "
      "is not a multiple of {})",
      C, seq, C, 2 * C, 2 * C - 1, seq, 2 * C);
}

std::vector<int32_t> context_positions(int seq, const ContextShard& shard) {
  const int C = shard.size;
  ZD_CHECK(0 <= shard.rank && shard.rank < C, "context rank {} of {}", shard.rank, C);
  const std::string problem = context_parallel_problem(seq, C);
  if (!problem.empty()) throw InputError(problem);
  std::vector<int32_t> pos;
  pos.reserve(static_cast<size_t>(seq / C));
  if (C == 1) {
    for (int i = 0; i < seq; ++i) pos.push_back(i);
    return pos;
  }
  const int chunk = seq / (2 * C);
  for (int c : {shard.rank, 2 * C - 1 - shard.rank})
    for (int i = 0; i < chunk; ++i) pos.push_back(c * chunk + i);
  return pos;
}

LocalDims local_dims(const ModelSpec& spec, const TensorShard& shard) {
  const int T = shard.size;
  ZD_CHECK(0 <= shard.rank && shard.rank < T, "tensor rank {} of {}", shard.rank, T);
  const std::string problem = tensor_parallel_problem(spec, T);
  if (!problem.empty()) throw InputError(problem);
  LocalDims d;
  d.n_head = spec.n_head / T;
  d.n_kv_head = spec.kv_heads() / T;
  d.head_size = spec.head_size();
  d.q_dim = d.n_head * d.head_size;
  d.kv_dim = d.n_kv_head * d.head_size;
  d.qkv_dim = d.q_dim + 2 * d.kv_dim;
  d.ffn = spec.ffn() / T;
  d.vocab_rows = spec.vp() / T;
  d.vocab_begin = shard.rank * d.vocab_rows;
  d.vocab_real = std::clamp(spec.vocab_size - d.vocab_begin, 0, d.vocab_rows);
  return d;
}

void for_each_run(const TensorInfo& t, const TensorShard& shard,
                  const std::function<void(int64_t local, int64_t global, int64_t n)>& fn) {
  switch (t.split) {
    case Split::kReplicated:
      fn(0, 0, t.numel);
      return;
    case Split::kOwnerOnly:
      if (shard.rank == 0) fn(0, 0, t.numel);
      return;
    case Split::kRows: {
      // Each of the `parts` blocks of global rows gives this rank its slice of rows.
      const int64_t row = t.shape[0] > 0 ? t.numel / t.shape[0] : 0;
      const int64_t local_rows = t.shape[0] / t.parts;  // per part
      const int64_t global_rows = t.global_shape[0] / t.parts;
      for (int p = 0; p < t.parts; ++p) {
        fn(p * local_rows * row, (p * global_rows + int64_t{shard.rank} * local_rows) * row,
           local_rows * row);
      }
      return;
    }
    case Split::kColumns: {
      const int64_t rows = t.shape[0], cols = t.shape[1], gcols = t.global_shape[1];
      for (int64_t r = 0; r < rows; ++r) fn(r * cols, r * gcols + int64_t{shard.rank} * cols, cols);
      return;
    }
  }
}

namespace {
void check_pair(const ParamLayout& global, const ParamLayout& local, int u) {
  ZD_CHECK(global.shard().size == 1 && global.shard().expert_size == 1,
           "the global layout is itself a shard");
  ZD_CHECK(global.num_units() == local.num_units() &&
               (global.unit(u).tensors.size() == local.unit(u).tensors.size() ||
                (local.unit(u).experts && local.shard().expert_size > 1)),
           "layouts of different models (unit {})", u);
}
// The global unit's tensor that local tensor i of unit u is part of.
const TensorInfo& global_tensor(const UnitLayout& gu, const UnitLayout& lu, size_t i) {
  if (gu.tensors.size() == lu.tensors.size()) return gu.tensors[i];
  return gu.tensor(lu.tensors[i].name);
}
}  // namespace

void shard_unit(const ParamLayout& global, const ParamLayout& local, int u, const float* whole,
                float* part) {
  check_pair(global, local, u);
  const UnitLayout& lu = local.unit(u);
  const UnitLayout& gu = global.unit(u);
  std::fill(part, part + lu.numel, 0.0f);
  for (size_t i = 0; i < lu.tensors.size(); ++i) {
    const TensorInfo& lt = lu.tensors[i];
    const float* src = whole + global_tensor(gu, lu, i).offset;
    float* dst = part + lt.offset;
    for_each_run(lt, local.shard(), [&](int64_t l, int64_t g, int64_t n) {
      std::memcpy(dst + l, src + g, static_cast<size_t>(n) * sizeof(float));
    });
  }
}

void unshard_unit(const ParamLayout& global, const ParamLayout& local, int u, const float* part,
                  float* whole) {
  check_pair(global, local, u);
  const UnitLayout& lu = local.unit(u);
  const UnitLayout& gu = global.unit(u);
  for (size_t i = 0; i < lu.tensors.size(); ++i) {
    const TensorInfo& lt = lu.tensors[i];
    const float* src = part + lt.offset;
    float* dst = whole + global_tensor(gu, lu, i).offset;
    for_each_run(lt, local.shard(), [&](int64_t l, int64_t g, int64_t n) {
      std::memcpy(dst + g, src + l, static_cast<size_t>(n) * sizeof(float));
    });
  }
}

}  // namespace zerod
