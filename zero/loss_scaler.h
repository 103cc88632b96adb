// fp16 loss scaling with DeepSpeed's rules (deepspeed/runtime/fp16/loss_scaler.py):
//
//   * fp16 off (fp32 / bf16): scale 1, never skips a step.
//   * fp16.loss_scale > 0: a static scale; a step whose gradients overflow is skipped, the scale
//     stays.
//   * fp16.loss_scale == 0: DynamicLossScaler. An overflow skips the step; it halves the scale
//     (never below min_loss_scale) once the hysteresis budget is spent: with hysteresis h, the
//     first h - 1 overflows only use up budget. After loss_scale_window steps since the last
//     overflow the scale doubles (and the budget refills, unless consecutive_hysteresis refills it
//     after every good step). An overflow while the scale already sits at min_loss_scale with no
//     budget left is an error, as in DeepSpeed (raise_error_at_min_scale).
//
// The initial dynamic scale is 2^initial_scale_power and the hysteresis is fp16.hysteresis as
// the config gives them (DeepSpeed's ZeRO optimizers use 2^32 and hysteresis 1 instead when the
// fp16 section names none of the dynamic-scaling keys; zerod always uses the documented values).
#pragma once

#include <cstdint>

#include "engine/config/job_config.h"

namespace zerod {

class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& c);

  double scale() const { return state_.scale; }
  bool enabled() const { return enabled_; }  // fp16 on
  bool dynamic() const { return dynamic_; }

  // Called once per optimizer step (after the global inf/NaN check) with whether any gradient
  // overflowed. Returns true when the step must be skipped. Updates the scale.
  bool update(bool overflow);

  // Everything that evolves, for checkpoints. set_state(state()) restores exactly.
  struct State {
    double scale = 1.0;
    int hysteresis_left = 1;  // DeepSpeed's cur_hysteresis
    int64_t iter = 0;         // cur_iter: update() calls so far
    int64_t last_overflow_iter = -1;

    bool operator==(const State&) const = default;
  };
  State state() const { return state_; }
  void set_state(const State& s);

  static constexpr double kScaleFactor = 2.0;

 private:
  bool enabled_;
  bool dynamic_;
  int64_t window_;
  int hysteresis_;  // delayed_shift
  bool consecutive_hysteresis_;
  double min_scale_;
  State state_;
};

}  // namespace zerod
