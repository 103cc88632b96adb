// "optimizer" and "scheduler": DeepSpeed's Adam/AdamW options, SGD and Adagrad (torch.optim's),
// Lion (lion-pytorch / DeepSpeed FusedLion), Lamb (DeepSpeed FusedLamb), and DeepSpeed's four LR
// schedules.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "engine/config/sections.h"

namespace zerod::config {

void read_betas(ObjectReader& p, OptimizerConfig& o) {
  const Json* v = p.find("betas");
  if (v == nullptr) return;
  const RealRange beta_range = real_between(0.0, 1.0, /*max_open=*/true);
  bool ok = v->is_array() && v->size() == 2;
  if (ok) {
    for (const Json& b : *v) ok = ok && b.is_number() && beta_range.contains(b.get<double>());
  }
  if (!ok) {
    p.problems().error(p.path_of("betas"),
                       fmt::format("expected an array of 2 numbers in [0, 1), got {}", show(*v)));
    return;
  }
  o.beta1 = (*v)[0].get<double>();
  o.beta2 = (*v)[1].get<double>();
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Optimizers DeepSpeed builds from a config (deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS) and
// common torch.optim classes it falls back to, in lower case: recognised, not supported.
const std::vector<std::string> kOtherOptimizers = {
    "muadam", "muadamw", "musgd", "rmsprop", "adadelta",   "adamax",   "nadam",
    "radam",  "asgd",    "lbfgs", "rprop",   "sparseadam", "adafactor"};

// The supported types, canonical spelling.
const std::vector<std::string> kOptimizers = {"Adam",        "AdamW",     "SGD",  "Adagrad",
                                              "Lion",        "Muon",      "Lamb", "OneBitAdam",
                                              "ZeroOneAdam", "OneBitLamb"};

const std::vector<std::string> kSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                              "OneCycle"};
// DeepSpeed's own LRRangeTest and the torch.optim.lr_scheduler classes DeepSpeed falls back to.
const std::vector<std::string> kOtherSchedulers = {"LRRangeTest",
                                                   "LambdaLR",
                                                   "MultiplicativeLR",
                                                   "StepLR",
                                                   "MultiStepLR",
                                                   "ConstantLR",
                                                   "LinearLR",
                                                   "ExponentialLR",
                                                   "SequentialLR",
                                                   "CosineAnnealingLR",
                                                   "ChainedScheduler",
                                                   "ReduceLROnPlateau",
                                                   "CyclicLR",
                                                   "OneCycleLR",
                                                   "CosineAnnealingWarmRestarts",
                                                   "PolynomialLR"};

void read_adam_params(const Json* params, OptimizerConfig& o, Problems& problems) {
  static const Json kEmpty = Json::object();
  ObjectReader p(params != nullptr ? *params : kEmpty, "optimizer.params", problems);
  if (p.find("max_grad_norm") != nullptr) {
    problems.error(p.path_of("max_grad_norm"),
                   "not supported as an optimizer parameter (as in DeepSpeed); use the top-level "
                   "\"gradient_clipping\" instead");
  }
  p.read_real("lr", o.lr, real_at_least(0.0));
  read_betas(p, o);
  p.read_real("eps", o.eps, real_at_least(0.0));
  const bool wd_given = p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  p.read_bool("bias_correction", o.bias_correction);
  bool adam_w_mode = true;  // DeepSpeed's ADAM_W_MODE_DEFAULT
  const bool mode_given = p.read_bool("adam_w_mode", adam_w_mode);
  p.read_bool("torch_adam", o.torch_adam);
  p.expect_default("amsgrad", false, "false");
  p.finish("for " + o.type, {"max_grad_norm"});

  // DeepSpeed: "AdamW" always decoupled; "Adam" decoupled unless adam_w_mode is false.
  o.adam_w_mode = o.type == "AdamW" || adam_w_mode;
  if (o.type == "AdamW" && mode_given && !adam_w_mode) {
    problems.warn(p.path_of("adam_w_mode"),
                  "false has no effect with type AdamW (DeepSpeed always uses decoupled weight "
                  "decay for AdamW; use type Adam for L2-style decay)");
  }
  // torch.optim.AdamW defaults weight_decay to 0.01; FusedAdam, CPU Adam and torch Adam to 0.
  if (!wd_given && o.torch_adam && o.adam_w_mode) o.weight_decay = 0.01;
  if (o.torch_adam && !o.bias_correction) {
    problems.error(p.path_of("bias_correction"),
                   "false is not available with torch_adam: true (torch.optim.Adam/AdamW always "
                   "correct the bias)");
  }
}

// torch's keys that tune its implementation (foreach, differentiable) or flip the objective
// (maximize): accepted at their defaults only.
void expect_torch_defaults(ObjectReader& p) {
  p.expect_default("maximize", false, "false");
  p.expect_default("differentiable", false, "false");
  p.accept_no_effect("foreach", "any");
}

// torch.optim.SGD (lr 1e-3 as in torch >= 2.2; torch 1.x required it).
void read_sgd_params(ObjectReader& p, OptimizerConfig& o) {
  o.lr = 1e-3;
  p.read_real("lr", o.lr, real_at_least(0.0));
  p.read_real("momentum", o.momentum, real_at_least(0.0));
  p.read_real("dampening", o.dampening, real_between(0.0, 1.0));
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  p.read_bool("nesterov", o.nesterov);
  expect_torch_defaults(p);
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    p.problems().error(
        p.path_of("nesterov"),
        fmt::format("true needs a momentum > 0 and dampening 0 (as torch.optim.SGD); "
                    "momentum is {}, dampening {}",
                    o.momentum, o.dampening));
  }
}

