// Which part of the model one rank computes under tensor parallelism (DESIGN.md section 8). The
// model stays single-device code: it is built for a TensorShard (numbers only: its heads, KV
// heads, FFN width and vocabulary rows) and never talks to peers; parallel/ supplies the
// collectives at the model's exchange points (model/exchange.h).
//
// Megatron's partitioning, rank r of T:
//   attention q/k/v    column-parallel by heads (GQA: by KV-head groups): rows of each part
//   attention output   row-parallel: columns of the (C, q_dim) weight; its bias on rank 0 only
//   MLP up/gate (fc)   column-parallel: rows
//   MLP down (proj)    row-parallel: columns; its bias on rank 0 only
//   embedding, head    vocabulary-parallel: rows [r Vp/T, (r+1) Vp/T) of the padded vocabulary
//   norms              replicated (every rank the whole tensor, identical gradients)
//   position embedding added once: rank 0 holds it, the others hold zeros (GPT-2's wpe)
// A tensor "on rank 0 only" is a replicated tensor whose term enters a sum over the tensor
// group (after a row-parallel matmul, or in the vocabulary-parallel embedding): the other ranks
// keep zeros there, and their gradients for it are dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace zerod {

struct ModelSpec;
struct TensorInfo;
class ParamLayout;

struct TensorShard {
  int rank = 0;  // index in the tensor-parallel group
  int size = 1;  // T
  // Megatron's sequence parallelism (with size > 1; ignored on one rank): the norm, residual and
  // dropout regions of the model hold rows [rank N/T, (rank+1) N/T) of the N = B x T positions
  // of a micro-batch (the weights are split as without it).
  bool sequence_parallel = false;
  // Expert parallelism (parallelism.expert): the rank stores the routed experts [expert_rank n /
  // expert_size, (expert_rank + 1) n / expert_size) of every MoE block, n = num_experts, in its
  // experts units (ParamLayout::experts_unit), each expert its tensor-parallel part. Under
  // tensor parallelism these are the expert-parallel group's numbers among the data-parallel
  // ranks of one tensor rank.
  int expert_rank = 0;
  int expert_size = 1;
  bool operator==(const TensorShard&) const = default;
  // The same tensor shard holding every expert (what checkpoints and imports are laid out by).
  TensorShard all_experts() const {
    TensorShard s = *this;
    s.expert_rank = 0;
    s.expert_size = 1;
    return s;
  }
};

// How a rank's tensor relates to the global one.
enum class Split : uint8_t {
  kReplicated,  // the whole tensor on every rank
  kRows,        // dimension 0 split into T parts (per part when parts > 1)
  kColumns,     // dimension 1 of a 2-D tensor split into T parts
  kOwnerOnly,   // the whole tensor on rank 0; zeros (and no gradient) on the others
};
const char* split_name(Split s);  // "replicated", "rows", "columns", "rank0"

// The local numbers of a shard of spec (every global count divided by T).
struct LocalDims {
  int n_head = 0, n_kv_head = 0, head_size = 0;
  int q_dim = 0, kv_dim = 0, qkv_dim = 0;
  int ffn = 0;
  int vocab_rows = 0;   // Vp / T padded-vocabulary rows of the embedding and head shards
  int vocab_begin = 0;  // the global id of local row 0
  int vocab_real = 0;   // real (< V) vocabulary rows among them (0 <= vocab_real <= vocab_rows)
};

// Context parallelism (DESIGN.md section 8): the C ranks of a context group each hold seq/C
// positions of every sequence of a micro-batch (the parameters do not depend on it). The split is
// the load-balanced causal one: the sequence is cut into 2C equal chunks and context rank r holds
// chunks r and 2C-1-r, in that order, so every rank has the same share of the causal attention
// work (ring attention) and the same rows (Ulysses uses the same split). A model built for a
// ContextShard of size C computes its rows and meets the other ranks' in its exchange's attention.
struct ContextShard {
  int rank = 0;  // index in the context group
  int size = 1;  // C
  bool operator==(const ContextShard&) const = default;
};

// "" when sequences of `seq` positions split C ways as above (seq a multiple of 2C), else what
// does not divide (naming the numbers).
std::string context_parallel_problem(int seq, int C);
// The global positions of the rows of context rank shard.rank in sequences of `seq` positions:
// seq/C of them, chunk r then chunk 2C-1-r (Error naming the problem when seq does not split).
std::vector<int32_t> context_positions(int seq, const ContextShard& shard);

// "" when spec can be split T ways, else what does not divide (naming the numbers): heads, KV
// heads, FFN width, padded vocabulary.
std::string tensor_parallel_problem(const ModelSpec& spec, int T);
// The local numbers of rank shard.rank (Error naming the problem when T does not divide).
LocalDims local_dims(const ModelSpec& spec, const TensorShard& shard);

// Calls fn(local, global, n) for each contiguous run of tensor t of a rank's layout: local
// elements [local, local + n) of the rank's tensor are global elements [global, global + n) of
// the whole tensor (row-major in the global shape). No runs for a kOwnerOnly tensor off rank 0.
void for_each_run(const TensorInfo& t, const TensorShard& shard,
                  const std::function<void(int64_t local, int64_t global, int64_t n)>& fn);

// Unit u of a rank's layout from the whole unit of the global layout (fp32 flat buffers of each
// layout's unit numel): local = this rank's part, zeros elsewhere (padding, rank-0-only tensors
// off rank 0). A rank's experts unit holds some of the global unit's experts (expert_size > 1):
// its tensors are found by name.
void shard_unit(const ParamLayout& global, const ParamLayout& local, int u, const float* whole,
                float* part);
// The inverse: writes this rank's part of unit u into the whole unit (replicated tensors are
// written by every rank, identically; rank-0-only tensors by rank 0).
void unshard_unit(const ParamLayout& global, const ParamLayout& local, int u, const float* part,
                  float* whole);

}  // namespace zerod
