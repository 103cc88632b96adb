#include "model/op_timing.h"

#include "model/model.h"

namespace zerod {

OpTimes& OpTimes::operator+=(const OpTimes& o) {
  for (double OpTimes::*f :
       {&OpTimes::encoder, &OpTimes::layernorm, &OpTimes::matmul_fwd, &OpTimes::matmul_bwd,
        &OpTimes::attention_fwd, &OpTimes::attention_bwd, &OpTimes::gelu, &OpTimes::residual,
        &OpTimes::classifier, &OpTimes::rounding, &OpTimes::moe, &OpTimes::forward,
        &OpTimes::backward, &OpTimes::zero_wait})
    this->*f += o.*f;
  return *this;
}

double OpTimes::total() const {
  return encoder + layernorm + matmul_fwd + matmul_bwd + attention_fwd + attention_bwd + gelu +
         residual + classifier + rounding + moe;
}

const void* TimedParams::acquire(int u) {
  Stopwatch sw;
  const void* p = inner_.acquire(u);
  seconds_ += sw.seconds();
  return p;
}

void TimedParams::release(int u) {
  Stopwatch sw;
  inner_.release(u);
  seconds_ += sw.seconds();
}

void TimedParams::prefetch(int u) {
  Stopwatch sw;
  inner_.prefetch(u);
  seconds_ += sw.seconds();
}

void* TimedGrads::grad_buffer(int u) {
  Stopwatch sw;
  void* p = inner_.grad_buffer(u);
  seconds_ += sw.seconds();
  return p;
}

void TimedGrads::unit_done(int u) {
  Stopwatch sw;
  inner_.unit_done(u);
  seconds_ += sw.seconds();
}

}  // namespace zerod
