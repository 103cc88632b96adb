// Timing helpers the models share: wall time per kind of op (synchronizing the backend around
// each timed op, so asynchronous GPU work is charged to the op that queued it) and decorators of
// the ZeRO seams that add the time spent inside them to a counter.
#pragma once

#include "core/timer.h"
#include "kernels/backend.h"
#include "model/param_source.h"

namespace zerod {

// Runs f, adding its wall time to slot when timing is on (be not null).
template <class F>
void timed(Backend* be, double& slot, F&& f) {
  if (be == nullptr) {
    f();
    return;
  }
  be->synchronize();
  Stopwatch sw;
  f();
  be->synchronize();
  slot += sw.seconds();
}

class TimedParams : public ParamSource {
 public:
  TimedParams(ParamSource& inner, double& seconds) : inner_(inner), seconds_(seconds) {}
  const void* acquire(int u) override;
  void release(int u) override;
  void prefetch(int u) override;

 private:
  ParamSource& inner_;
  double& seconds_;
};

class TimedGrads : public GradSink {
 public:
  TimedGrads(GradSink& inner, double& seconds) : inner_(inner), seconds_(seconds) {}
  void* grad_buffer(int u) override;
  void unit_done(int u) override;

 private:
  GradSink& inner_;
  double& seconds_;
};

// Byte offsets into flat buffers of esz-byte elements.
inline const char* elem_at(const void* base, int64_t elems, size_t esz) {
  return static_cast<const char*>(base) + elems * static_cast<int64_t>(esz);
}
inline char* elem_at(void* base, int64_t elems, size_t esz) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esz);
}

}  // namespace zerod
