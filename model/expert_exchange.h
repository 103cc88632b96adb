// Expert parallelism's seam (DESIGN.md section 8, issue 23 item 3): the collectives a MoE layer
// calls when its experts are spread over an expert-parallel group of P ranks (rank r holds
// experts [r E/P, (r+1) E/P), the "local" experts). The model knows no peers: it calls these two
// exchanges and parallel/expert_exchange.h maps them onto the group's communicator.
//
// Dispatch (DeepSpeed-MoE's and Megatron's all-to-all token dispatcher): after the router and
// the permutation, a rank's kept rows are in expert order, so the rows for rank p's experts are
// one contiguous block. The rows each rank sends every other rank are exchanged first
// (exchange_counts: one fixed-size all-to-all of the per-expert counts), then the rows move in a
// variable-count all-to-all (all_to_all_v); the combine is the same call with the counts swapped.
// Every rank of the group calls them in the same order (the layers run in the same order on all
// ranks of a data-parallel job), with its own counts.
#pragma once

#include <cstdint>

namespace zerod {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // P, the ranks of the expert-parallel group, and this rank's index r there.
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // send (E) = this rank's rows per expert (E = P x El experts; block p = rank p's El experts);
  // recv (E): block s = the rows rank s sends for each of this rank's El local experts.
  virtual void exchange_counts(const int64_t* send, int64_t* recv, int64_t experts) = 0;
  // Rows of `width` compute-dtype elements: send_rows[p] rows from send (consecutive blocks, rank
  // 0's first) go to rank p; recv_rows[s] rows from rank s land in recv, blocks in rank order.
  // send and recv must not overlap.
  virtual void all_to_all_v(const void* send, const int64_t* send_rows, void* recv,
                            const int64_t* recv_rows, int64_t width) = 0;
};

}  // namespace zerod
