// A gradient compression hook for stage 0 (PyTorch DDP's communication hook): on the last
// micro-batch of a step the reducer asks it whether it takes over the step's gradient
// reduction; if so the reducer does no bucketed all-reduce and at finish() hands it the whole
// gradient buffer to reduce in place (zero/powersgd.h is the one implementation).
#pragma once

namespace zerod {

class GradCompression {
 public:
  virtual ~GradCompression() = default;
  // Once per step, before the last micro-batch's backward: true when this step's gradients go
  // through reduce(), false for the reducer's plain all-reduce. Every call counts one step.
  virtual bool begin_step() = 0;
  // full: every unit's padded gradients back to back (a world-1 Partition's padded offsets,
  // compute dtype), this rank's local sums. On return, in place: the (approximate) sums over
  // the ranks, identical on every rank, as the plain all-reduce would give.
  virtual void reduce(void* full) = 0;
};

}  // namespace zerod
