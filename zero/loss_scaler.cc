#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace zerod {

LossScaler::LossScaler(const Fp16Config& c)
    : enabled_(c.enabled),
      dynamic_(c.enabled && c.loss_scale == 0.0),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      consecutive_hysteresis_(c.consecutive_hysteresis),
      min_scale_(c.min_loss_scale) {
  if (dynamic_) {
    ZD_CHECK(window_ >= 1 && hysteresis_ >= 1 && min_scale_ > 0.0,
             "fp16 window {} hysteresis {} min scale {}", window_, hysteresis_, min_scale_);
    state_.scale = std::ldexp(1.0, c.initial_scale_power);
  } else {
    state_.scale = c.enabled ? c.loss_scale : 1.0;
  }
  state_.hysteresis_left = hysteresis_;
}

bool LossScaler::update(bool overflow) {
  if (!enabled_) {
    ++state_.iter;
    return false;
  }
  if (!dynamic_) {
    ++state_.iter;
    return overflow;
  }
  State& s = state_;
  if (overflow) {
    if (hysteresis_ == 1 || s.hysteresis_left == 1) {
      if (s.scale == min_scale_) {
        ZD_THROW_INPUT(
            "fp16: gradients overflowed at the minimum loss scale {} (fp16.min_loss_scale) on "
            "optimizer step {}; the loss scale cannot go lower. Lower fp16.min_loss_scale or the "
            "learning rate, or train in bf16",
            s.scale, s.iter);
      }
      s.scale = std::max(s.scale / kScaleFactor, min_scale_);
    } else {
      --s.hysteresis_left;
    }
    s.last_overflow_iter = s.iter;
  } else {
    if (consecutive_hysteresis_) s.hysteresis_left = hysteresis_;
    if ((s.iter - s.last_overflow_iter) % window_ == 0) {
      if (!consecutive_hysteresis_) s.hysteresis_left = hysteresis_;
      s.scale *= kScaleFactor;
    }
  }
  ++s.iter;
  return overflow;
}

void LossScaler::set_state(const State& s) {
  ZD_CHECK(s.scale > 0.0 && std::isfinite(s.scale), "loss scale {}", s.scale);
  ZD_CHECK(s.hysteresis_left >= 1 && s.iter >= 0 && s.last_overflow_iter >= -1 &&
               s.last_overflow_iter < s.iter,
           "loss scaler state hysteresis {} iter {} last overflow {}", s.hysteresis_left, s.iter,
           s.last_overflow_iter);
  state_ = s;
}

}  // namespace zerod
