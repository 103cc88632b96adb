#include "parallel/pipeline/tied_grads.h"

#include "core/error.h"
#include "zero/compute_comm.h"

namespace zerod::pipeline {

TiedEmbeddingGrads::TiedEmbeddingGrads(Communicator& comm, Backend& backend, MemoryTracker* tracker)
    : comm_(comm), be_(backend), tracker_(tracker) {}

void TiedEmbeddingGrads::sum(void* grad, int64_t count) {
  const int last = comm_.size() - 1, rank = comm_.rank();
  ZD_CHECK(rank == 0 || rank == last, "tied embedding gradients on pipeline rank {} of {}", rank,
           comm_.size());
  if (last == 0) return;  // one stage holds the embedding and the head
  const size_t bytes = static_cast<size_t>(count) * be_.compute_elem_size();
  if (other_bytes_ < bytes) {
    other_ = be_.allocate(bytes, MemCategory::kGradients, tracker_);
    other_bytes_ = bytes;
  }
  const int peer = rank == 0 ? last : 0;
  const CommType type = compute_comm_type(be_);
  constexpr int kTag = 1 << 30;  // (apart from the runner's micro-batch tags)
  comm_
      .p2p_async({P2POp{P2POp::Kind::kSend, grad, count, type, peer, kTag},
                  P2POp{P2POp::Kind::kRecv, other_.data(), count, type, peer, kTag}})
      ->wait();
  be_.residual_forward(grad, grad, other_.data(), count);
}

}  // namespace zerod::pipeline
