// DeepSpeed's elastic batch computation (deepspeed/elasticity/elasticity.py), step by step in
// its order, with its integer and float arithmetic (v0.2 divides with Python's true division
// and truncates with int(); doubles here round the same way).
#include "engine/config/elasticity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>

#include "engine/config/config_error.h"
#include "engine/config/job_config.h"
#include "engine/config/sections.h"

namespace zerod {

namespace {

// DeepSpeed's HCN_LIST: the 38 smallest highly composite numbers.
constexpr int64_t kHcn[] = {1,      2,      4,      6,      12,     24,     36,     48,
                            60,     120,    180,    240,    360,    720,    840,    1260,
                            1680,   2520,   5040,   7560,   10080,  15120,  20160,  25200,
                            27720,  45360,  50400,  55440,  83160,  110880, 166320, 221760,
                            277200, 332640, 498960, 554400, 665280, 720720};

[[noreturn]] void fail(std::string problem) {
  throw ConfigError({std::move(problem)});
}

std::string list_text(const std::vector<int64_t>& v, size_t max_shown = 0) {
  std::string out;
  const size_t shown = max_shown == 0 ? v.size() : std::min(v.size(), max_shown);
  for (size_t i = 0; i < shown; ++i) out += (i == 0 ? "" : ", ") + std::to_string(v[i]);
  if (shown < v.size()) out += fmt::format(", ... ({} in all)", v.size());
  return out;
}

// get_candidate_batch_sizes: each base <= cap scaled by the largest HCN h with h x base <= cap
// (the last HCN past 720720 x base); a base above the cap is skipped (DeepSpeed #8237).
std::set<int64_t> candidate_batch_sizes(const std::vector<int64_t>& bases, int64_t cap) {
  std::set<int64_t> out;
  for (int64_t base : bases) {
    if (base > cap) continue;
    if (base == cap) {
      out.insert(base);
      continue;
    }
    const int64_t value = cap / base;
    const int64_t* first_above = std::upper_bound(std::begin(kHcn), std::end(kHcn), value);
    const int64_t scale =
        first_above == std::end(kHcn) ? kHcn[std::size(kHcn) - 1] : *(first_above - 1);
    out.insert(scale * base);
  }
  return out;
}

// get_valid_gpus: every d in [min_gpus, max_gpus] dividing batch / micro for a micro-batch size
// that divides batch (DeepSpeed tries each i up to half of batch / micro; the divisors are the
// same).
std::vector<int64_t> valid_gpus(int64_t batch, const std::vector<int64_t>& micro, int64_t min_gpus,
                                int64_t max_gpus) {
  std::set<int64_t> out;
  for (int64_t m : micro) {
    if (batch % m != 0) continue;
    const int64_t q = batch / m;
    for (int64_t i = 1; i * i <= q; ++i) {
      if (q % i != 0) continue;
      for (int64_t d : {i, q / i})
        if (d >= min_gpus && d <= max_gpus) out.insert(d);
    }
  }
  return {out.begin(), out.end()};
}

struct V01 {
  int64_t batch = 0;
  std::optional<std::vector<int64_t>> valid;  // nullopt: DeepSpeed's None (no candidate won)
};

// _get_compatible_gpus_v01. `cap_text` names the cap in messages.
V01 compatible_v01(const std::vector<int64_t>& micro, int64_t cap, int64_t min_gpus,
                   int64_t max_gpus, bool prefer_larger, const std::string& cap_text) {
  const int64_t min_micro = *std::min_element(micro.begin(), micro.end());
  if (min_gpus == 0) min_gpus = 1;  // DeepSpeed's `min_gpus or 1`
  if (max_gpus == 0) max_gpus = cap / min_micro;
  for (int64_t m : micro) {
    if (m > cap)
      fail(
          fmt::format("elasticity.micro_batch_sizes: {} is above {}: every micro-batch size must "
                      "be at most the batch",
                      m, cap_text));
  }
  // The LCM of the micro-batch sizes; one above the cap is never a candidate.
  int64_t lcm = 1;
  for (int64_t m : micro) {
    lcm = lcm / std::gcd(lcm, m);
    if (__builtin_mul_overflow(lcm, m, &lcm) || lcm > cap) {
      lcm = cap + 1;
      break;
    }
  }
  std::vector<int64_t> bases = micro;
  bases.push_back(lcm);
  // get_best_candidates: the most valid sizes; ties to the larger (or smaller) batch. Its
  // strict comparisons make the result independent of the order of the candidates.
  V01 best;
  best.batch = min_micro;
  size_t best_count = 0;
  for (int64_t batch : candidate_batch_sizes(bases, cap)) {
    std::vector<int64_t> valid = valid_gpus(batch, micro, min_gpus, max_gpus);
    const bool tie_wins = prefer_larger ? batch > best.batch : batch < best.batch;
    if (valid.size() > best_count || (valid.size() == best_count && tie_wins)) {
      best_count = valid.size();
      best.batch = batch;
      best.valid = std::move(valid);
    }
  }
  return best;
}

std::string range_text(const ElasticityConfig& c) {
  return fmt::format("min_gpus {}, max_gpus {}, micro_batch_sizes [{}], max_train_batch_size {}",
                     c.min_gpus, c.max_gpus, list_text(c.micro_batch_sizes),
                     c.max_train_batch_size);
}

}  // namespace

ElasticBatch elastic_shared_batch(const ElasticityConfig& c) {
  const std::vector<int64_t>& micro = c.micro_batch_sizes;
  if (micro.empty()) fail("elasticity.micro_batch_sizes: must not be empty");
  if (c.v01()) {
    if (c.model_parallel_size > 1)
      fail(
          fmt::format("elasticity.model_parallel_size: {} needs version 0.2 (version 0.1 has no "
                      "model parallelism)",
                      c.model_parallel_size));
    const std::string cap = fmt::format("max_train_batch_size {}", c.max_train_batch_size);
    V01 r = compatible_v01(micro, c.max_train_batch_size, c.min_gpus, c.max_gpus,
                           c.prefer_larger_batch, cap);
    if (!r.valid || r.valid->empty())
      fail(
          fmt::format("elasticity: no world size in [min_gpus, max_gpus] trains any candidate "
                      "batch ({})",
                      range_text(c)));
    return {r.batch, std::move(*r.valid), false};
  }
  // _get_compatible_gpus_v02: v0.1 over nodes.
  if (c.num_gpus_per_node % c.model_parallel_size != 0)
    fail(
        fmt::format("elasticity.num_gpus_per_node: {} is not divisible by model_parallel_size {} "
                    "(version 0.2 places whole model replicas on each node)",
                    c.num_gpus_per_node, c.model_parallel_size));
  const int64_t per_node = c.num_gpus_per_node / c.model_parallel_size;
  const double gpn = static_cast<double>(c.num_gpus_per_node);
  const auto node_cap =
      static_cast<int64_t>(static_cast<double>(c.max_train_batch_size) / per_node);
  const std::string cap =
      per_node == 1 ? fmt::format("max_train_batch_size {}", c.max_train_batch_size)
                    : fmt::format("max_train_batch_size {} / {} data-parallel ranks per node = {}",
                                  c.max_train_batch_size, per_node, node_cap);
  V01 r = compatible_v01(micro, node_cap, static_cast<int64_t>(c.min_gpus / gpn),
                         static_cast<int64_t>(c.max_gpus / gpn), c.prefer_larger_batch, cap);
  if (!r.valid)  // DeepSpeed goes on to iterate None (a TypeError)
    fail(
        fmt::format("elasticity: no node count in [min_gpus, max_gpus] / num_gpus_per_node {} "
                    "trains any candidate batch ({})",
                    c.num_gpus_per_node, range_text(c)));
  ElasticBatch out;
  out.train_batch_size = r.batch * per_node;
  for (int64_t nodes : *r.valid) out.valid_sizes.push_back(nodes * per_node);
  return out;
}

ElasticBatch elastic_batch(const ElasticityConfig& c, int64_t num_gpus) {
  ElasticBatch shared = elastic_shared_batch(c);
  if (c.v01()) return shared;
  const int64_t dp = num_gpus / c.model_parallel_size;
  if (std::binary_search(shared.valid_sizes.begin(), shared.valid_sizes.end(), dp)) return shared;
  // This world's own batch: per micro-batch size, the largest multiple of micro x dp within the
  // cap; the largest (or smallest) of those.
  const int64_t per_node = c.num_gpus_per_node / c.model_parallel_size;
  const double current_dp =
      static_cast<double>(num_gpus) / static_cast<double>(c.num_gpus_per_node) * per_node;
  std::optional<double> chosen;
  for (int64_t m : c.micro_batch_sizes) {
    const double min_batch = static_cast<double>(m) * current_dp;
    const double factor = std::floor(static_cast<double>(c.max_train_batch_size) / min_batch);
    const double candidate = factor * min_batch;
    if (!chosen || (c.prefer_larger_batch ? candidate > *chosen : candidate < *chosen))
      chosen = candidate;
  }
  ElasticBatch out;
  out.train_batch_size = static_cast<int64_t>(*chosen);
  out.valid_sizes = {static_cast<int64_t>(current_dp)};
  out.own_batch = true;
  return out;
}

int64_t elastic_micro_batch(const ElasticityConfig& c, int64_t batch, int64_t ranks) {
  int64_t best = 0;
  for (int64_t m : c.micro_batch_sizes)
    if ((batch / ranks) % m == 0) best = std::max(best, m);
  return best;
}

ElasticTriangle elastic_triangle(const ElasticityConfig& c, int64_t world_size, int model_ranks) {
  ElasticTriangle t;
  t.data_parallel_size = world_size / model_ranks;
  const int64_t dp = t.data_parallel_size;
  const ElasticBatch b = elastic_batch(c, c.v01() ? dp : world_size);
  if (!std::binary_search(b.valid_sizes.begin(), b.valid_sizes.end(), dp)) {
    std::vector<int64_t> worlds;
    for (int64_t v : b.valid_sizes) worlds.push_back(v * model_ranks);
    fail(fmt::format(
        "world size {}{} is not valid for elasticity (version {}, train_batch_size {}): the valid "
        "world sizes are {}",
        world_size, model_ranks > 1 ? fmt::format(" (data-parallel size {})", dp) : "", c.version,
        b.train_batch_size, list_text(worlds, 32)));
  }
  if (b.train_batch_size <= 0)
    fail(fmt::format(
        "world size {}: elasticity finds no batch within max_train_batch_size {} for "
        "data-parallel size {} (the smallest is {} x {} = {})",
        world_size, c.max_train_batch_size, dp,
        *std::min_element(c.micro_batch_sizes.begin(), c.micro_batch_sizes.end()), dp,
        *std::min_element(c.micro_batch_sizes.begin(), c.micro_batch_sizes.end()) * dp));
  t.train_batch_size = b.train_batch_size;
  t.micro_batch = elastic_micro_batch(c, t.train_batch_size, dp);
  if (t.micro_batch == 0)  // a valid size always has one (DeepSpeed asserts it)
    fail(
        fmt::format("world size {}: no micro-batch size of [{}] divides train_batch_size {} / "
                    "data-parallel size {}",
                    world_size, list_text(c.micro_batch_sizes), t.train_batch_size, dp));
  t.grad_accum = t.train_batch_size / (t.micro_batch * dp);
  return t;
}

void check_scheduler_elastic_config(const ElasticityConfig& ours,
                                    const std::string& scheduler_json) {
  constexpr const char* kVar = "DEEPSPEED_ELASTICITY_CONFIG";
  config::Json section;
  try {
    section = config::Json::parse(scheduler_json);
  } catch (const config::Json::exception& e) {
    fail(fmt::format("{} (the resource scheduler's elasticity section): {}", kVar,
                     config::json_error_without_input(e.what())));
  }
  config::Problems problems;
  const config::Json root = {{"elasticity", section}};
  config::ObjectReader top(root, "", problems);
  JobConfig theirs;
  config::read_elasticity(top, theirs);
  if (!problems.errors.empty())
    fail(fmt::format("{} (the resource scheduler's elasticity section): {}", kVar,
                     problems.errors.front()));
  const ElasticityConfig& s = theirs.elasticity;
  std::vector<std::string> differ;
  if (s.max_train_batch_size != ours.max_train_batch_size)
    differ.push_back(fmt::format("max_train_batch_size {} (the job's: {})", s.max_train_batch_size,
                                 ours.max_train_batch_size));
  if (s.micro_batch_sizes != ours.micro_batch_sizes)
    differ.push_back(fmt::format("micro_batch_sizes [{}] (the job's: [{}])",
                                 list_text(s.micro_batch_sizes),
                                 list_text(ours.micro_batch_sizes)));
  if (s.version != ours.version)
    differ.push_back(fmt::format("version {} (the job's: {})", s.version, ours.version));
  if (differ.empty()) return;
  std::string what;
  for (const std::string& d : differ) what += (what.empty() ? "" : ", ") + d;
  fail(
      fmt::format("{}: the resource scheduler's elasticity section has {}; it would scale the job "
                  "to world sizes of another batch (DeepSpeed's ensure_immutable_elastic_config)",
                  kVar, what));
}

namespace {

std::string triangle_row(int64_t world, const ElasticTriangle& t) {
  return fmt::format("  {:>10}  {:>13}  {:>11}  {:>12}  {:>12}\n", world, t.data_parallel_size,
                     t.micro_batch, t.grad_accum, t.train_batch_size);
}

}  // namespace

std::string format_elastic_plan(const JobConfig& cfg) {
  const ElasticityConfig& c = cfg.elasticity;
  const int model_ranks = cfg.parallelism.model_ranks();
  const ElasticBatch shared = elastic_shared_batch(c);
  std::string out = fmt::format(
      "elasticity (version {}): train_batch_size {} on {} valid world size{} ({}{})\n", c.version,
      shared.train_batch_size, shared.valid_sizes.size(), shared.valid_sizes.size() == 1 ? "" : "s",
      range_text(c), c.v01() ? "" : fmt::format(", num_gpus_per_node {}", c.num_gpus_per_node));
  out += fmt::format("  {:>10}  {:>13}  {:>11}  {:>12}  {:>12}\n", "world size", "data-parallel",
                     "micro-batch", "accumulation", "global batch");
  for (int64_t dp : shared.valid_sizes) {
    ElasticTriangle t;
    t.data_parallel_size = dp;
    t.train_batch_size = shared.train_batch_size;
    t.micro_batch = elastic_micro_batch(c, t.train_batch_size, dp);
    t.grad_accum = t.micro_batch == 0 ? 0 : t.train_batch_size / (t.micro_batch * dp);
    out += triangle_row(dp * model_ranks, t);
  }
  if (!c.v01()) out += "  (version 0.2: a world size not listed trains a batch of its own)\n";
  out += "this job: " + elastic_summary(cfg) + "\n";
  return out;
}

std::string elastic_summary(const JobConfig& cfg) {
  const ElasticityConfig& c = cfg.elasticity;
  const ElasticBatch b =
      elastic_batch(c, c.v01() ? cfg.data_parallel_size : int64_t{cfg.world_size});
  return fmt::format(
      "elasticity v{}: world size {} -> micro-batch {} x accumulation {} x data-parallel {} = "
      "train_batch_size {}{}",
      c.version, cfg.world_size, cfg.micro_batch(), cfg.grad_accum(), cfg.data_parallel_size,
      cfg.global_batch(),
      b.own_batch ? " (version 0.2: this world size's own batch; not one of the shared sizes)"
                  : fmt::format(" ({} valid world sizes)", b.valid_sizes.size()));
}

}  // namespace zerod
