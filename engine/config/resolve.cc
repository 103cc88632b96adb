// resolve_job: DeepSpeed's batch triangle (DeepSpeedConfig._set_batch_related_parameters and
// _batch_assertion) for a world size, then every derived value.
//
//   train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp
//
// over the data-parallel size dp = world_size / (parallelism.pipeline x tensor x context)
// (the world size when none splits the model).
//
// Two of the three derive the third by integer division in DeepSpeed's order; one alone derives
// the rest with gradient_accumulation_steps = 1. The result must then hold exactly. With
// elasticity enabled, all three come from it for the world size (DeepSpeedConfig's elastic
// branch), and a world size it does not allow is refused.
#include <fmt/format.h>

#include "engine/config/elasticity.h"
#include "engine/config/parse.h"
#include "engine/config/sections.h"
#include "parallel/pipeline/schedule.h"

namespace zerod {

namespace {

constexpr const char* kTrain = "train_batch_size";
constexpr const char* kMicro = "train_micro_batch_size_per_gpu";
constexpr const char* kAccum = "gradient_accumulation_steps";

// Derives the missing sides; returns how, for messages ("" when nothing was derived).
std::string derive_triangle(JobConfig& cfg, int ws, const char* wsn,
                            std::vector<std::string>& problems) {
  std::optional<int64_t>& tb = cfg.train_batch_size;
  std::optional<int64_t>& mb = cfg.train_micro_batch_size_per_gpu;
  std::optional<int64_t>& ga = cfg.gradient_accumulation_steps;
  if (tb && mb && ga) return "";
  if (tb && mb) {
    ga = *tb / *mb / ws;
    return fmt::format("{} derived as {} {} // {} {} // {} {} = {}", kAccum, kTrain, *tb, kMicro,
                       *mb, wsn, ws, *ga);
  }
  if (tb && ga) {
    mb = *tb / ws / *ga;
    return fmt::format("{} derived as {} {} // {} {} // {} {} = {}", kMicro, kTrain, *tb, wsn, ws,
                       kAccum, *ga, *mb);
  }
  if (mb && ga) {
    int64_t product = 0;
    if (__builtin_mul_overflow(*mb, *ga, &product) ||
        __builtin_mul_overflow(product, static_cast<int64_t>(ws), &product)) {
      problems.push_back(
          fmt::format("{} {} x {} {} x {} {} is too large", kMicro, *mb, kAccum, *ga, wsn, ws));
      return "";
    }
    tb = product;
    return fmt::format("{} derived as {} x {} x {} = {}", kTrain, kMicro, kAccum, wsn, *tb);
  }
  if (tb) {
    ga = 1;
    mb = *tb / ws;
    return fmt::format("{} derived as {} {} // {} {} = {} with {} 1", kMicro, kTrain, *tb, wsn, ws,
                       *mb, kAccum);
  }
  if (mb) {
    int64_t product = 0;
    if (__builtin_mul_overflow(*mb, static_cast<int64_t>(ws), &product)) {
      problems.push_back(fmt::format("{} {} x {} {} is too large", kMicro, *mb, wsn, ws));
      return "";
    }
    tb = product;
    ga = 1;
    return fmt::format("{} derived as {} x {} = {} with {} 1", kTrain, kMicro, wsn, *tb, kAccum);
  }
  problems.push_back(fmt::format("{} or {} is required (with {} they set the global batch)", kTrain,
                                 kMicro, kAccum));
  return "";
}

void check_triangle(const JobConfig& cfg, int ws, const char* wsn, const std::string& how,
                    std::vector<std::string>& problems) {
  const std::string note = how.empty() ? "" : fmt::format(" ({})", how);
  const int64_t tb = *cfg.train_batch_size;
  const int64_t mb = *cfg.train_micro_batch_size_per_gpu;
  const int64_t ga = *cfg.gradient_accumulation_steps;
  // DeepSpeed's order: train, micro, accumulation each > 0, then the product.
  for (auto [name, v] : {std::pair{kTrain, tb}, std::pair{kMicro, mb}, std::pair{kAccum, ga}}) {
    if (v <= 0) {
      problems.push_back(fmt::format("{}: {} must be greater than 0{}", name, v, note));
      return;
    }
  }
  if (tb > config::kMaxBatchSize) {
    problems.push_back(fmt::format("{} {} is too large (at most {} sequences per step){}", kTrain,
                                   tb, config::kMaxBatchSize, note));
    return;
  }
  __int128 product = static_cast<__int128>(mb) * ga * ws;
  if (product != tb) {
    problems.push_back(fmt::format("{} {} != {} {} x {} {} x {} {}{}", kTrain, tb, kMicro, mb,
                                   kAccum, ga, wsn, ws, note));
  }
}

}  // namespace

void resolve_job(JobConfig& cfg, int world_size) {
  if (world_size < 1) {
    throw ConfigError({fmt::format("world size {} must be at least 1", world_size)}, cfg.source);
  }
  std::vector<std::string> problems;
  JobConfig out = cfg;  // cfg is left untouched when resolving fails
  out.world_size = world_size;
  // The batch triangle holds over the data-parallel ranks (DeepSpeed's dp world size).
  const int model_ranks = out.parallelism.model_ranks();
  if (world_size % model_ranks != 0) {
    problems.push_back(fmt::format("world size {} is not divisible by {} = {}", world_size,
                                   config::model_ranks_text(out.parallelism), model_ranks));
    throw ConfigError(std::move(problems), cfg.source);
  }
  out.data_parallel_size = world_size / model_ranks;
  const int dp = out.data_parallel_size;
  const char* dp_name = model_ranks == 1 ? "world size" : "data-parallel size";
  if (const int E = out.parallelism.expert; E > 1 && dp % E != 0) {
    // DeepSpeed-MoE's groups: expert-parallel groups of E ranks carved out of the data-parallel
    // ones.
    problems.push_back(
        fmt::format("parallelism.expert {} does not divide the {} {}: the "
                    "expert-parallel groups are E consecutive data-parallel ranks",
                    E, dp_name, dp));
  }
  std::string how;
  if (out.elasticity.enabled) {
    try {
      const ElasticTriangle t = elastic_triangle(out.elasticity, world_size, model_ranks);
      out.train_batch_size = t.train_batch_size;
      out.train_micro_batch_size_per_gpu = t.micro_batch;
      out.gradient_accumulation_steps = t.grad_accum;
      how = "set by elasticity";
    } catch (const ConfigError& e) {
      throw ConfigError(e.problems(), cfg.source);
    }
  } else {
    how = derive_triangle(out, dp, dp_name, problems);
  }
  if (problems.empty()) check_triangle(out, dp, dp_name, how, problems);
  // The pipeline's micro-batches per step are the gradient accumulation steps (DeepSpeed's rule).
  pipeline::ScheduleKind schedule{};
  if (problems.empty() && out.parallelism.pipeline > 1 &&
      pipeline::parse_schedule_name(out.parallelism.pipeline_schedule, schedule)) {
    const std::string why = pipeline::schedule_problem(
        schedule, out.parallelism.pipeline, static_cast<int>(out.grad_accum()),
        schedule == pipeline::ScheduleKind::kInterleaved1F1B ? out.parallelism.virtual_stages : 1);
    if (!why.empty())
      problems.push_back(fmt::format("parallelism.pipeline_schedule: {} (pipeline {})", why,
                                     out.parallelism.pipeline));
  }
  if (!problems.empty()) throw ConfigError(std::move(problems), cfg.source);
  config::derive_values(out);
  cfg = std::move(out);
}

}  // namespace zerod
