#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace zerod {

LrSchedule::LrSchedule(const SchedulerConfig& s, const OptimizerConfig& o)
    : s_(s),
      base_lr_(o.lr),
      beta1_(o.beta1),
      beta2_(o.beta2),
      warmup_steps_(std::max<int64_t>(2, s.warmup_num_steps)) {
  if (s.type == SchedulerType::kOneCycle) {
    ZD_CHECK(s.cycle_first_step_size > 0, "cycle_first_step_size {}", s.cycle_first_step_size);
    const double first = static_cast<double>(s.cycle_first_step_size);
    const double second =
        s.cycle_second_step_size ? static_cast<double>(*s.cycle_second_step_size) : first;
    ZD_CHECK(second > 0, "cycle_second_step_size {}", second);
    total_size_ = first + second;
    step_ratio_ = first / total_size_;
    // DeepSpeed skips a decay when decay_step_size or its rate is 0 (math.isclose(x, 0) is x == 0).
    skip_lr_decay_ = s.decay_step_size == 0 || s.decay_lr_rate == 0.0;
    skip_mom_decay_ = s.decay_step_size == 0 || s.decay_mom_rate == 0.0;
  }
  if (s.type == SchedulerType::kWarmupCosineLR) {
    ZD_CHECK(s.total_num_steps != warmup_steps_,
             "WarmupCosineLR total_num_steps {} equals the warmup length", s.total_num_steps);
  }
}

double LrSchedule::warmup_gamma(int64_t it) const {
  // The same operations as DeepSpeed (inverse_log_warm_up * log(it + 1)), for identical rounding.
  if (s_.warmup_type == WarmupType::kLog) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(warmup_steps_));
    return inverse_log_warm_up * std::log(static_cast<double>(it + 1));
  }
  return static_cast<double>(it) / static_cast<double>(warmup_steps_);
}

double LrSchedule::one_cycle_scale(int64_t it) const {
  const double batch_iteration = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + batch_iteration / total_size_);
  const double x = 1.0 + batch_iteration / total_size_ - cycle;
  if (x <= step_ratio_) return x / step_ratio_;
  return (x - 1.0) / (step_ratio_ - 1.0);
}

double LrSchedule::lr_at(int64_t it) const {
  switch (s_.type) {
    case SchedulerType::kNone:
      return base_lr_;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR: {
      double gamma = 1.0;
      if (it < warmup_steps_) {
        gamma = warmup_gamma(it);
      } else if (s_.type == SchedulerType::kWarmupDecayLR) {
        const double remaining = static_cast<double>(s_.total_num_steps - it);
        const double decay_len =
            std::max(1.0, static_cast<double>(s_.total_num_steps - warmup_steps_));
        gamma = std::max(0.0, remaining / decay_len);
      }
      const double delta = s_.warmup_max_lr - s_.warmup_min_lr;
      return s_.warmup_min_lr + delta * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      double ratio = 0.0;
      if (it < warmup_steps_) {
        ratio = s_.warmup_min_ratio + warmup_gamma(it) * (1.0 - s_.warmup_min_ratio);
      } else {
        // Past total_num_steps the cosine rises again: DeepSpeed does not clamp it.
        const double real_last_step = static_cast<double>(it - warmup_steps_ + 1);
        const double real_total_steps = static_cast<double>(s_.total_num_steps - warmup_steps_);
        const double cos_ratio =
            (1.0 + std::cos(std::numbers::pi * real_last_step / real_total_steps)) / 2.0;
        ratio = std::max(0.0, s_.cos_min_ratio + (1.0 - s_.cos_min_ratio) * cos_ratio);
      }
      return base_lr_ * ratio;
    }
    case SchedulerType::kOneCycle: {
      if (static_cast<double>(it) < total_size_) {
        return s_.cycle_min_lr + (s_.cycle_max_lr - s_.cycle_min_lr) * one_cycle_scale(it);
      }
      if (skip_lr_decay_) return s_.cycle_min_lr;
      const double decay_iteration = static_cast<double>(it) - total_size_ + 1.0;
      const double interval = decay_iteration / static_cast<double>(s_.decay_step_size);
      return s_.cycle_min_lr / (1.0 + s_.decay_lr_rate * interval);
    }
  }
  ZD_THROW("unknown scheduler type {}", static_cast<int>(s_.type));
}

double LrSchedule::one_cycle_mom_at(int64_t it) const {
  if (static_cast<double>(it) < total_size_) {
    return s_.cycle_max_mom - (s_.cycle_max_mom - s_.cycle_min_mom) * one_cycle_scale(it);
  }
  if (skip_mom_decay_) return s_.cycle_max_mom;
  // DeepSpeed multiplies the momentum up by the decay factor.
  const double decay_iteration = static_cast<double>(it) - total_size_ + 1.0;
  const double interval = decay_iteration / static_cast<double>(s_.decay_step_size);
  return s_.cycle_max_mom * (1.0 + s_.decay_mom_rate * interval);
}

double LrSchedule::lr(int64_t k) const {
  ZD_CHECK(k >= 0, "optimizer step {}", k);
  if (k > 0) return lr_at(k - 1);
  // What the scheduler's constructor writes into the optimizer (get_lr() before any step).
  switch (s_.type) {
    case SchedulerType::kNone:
      return base_lr_;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR:
      return s_.warmup_min_lr;
    case SchedulerType::kWarmupCosineLR:
      return 0.0;
    case SchedulerType::kOneCycle:
      return s_.cycle_min_lr;
  }
  ZD_THROW("unknown scheduler type {}", static_cast<int>(s_.type));
}

double LrSchedule::beta1(int64_t k) const {
  ZD_CHECK(k >= 0, "optimizer step {}", k);
  if (s_.type != SchedulerType::kOneCycle || !s_.cycle_momentum) return beta1_;
  // The constructor sets betas to (cycle_min_mom, 0.99); each step then writes get_mom().
  return k == 0 ? s_.cycle_min_mom : one_cycle_mom_at(k - 1);
}

double LrSchedule::beta2(int64_t k) const {
  ZD_CHECK(k >= 0, "optimizer step {}", k);
  if (s_.type != SchedulerType::kOneCycle || !s_.cycle_momentum) return beta2_;
  return 0.99;
}

}  // namespace zerod
