// Expert parallelism's collectives (model/expert_exchange.h) over the expert-parallel group of P
// ranks: the per-expert counts in one all-to-all of E int64 (El = E / P per rank), the rows in a
// variable-count all-to-all built from point-to-point messages (one send and one receive per
// peer with a non-empty block, posted together; the rank's own block is a copy). Both ends know
// every message's size from the counts, so a message is never sized by guess, and a peer that
// dies fails the messages with the communicator's timeout and peer-loss rules (never a hang).
// Rows live in the backend's memory: the communicator must reach it (Gloo for the CPU backend).
#pragma once

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "model/expert_exchange.h"

namespace zerod {

class ExpertParallelExchange final : public ExpertExchange {
 public:
  // expert_group: the P ranks that hold one copy of every expert between them (not owned).
  ExpertParallelExchange(Communicator& expert_group, Backend& backend);

  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t experts) override;
  void all_to_all_v(const void* send, const int64_t* send_rows, void* recv,
                    const int64_t* recv_rows, int64_t width) override;

  // Rows of elements sent to other ranks by all_to_all_v so far (the comms check).
  int64_t sent_elems() const { return sent_elems_; }

 private:
  Communicator& comm_;
  Backend& be_;
  CommType type_;
  int64_t sent_elems_ = 0;
};

}  // namespace zerod
