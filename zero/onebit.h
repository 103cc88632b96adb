// DeepSpeed's 1-bit optimizers (deepspeed/runtime/fp16/onebit/) over the states of a stage-0
// ZeroEngine: after a warm-up of ordinary steps on all-reduced gradients, each rank updates its
// momentum from its own gradients and the momenta are averaged through the 1-bit compressed
// all-reduce (comm/compressed_allreduce.h), with worker and server errors kept per rank.
//
//   OneBitAdam (arXiv 2102.02888, adam.py). Steps 1..freeze_step: Adam with DeepSpeed's 1-bit
//     formula (no bias correction, decoupled decay: p -= lr (m / (sqrt(v) + eps) + wd p)), the
//     engine's Adam kernel on all-reduced gradients. After: v frozen, gradients not reduced;
//       m = b1 m + (1 - b1) g_local;  m = compressed_allreduce(m);  m *= mask;
//       p -= lr (m / (sqrt(v) + eps) + wd p)
//     The compression is per unit (one flat tensor each, as DeepSpeed's FP16_Optimizer flattens
//     a parameter group); the mask zeroes the momentum outside the unit's tensors (alignment,
//     padding, the padded vocabulary rows: DeepSpeed's exp_avg_mask), which 1 bit cannot.
//
// Deviation, stated: DeepSpeed's first step() call only initialises its buffers (the moments
// take the first gradient and the weights do not move); zerod's first step is a full step, so
// with freeze_step >= the steps run OneBitAdam is bitwise the Adam kernel without bias
// correction. Step numbers here are zerod's (1-based optimizer steps).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/compressed_allreduce.h"
#include "engine/config/onebit_config.h"
#include "model/layout.h"
#include "zero/partition.h"

namespace zerod {

enum class OnebitKind { kNone, kAdam, kZeroOneAdam, kLamb };
// "OneBitAdam" -> kAdam, ...; any other type -> kNone.
OnebitKind onebit_kind(const std::string& type);

// One unit's states and gradients as the compressed step sees them (host fp32, n elements each,
// the unit's flat buffer: stage 0 holds it whole).
struct OnebitUnit {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grad = nullptr;  // this rank's own gradients, still multiplied by the loss scale
  int64_t n = 0;
};

// The hyperparameters of one step.
struct OnebitStep {
  int64_t step = 1;  // 1-based, this step's number
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  float grad_scale = 1.0f;  // 1 / loss scale x clipping
};

class OnebitOptimizer {
 public:
  OnebitOptimizer(OnebitKind kind, const OnebitConfig& cfg, const ParamLayout& layout,
                  const Partition& part, Communicator& comm);

  OnebitKind kind() const { return kind_; }
  // Whether step `step` is an ordinary step on all-reduced gradients (the warm-up).
  bool reduces_gradients(int64_t step) const;
  // One step past the warm-up on this rank's local gradients (collective: the compressed
  // all-reduces). units[u] is unit u.
  void compressed_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);

  // This rank's errors, for a checkpoint (a little-endian binary file with a header naming the
  // kind, world, rank and sizes) and back: load refuses another world size or kind (InputError).
  std::string serialize(int64_t step) const;
  void deserialize(const std::string& bytes, const std::string& what);

 private:
  // Zeroes m outside the tensors of unit u (the mask).
  void mask(int u, float* m) const;

  OnebitKind kind_;
  OnebitConfig cfg_;
  const ParamLayout& layout_;
  const Partition& part_;
  Communicator& comm_;
  CompressedAllReduce car_;
  // Per unit: the element ranges [begin, end) that hold real parameters.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> live_;
  std::vector<std::vector<float>> worker_, server_;  // per unit
};

}  // namespace zerod
