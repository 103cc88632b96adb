// The tied embedding of a pipeline (DESIGN.md section 8, Megatron's embedding group): the first
// stage looks tokens up in it, the last stage's head multiplies by its copy. Both copies start
// equal (the same global initialisation) and stay equal because, once each stage's gradients are
// reduced over its data-parallel group, the two stages swap their shards of the embedding's
// gradient and each adds the other's: a + b and b + a are the same bits, so both optimizers take
// the same step. Stages in between take no part.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "core/memory.h"
#include "kernels/backend.h"

namespace zerod::pipeline {

class TiedEmbeddingGrads {
 public:
  // comm: the pipeline group's communicator (rank 0 the first stage, size - 1 the last); only
  // those two ranks call sum().
  TiedEmbeddingGrads(Communicator& comm, Backend& backend, MemoryTracker* tracker);
  // grad (count compute-dtype elements): this rank's reduced gradient shard of the embedding;
  // becomes the sum of the first and the last stage's.
  void sum(void* grad, int64_t count);

 private:
  Communicator& comm_;
  Backend& be_;
  MemoryTracker* tracker_;
  Buffer other_;
  size_t other_bytes_ = 0;
};

}  // namespace zerod::pipeline
