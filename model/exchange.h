// The model's third seam (DESIGN.md section 8), beside ParamSource and GradSink: the points where
// a tensor-parallel form of the model must combine partial results over its tensor group. The
// model calls them and knows no peers; parallel/ maps each point to a collective (Megatron's
// conjugate pairs: identity forward / all-reduce backward into a column-parallel region,
// all-reduce forward / identity backward out of a row-parallel one; under sequence parallelism
// all-gather / reduce-scatter into one and reduce-scatter / all-gather out of one). A model built
// for one rank (TensorShard size 1) never calls its exchange.
//
// At each point an activation, or its gradient, has two sides: `full`, all N = B x T rows of
// `width` elements (what the matmuls of the tensor-parallel regions see), and `part`, the rows of
// this rank (TensorShard::sequence_parallel: rows [r N/T, (r+1) N/T) of the norm and residual
// regions; otherwise part == full, all N rows, and every collective is in place on it).
//
//   point          forward                       backward
//   embedding      full (partial sums) -> part   part -> full
//   attention_in   part -> full                  full (partial sums) -> part
//   attention_out  full (partial sums) -> part   part -> full
//   mlp_in         part -> full                  full (partial sums) -> part
//   mlp_out        full (partial sums) -> part   part -> full
//   head_in        part -> full                  full (partial sums) -> part
//
// The forward of an "in" point may be called again in backward to rebuild the full input of a
// column-parallel matmul for its weight gradient (sequence parallelism keeps only the part).
//
// Context parallelism (model/shard.h ContextShard, C > 1): a model holds seq/C positions of every
// sequence and calls its exchange instead of the backend for the causal attention of its rows over
// the whole sequences (parallel/cp_exchange.h: Ulysses' all-to-all of heads, or ring attention),
// and for the sum of its loss over the context group. Its other exchange points are the tensor
// group's, as above, on its N = B x seq/C rows.
#pragma once

#include <cstdint>

namespace zerod {

struct AttentionShape;

enum class ExchangePoint : uint8_t {
  kEmbedding,     // out of the vocabulary-parallel embedding: forward sums the partial rows
  kAttentionIn,   // into the column-parallel q/k/v: backward sums the input gradient
  kAttentionOut,  // out of the row-parallel output projection: forward sums
  kMlpIn,         // into the column-parallel up/gate (fc): backward sums
  kMlpOut,        // out of the row-parallel down projection: forward sums
  kHeadIn,        // into the vocabulary-parallel head: backward sums
};
const char* exchange_point_name(ExchangePoint p);  // "embedding", "attention_in", ...
// True for the points whose forward sums partial results (embedding, attention_out, mlp_out);
// the others ("in" points) sum in backward.
bool exchange_sums_forward(ExchangePoint p);

class Exchange {
 public:
  virtual ~Exchange() = default;
  // True when the exchange splits the sequence (part = N/T rows); the model's shard must agree.
  virtual bool sequence_parallel() const { return false; }
  // The forward / backward of point p (compute dtype, the backend's memory) for an activation of
  // `rows` (N) rows of `width` elements, between part and full as in the table above.
  virtual void forward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) = 0;
  virtual void backward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) = 0;
  // Statistics of the vocabulary-parallel cross-entropy (fp32, the backend's memory), in place:
  // the maximum, or the sum, over the tensor group. (loss_sum also sums a MoE block's combine
  // weights' gradient, partial on each tensor rank: model/moe_block.h.)
  virtual void loss_max(float* x, int64_t n) = 0;
  virtual void loss_sum(float* x, int64_t n) = 0;

  // ---- context parallelism (only called when context_size() > 1) ----
  // The context group's size C (1: the exchange does not split sequences); the model's
  // ContextShard must agree.
  virtual int context_size() const { return 1; }
  // The causal attention of this rank's rows (s.T = seq/C rows per sequence, at the global
  // positions context_positions gives its context rank) over all positions of their sequences:
  // out (B,T,NH*HS) = as attention_forward's rows; stats (B*NH*T fp32 words) = what backward
  // needs (the exchange's own layout). qkv, out as the backend's attention_forward.
  virtual void attention_forward(void* out, float* stats, const void* qkv, const AttentionShape& s);
  // dqkv (B,T,(NH+2*KVH)*HS) = the gradient of this rank's rows of qkv, from dout and the
  // forward's qkv, out and stats (every rank of the group calls it for the same layer).
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* stats, const AttentionShape& s);
  // The sum of x over the context group (the loss of a micro-batch's positions; host memory);
  // the second form sums n values in place (a MoE layer's router statistics).
  virtual double context_sum(double x) { return x; }
  virtual void context_sum(double* x, int64_t n) {}
};

// One rank: every point is the identity.
class IdentityExchange final : public Exchange {
 public:
  void forward(ExchangePoint, void*, void*, int64_t, int64_t) override {}
  void backward(ExchangePoint, void*, void*, int64_t, int64_t) override {}
  void loss_max(float*, int64_t) override {}
  void loss_sum(float*, int64_t) override {}
};

}  // namespace zerod