// torch.optim.Adagrad.
void read_adagrad_params(ObjectReader& p, OptimizerConfig& o) {
  o.lr = 1e-2;
  o.eps = 1e-10;
  p.read_real("lr", o.lr, real_at_least(0.0));
  p.read_real("lr_decay", o.lr_decay, real_at_least(0.0));
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  p.read_real("initial_accumulator_value", o.initial_accumulator_value, real_at_least(0.0));
  p.read_real("eps", o.eps, real_at_least(0.0));
  expect_torch_defaults(p);
}

// Lion with DeepSpeed FusedLion's defaults (the ds_config type; lr 1e-3, betas 0.9/0.999, no
// decay; lion-pytorch's paper defaults are lr 1e-4, betas 0.9/0.99) and formula: decoupled decay.
void read_lion_params(ObjectReader& p, OptimizerConfig& o) {
  o.lr = 1e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  p.read_real("lr", o.lr, real_at_least(0.0));
  read_betas(p, o);
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
}

// torch.optim.Muon (torch >= 2.9) for the hidden matrices, with DeepSpeed's Muon keys for the
// auxiliary AdamW of the other tensors (engine.py's MuonWithAuxAdam groups): "lr" is both groups'
// unless "muon_lr" / "adam_lr" set one; "betas" and "eps" are the AdamW's (DeepSpeed's meaning),
// so torch's Newton-Schulz eps is "ns_eps"; "weight_decay" is both groups' unless
// "adam_weight_decay" sets the AdamW's. Defaults: torch.optim.Muon's; the AdamW's betas and eps
// are DeepSpeed MuonWithAuxAdam's (0.9, 0.95) and 1e-10.
void read_muon_params(ObjectReader& p, OptimizerConfig& o) {
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  o.momentum = 0.95;
  o.nesterov = true;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-10;
  p.read_real("lr", o.lr, real_at_least(0.0));
  o.adam_lr = o.lr;
  p.read_real("muon_lr", o.lr, real_at_least(0.0));
  p.read_real("adam_lr", o.adam_lr, real_at_least(0.0));
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  o.adam_weight_decay = o.weight_decay;
  p.read_real("adam_weight_decay", o.adam_weight_decay, real_at_least(0.0));
  p.read_real("momentum", o.momentum, real_between(0.0, 1.0, /*max_open=*/true));
  p.read_bool("nesterov", o.nesterov);
  read_betas(p, o);
  p.read_real("eps", o.eps, real_at_least(0.0));
  p.read_real("ns_eps", o.ns_eps, real_at_least(0.0));
  p.read_int("ns_steps", o.ns_steps, int_between(0, 99));
  if (const Json* c = p.find("ns_coefficients")) {
    bool ok = c->is_array() && c->size() == 3;
    if (ok) {
      for (const Json& x : *c) ok = ok && x.is_number() && std::isfinite(x.get<double>());
    }
    if (ok) {
      o.ns_coefficients = c->get<std::vector<double>>();
    } else {
      p.problems().error(p.path_of("ns_coefficients"),
                         fmt::format("expected an array of 3 numbers (a, b, c), got {}", show(*c)));
    }
  }
  if (const Json* f = p.find("adjust_lr_fn"); f != nullptr && !f->is_null()) {
    if (f->is_string() && (*f == "original" || *f == "match_rms_adamw")) {
      o.adjust_lr_fn = f->get<std::string>();
    } else {
      p.problems().error(
          p.path_of("adjust_lr_fn"),
          fmt::format("{} is not one of null, \"original\", \"match_rms_adamw\"", show(*f)));
    }
  }
  // torch's implementation switches: use_addmm changes only how torch rounds its matmuls.
  p.accept_no_effect("use_addmm", "any");
  p.expect_default("foreach", nullptr, "null or false (torch has no foreach Muon)");
}

