// Context parallelism's collectives (DESIGN.md section 8): the attention of a model built for a
// ContextShard (model/shard.h: C ranks, each holding seq/C positions of every sequence, the
// load-balanced causal split of chunks r and 2C-1-r) over whole sequences, and the sum of its
// loss over the context group. The model's other exchange points (the tensor group's) go to
// `tensor`, the TensorParallelExchange of a T x C mesh (none: T = 1).
//
// Ulysses (DeepSpeed): an all-to-all over the context group turns q, k, v of (local positions,
// all heads) into (all positions, heads/C): rank c takes query heads [c NH/C, (c+1) NH/C) and
// key/value heads [c KVH/C, (c+1) KVH/C) (whole grouped-query groups, so NH and KVH, per tensor
// rank, must divide by C: InputError naming them). The received rows are put in global position
// order, attention_forward runs on whole sequences for those heads (causal and sliding-window
// masks as on one rank), and a second all-to-all returns the output rows to their ranks. Backward
// repeats the forward's all-to-alls of q, k, v and the output (nothing but the model's buffers is
// kept between forward and backward), moves dout the same way, runs attention_backward, and
// returns dq, dk, dv with the inverse all-to-all. The statistics (lse) are (B, NH/C, seq) of this
// rank's heads: as many words as (B, NH, seq/C).
//
// Ring attention: the key/value columns of this rank's rows (a block of (B, seq/C, 2 KVH HS))
// travel round the context group with send_recv, C - 1 steps (rank r sends to r+1 and receives
// from r-1 while it attends to the block it holds); every rank merges each block into its
// output with attention_block_forward (online softmax on global positions; any head count, any
// window). Backward passes the blocks round again: each rank adds its queries' dQ for every
// block and the block's dK, dV into a gradient block that travels with it, and a last step
// sends every gradient block home. The statistics are the forward's lse (B, NH, seq/C).
//
// Every rank of the group issues the same collectives in the same order (one per all-to-all or
// ring step); the tensors live in the backend's memory (Gloo reaches a CPU backend's; the GPU
// path would need NCCL groups, not enabled yet). Workspaces are allocated at the first call of a
// shape (MemCategory::kActivations in `tracker`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "kernels/backend.h"
#include "model/exchange.h"

namespace zerod {

enum class ContextImpl : uint8_t { kUlysses, kRing };
const char* context_impl_name(ContextImpl impl);  // "ulysses", "ring"
// "ulysses" or "ring" (InputError otherwise).
ContextImpl parse_context_impl(const std::string& name);
// "" when Ulysses can split NH query and KVH key/value heads (one tensor rank's) C ways, else
// the problem naming the numbers.
std::string ulysses_problem(int n_head, int n_kv_head, int C);

class ContextParallelExchange final : public Exchange {
 public:
  // context_group: the C ranks splitting each sequence (its rank() is the model's
  // ContextShard::rank). tensor: the tensor group's exchange (null: T = 1). Not owned.
  ContextParallelExchange(Communicator& context_group, Backend& backend, ContextImpl impl,
                          Exchange* tensor = nullptr, MemoryTracker* tracker = nullptr);

  ContextImpl impl() const { return impl_; }
  bool sequence_parallel() const override { return tensor_->sequence_parallel(); }
  int context_size() const override { return comm_.size(); }
  void forward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) override {
    tensor_->forward(p, part, full, rows, width);
  }
  void backward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) override {
    tensor_->backward(p, part, full, rows, width);
  }
  void loss_max(float* x, int64_t n) override { tensor_->loss_max(x, n); }
  void loss_sum(float* x, int64_t n) override { tensor_->loss_sum(x, n); }

  void attention_forward(void* out, float* stats, const void* qkv,
                         const AttentionShape& s) override;
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* stats, const AttentionShape& s) override;
  double context_sum(double x) override;
  void context_sum(double* x, int64_t n) override;

 private:
  // The workspaces and position tables of shape s (made or grown at its first call).
  void prepare(const AttentionShape& s);
  void* ws(int i) { return work_[static_cast<size_t>(i)].data(); }
  const int32_t* positions_of(int rank) const { return positions_ + int64_t{rank} * T_; }

  // Ulysses. rows (B,T_,width) holding `sections` column ranges per head kind (q | k | v, or
  // the output's q) -> send blocks [c][B*T_][width/C] of rank c's heads; recv blocks from every
  // rank -> (B, seq, width/C) in global position order; and the inverse of each.
  struct Section {
    int64_t offset, width;  // columns of a qkv (or out) row; rank c takes width/C of them
  };
  void scatter_heads(const void* rows, int64_t row_width, const std::vector<Section>& sections,
                     void* send);
  void gather_heads(const void* recv, int64_t row_width, const std::vector<Section>& sections,
                    void* rows);
  void for_each_position_run(
      const std::function<void(int64_t packed, int64_t global, int64_t len)>& fn) const;
  void to_global_order(const void* recv, int64_t width, void* seqs);
  void from_global_order(const void* seqs, int64_t width, void* send);
  // rows (B,T_,row_width) -> (B, seq, head columns of this rank) in position order.
  void heads_forward(const void* rows, int64_t row_width, const std::vector<Section>& sections,
                     void* seqs);
  // The inverse: (B, seq, this rank's head columns) -> rows (B,T_,row_width).
  void heads_backward(const void* seqs, int64_t row_width, const std::vector<Section>& sections,
                      void* rows);
  void ulysses_forward(void* out, float* stats, const void* qkv, const AttentionShape& s);
  void ulysses_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* stats, const AttentionShape& s);
  void ring_forward(void* out, float* stats, const void* qkv, const AttentionShape& s);
  void ring_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                     const float* stats, const AttentionShape& s);

  Communicator& comm_;
  Backend& be_;
  ContextImpl impl_;
  Exchange* tensor_;
  IdentityExchange identity_;
  MemoryTracker* tracker_;
  CommType type_;
  size_t esz_;

  // The shape prepared for: B sequences of T_ local rows (seq_ = C T_), and the rows' widths.
  int B_ = 0, T_ = 0, seq_ = 0;
  int64_t prepared_elems_ = 0;
  std::vector<Buffer> work_;  // compute-dtype workspaces (see prepare())
  Buffer positions_buffer_;
  int32_t* positions_ = nullptr;  // (C, T_) every rank's global positions (the backend's memory)
  std::vector<int32_t> host_positions_;  // the same in host memory
};

}  // namespace zerod
