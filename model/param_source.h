// The seams between the model and ZeRO (DESIGN.md section 2). The model never knows how
// parameters are stored or gradients reduced: it asks a ParamSource for a unit's weights right
// before using them and hands each unit's gradients to a GradSink as soon as backward has
// produced all of them. Stage 3 gathers/releases in acquire/release; stage 2 starts reducing a
// unit's gradients in unit_done while backward goes on.
#pragma once

namespace zerod {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // Unit u's compute-dtype weights as one flat buffer (ParamLayout offsets), valid until the
  // matching release(u). Calls nest per unit: acquire(u) twice needs release(u) twice.
  virtual const void* acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  // A hint that unit u will be acquired soon (stage-3 prefetch); may be ignored.
  virtual void prefetch(int unit) {}
};

class GradSink {
 public:
  virtual ~GradSink() = default;
  // Unit u's gradient buffer (compute dtype, flat, ParamLayout offsets); backward accumulates
  // (+=) into it. Valid from the first call until unit_done(u).
  virtual void* grad_buffer(int unit) = 0;
  // Backward has finished unit u for this micro-batch.
  virtual void unit_done(int unit) = 0;
};

}  // namespace zerod