// DeepSpeed FusedLamb (deepspeed/ops/lamb/fused_lamb.py) with its defaults: lr 1e-3, betas
// 0.9/0.999, eps 1e-8, no decay, bias correction, max_coeff 10, min_coeff 0.01. Its decay is L2
// added to the update direction before the trust ratio. max_grad_norm is refused (as for Adam:
// gradient_clipping), amsgrad: true is refused (FusedLamb raises).
void read_lamb_params(ObjectReader& p, OptimizerConfig& o) {
  if (p.find("max_grad_norm") != nullptr) {
    p.problems().error(p.path_of("max_grad_norm"),
                       "not supported as an optimizer parameter (as in DeepSpeed); use the "
                       "top-level \"gradient_clipping\" instead");
  }
  o.lr = 1e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  p.read_real("lr", o.lr, real_at_least(0.0));
  read_betas(p, o);
  p.read_real("eps", o.eps, real_at_least(0.0));
  p.read_bool("eps_inside_sqrt", o.eps_inside_sqrt);
  p.read_real("weight_decay", o.weight_decay, real_at_least(0.0));
  p.read_bool("bias_correction", o.bias_correction);
  p.read_real("max_coeff", o.max_coeff, real_at_least(0.0));
  p.read_real("min_coeff", o.min_coeff, real_at_least(0.0));
  p.expect_default("amsgrad", false, "false: FusedLamb has no AMSGrad variant");
  if (o.min_coeff > o.max_coeff) {
    p.problems().error(p.path_of("min_coeff"),
                       fmt::format("{} is above max_coeff {} (the trust ratio is clamped to "
                                   "[min_coeff, max_coeff])",
                                   o.min_coeff, o.max_coeff));
  }
}

void read_other_params(const Json* params, OptimizerConfig& o, Problems& problems) {
  static const Json kEmpty = Json::object();
  ObjectReader p(params != nullptr ? *params : kEmpty, "optimizer.params", problems);
  if (is_onebit_optimizer(o.type)) {
    read_onebit_params(p, o);
    return;  // (finished there: its own list of keys)
  } else if (o.type == "SGD") {
    read_sgd_params(p, o);
  } else if (o.type == "Adagrad") {
    read_adagrad_params(p, o);
  } else if (o.type == "Muon") {
    read_muon_params(p, o);
  } else if (o.type == "Lamb") {
    read_lamb_params(p, o);
  } else {
    read_lion_params(p, o);
  }
  p.finish("for " + o.type, {"max_grad_norm"});
}

}  // namespace

