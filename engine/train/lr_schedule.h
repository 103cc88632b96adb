// Learning-rate (and momentum) schedules with DeepSpeed's formulas and its step bookkeeping
// (deepspeed/runtime/lr_schedules.py as driven by DeepSpeedEngine):
//
//   * The scheduler is constructed with last_batch_iteration = -1; its constructor writes an
//     initial lr (and, OneCycle, betas) into the optimizer. The first optimizer step uses that.
//   * After each optimizer step that is not skipped (fp16 overflow), scheduler.step() advances
//     last_batch_iteration by one and writes get_lr() for the next step.
//
// So the k-th step actually taken (k = 0 first) runs with the value the constructor wrote when
// k == 0, and with get_lr() at last_batch_iteration = k - 1 otherwise. lr(k) is a pure function
// of k: resuming needs only the number of steps taken.
#pragma once

#include <cstdint>

#include "engine/config/job_config.h"

namespace zerod {

class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& s, const OptimizerConfig& o);

  // lr of the k-th optimizer step actually taken (k >= 0). With no scheduler: optimizer lr.
  double lr(int64_t k) const;
  // Adam beta1 / beta2 of step k: OneCycle with cycle_momentum cycles beta1 and, as DeepSpeed
  // does, sets beta2 to 0.99; otherwise the optimizer's betas.
  double beta1(int64_t k) const;
  double beta2(int64_t k) const;

  const SchedulerConfig& config() const { return s_; }

 private:
  // DeepSpeed's get_lr() / get_mom() with last_batch_iteration = it (it >= 0).
  double lr_at(int64_t it) const;
  double warmup_gamma(int64_t it) const;  // WarmupLR / WarmupDecayLR / WarmupCosineLR ramp
  double one_cycle_scale(int64_t it) const;
  double one_cycle_mom_at(int64_t it) const;

  SchedulerConfig s_;
  double base_lr_;  // the optimizer's lr (WarmupCosineLR scales it)
  double beta1_, beta2_;
  int64_t warmup_steps_;  // max(2, warmup_num_steps), as DeepSpeed clamps it
  // OneCycle shape
  double total_size_ = 0, step_ratio_ = 0;
  bool skip_lr_decay_ = true, skip_mom_decay_ = true;
};

}  // namespace zerod
