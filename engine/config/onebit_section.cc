// optimizer.params of DeepSpeed's 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) with
// DeepSpeed's names and defaults, and the combinations they cannot serve.
#include <fmt/format.h>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {
const std::vector<std::string> kCommBackends = {"nccl", "mpi", "compressed", "hccl"};
}  // namespace

void read_onebit_params(ObjectReader& p, OptimizerConfig& o) {
  OnebitConfig& b = o.onebit;
  if (p.find("max_grad_norm") != nullptr) {
    p.problems().error(p.path_of("max_grad_norm"),
                       "not supported as an optimizer parameter (as in DeepSpeed); use the "
                       "top-level \"gradient_clipping\" instead");
  }
  p.read_real("lr", o.lr, real_at_least(0.0));
  read_betas(p, o);
  p.read_real("eps", o.eps, real_at_least(0.0));
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  // DeepSpeed's 1-bit optimizers take bias_correction and eps_inside_sqrt but use neither: no
  // bias correction, eps added to sqrt(v). Accepted as booleans; nothing changes.
  bool unused = false;
  p.read_bool("bias_correction", unused);
  p.read_bool("eps_inside_sqrt", unused);
  p.expect_default("amsgrad", false, "false");
  p.read_bool("cuda_aware", b.cuda_aware);
  size_t backend = 0;
  if (p.read_choice("comm_backend_name", backend, kCommBackends, false))
    b.comm_backend_name = kCommBackends[backend];
  if (o.type == "ZeroOneAdam") {
    p.read_int("var_freeze_step", b.var_freeze_step, at_least(0));
    p.read_int("var_update_scaler", b.var_update_scaler, at_least(1));
    p.read_int("local_step_scaler", b.local_step_scaler, at_least(1));
    p.read_int("local_step_clipper", b.local_step_clipper, at_least(1));
  } else {
    p.read_int("freeze_step", b.freeze_step, at_least(0));
  }
  if (o.type == "OneBitLamb") {
    p.read_real("max_coeff", b.max_coeff, real_above(0.0));
    p.read_real("min_coeff", b.min_coeff, real_above(0.0));
    p.read_real("coeff_beta", b.coeff_beta, real_between(0.0, 1.0, true));
    p.read_real("factor_max", b.factor_max, real_above(0.0));
    p.read_real("factor_min", b.factor_min, real_above(0.0));
    p.read_real("factor_threshold", b.factor_threshold, real_between(0.0, 1.0, true));
    if (b.min_coeff > b.max_coeff)
      p.problems().error(p.path_of("min_coeff"),
                         fmt::format("{} is above max_coeff {}", b.min_coeff, b.max_coeff));
    if (b.factor_min > b.factor_max)
      p.problems().error(p.path_of("factor_min"),
                         fmt::format("{} is above factor_max {}", b.factor_min, b.factor_max));
  }
  // The update DeepSpeed's 1-bit optimizers apply: decoupled decay, no bias correction.
  o.adam_w_mode = true;
  o.bias_correction = false;
  p.finish("for " + o.type, {"max_grad_norm"});
}

void validate_onebit(const JobConfig& cfg, Problems& p) {
  const OptimizerConfig& o = cfg.optimizer;
  if (!is_onebit_optimizer(o.type)) return;
  // DeepSpeed asserts "not compatible with ZeRO" for all three: the momentum is exchanged whole
  // (compressed) by every rank, which needs the full optimizer states on each.
  if (cfg.zero.stage != 0) {
    p.error("zero_optimization.stage",
            fmt::format("{} with optimizer {}: the 1-bit optimizers need stage 0 (every rank "
                        "holds the whole momentum it compresses; DeepSpeed: \"not compatible "
                        "with ZeRO\")",
                        cfg.zero.stage, o.type));
  }
  if (cfg.zero.offload_optimizer.device != OffloadDevice::kNone ||
      cfg.zero.offload_param.device != OffloadDevice::kNone) {
    p.error(cfg.zero.offload_optimizer.device != OffloadDevice::kNone
                ? "zero_optimization.offload_optimizer.device"
                : "zero_optimization.offload_param.device",
            fmt::format("offload cannot be combined with optimizer {} (it runs at stage 0 only)",
                        o.type));
  }
  // (train.device cuda: the states and the update are on the host, the compressed momenta go
  // over the data-parallel group's Gloo communicator, whatever train.device_comm: zero/onebit.h.)
  const bool zero_one = o.type == "ZeroOneAdam";
  const int64_t freeze = zero_one ? o.onebit.var_freeze_step : o.onebit.freeze_step;
  if (cfg.train.steps > 0 && freeze >= cfg.train.steps) {
    p.warn(zero_one ? "optimizer.params.var_freeze_step" : "optimizer.params.freeze_step",
           fmt::format("{} is not below train.steps {}: the run never leaves the uncompressed "
                       "warm-up{}",
                       freeze, cfg.train.steps,
                       zero_one ? " (the variance keeps updating)" : " (no compression)"));
  }
}

}  // namespace zerod::config