void read_optimizer(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("optimizer");
  if (obj == nullptr) return;
  Problems& problems = top.problems();
  ObjectReader r(*obj, "optimizer", problems);
  const Json* type = r.find("type");
  const Json* params = r.read_object("params");
  r.expect_default("legacy_fusion", false, "false");
  r.finish();

  const std::string supported =
      "supported: Adam, AdamW, SGD, Adagrad, Lion, Muon, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb";
  if (type == nullptr) {
    problems.error(r.path_of("type"), fmt::format("required ({})", supported));
    return;
  }
  if (!type->is_string()) {
    r.type_error(r.path_of("type"), "a string", *type);
    return;
  }
  const std::string name = lower(type->get<std::string>());
  const auto known = std::find_if(kOptimizers.begin(), kOptimizers.end(),
                                  [&](const std::string& t) { return lower(t) == name; });
  if (known != kOptimizers.end()) {
    cfg.optimizer.type = *known;
  } else if (std::find(kOtherOptimizers.begin(), kOtherOptimizers.end(), name) !=
             kOtherOptimizers.end()) {
    problems.error(r.path_of("type"),
                   fmt::format("{} is not supported by zerod ({})", show(*type), supported));
    return;
  } else {
    const std::string guess = closest_match(name, kOptimizers);  // ignores case
    problems.error(r.path_of("type"),
                   fmt::format("{} is not a known optimizer ({}){}", show(*type), supported,
                               guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
    return;
  }
  if (cfg.optimizer.type == "Adam" || cfg.optimizer.type == "AdamW") {
    read_adam_params(params, cfg.optimizer, problems);
  } else {
    read_other_params(params, cfg.optimizer, problems);
  }
}

void read_scheduler(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("scheduler");
  if (obj == nullptr) return;
  Problems& problems = top.problems();
  ObjectReader r(*obj, "scheduler", problems);
  const Json* type = r.find("type");
  const Json* params = r.read_object("params");
  r.finish();

  std::string supported = "supported:";
  for (const std::string& s : kSchedulers) supported += (s == kSchedulers[0] ? " " : ", ") + s;
  if (type == nullptr) {
    problems.error(r.path_of("type"), fmt::format("required ({})", supported));
    return;
  }
  if (!type->is_string()) {
    r.type_error(r.path_of("type"), "a string", *type);
    return;
  }
  const std::string& name = type->get_ref<const std::string&>();
  SchedulerConfig& s = cfg.scheduler;
  const auto it = std::find(kSchedulers.begin(), kSchedulers.end(), name);
  if (it == kSchedulers.end()) {
    if (std::find(kOtherSchedulers.begin(), kOtherSchedulers.end(), name) !=
        kOtherSchedulers.end()) {
      problems.error(
          r.path_of("type"),
          fmt::format("{} is recognised but not supported by zerod ({})", show(*type), supported));
    } else {
      const std::string guess = closest_match(name, kSchedulers);
      problems.error(r.path_of("type"),
                     fmt::format("{} is not a known scheduler ({}){}", show(*type), supported,
                                 guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
    }
    return;
  }
  s.type = static_cast<SchedulerType>(1 + (it - kSchedulers.begin()));

  static const Json kEmpty = Json::object();
  ObjectReader p(params != nullptr ? *params : kEmpty, "scheduler.params", problems);
  auto read_warmup_type = [&] {
    size_t idx = 0;
    if (p.read_choice("warmup_type", idx, {"log", "linear"}, /*case_insensitive=*/false)) {
      s.warmup_type = idx == 0 ? WarmupType::kLog : WarmupType::kLinear;
    }
  };
  auto read_total = [&] {
    if (!p.has("total_num_steps")) {
      problems.error(p.path_of("total_num_steps"), fmt::format("required for {}", name));
    }
    p.read_int("total_num_steps", s.total_num_steps, at_least(1));
  };
  switch (s.type) {
    case SchedulerType::kWarmupDecayLR:
      read_total();
      [[fallthrough]];
    case SchedulerType::kWarmupLR:
      p.read_real("warmup_min_lr", s.warmup_min_lr, real_at_least(0.0));
      p.read_real("warmup_max_lr", s.warmup_max_lr, real_at_least(0.0));
      p.read_int("warmup_num_steps", s.warmup_num_steps, at_least(0));
      read_warmup_type();
      break;
    case SchedulerType::kWarmupCosineLR:
      read_total();
      p.read_real("warmup_min_ratio", s.warmup_min_ratio, real_between(0.0, 1.0));
      p.read_int("warmup_num_steps", s.warmup_num_steps, at_least(0));
      p.read_real("cos_min_ratio", s.cos_min_ratio, real_between(0.0, 1.0));
      read_warmup_type();
      break;
    case SchedulerType::kOneCycle: {
      for (const char* key : {"cycle_min_lr", "cycle_max_lr"}) {
        if (!p.has(key)) problems.error(p.path_of(key), "required for OneCycle");
      }
      p.read_real("cycle_min_lr", s.cycle_min_lr, real_at_least(0.0));
      p.read_real("cycle_max_lr", s.cycle_max_lr, real_at_least(0.0));
      p.read_real("decay_lr_rate", s.decay_lr_rate, real_at_least(0.0));
      p.read_int("cycle_first_step_size", s.cycle_first_step_size, at_least(1));
      p.read_opt_int("cycle_second_step_size", s.cycle_second_step_size, at_least(1));
      p.read_int("cycle_first_stair_count", s.cycle_first_stair_count, at_least(0));
      std::optional<int64_t> second_stairs;
      p.read_opt_int("cycle_second_stair_count", second_stairs, at_least(0));
      s.cycle_second_stair_count = second_stairs.value_or(s.cycle_first_stair_count);
      p.read_int("decay_step_size", s.decay_step_size, at_least(0));
      p.read_bool("cycle_momentum", s.cycle_momentum);
      p.read_real("cycle_min_mom", s.cycle_min_mom, real_between(0.0, 1.0, true));
      p.read_real("cycle_max_mom", s.cycle_max_mom, real_between(0.0, 1.0, true));
      p.read_real("decay_mom_rate", s.decay_mom_rate, real_at_least(0.0));
      break;
    }
    case SchedulerType::kNone:
      break;
  }
  p.finish();
}

const char* scheduler_type_name(SchedulerType t) {
  switch (t) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kOneCycle:
      return "OneCycle";
    case SchedulerType::kNone:
      break;
  }
  return "none";
}

const char* warmup_type_name(WarmupType t) {
  return t == WarmupType::kLog ? "log" : "linear";
}

}  // namespace zerod::config
