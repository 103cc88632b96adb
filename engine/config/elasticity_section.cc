// elasticity: DeepSpeed's ElasticityConfig keys, defaults and checks (deepspeed/elasticity/
// config.py), and its rules against the rest of the job: the batch keys it takes over
// (DeepSpeedConfig: refused unless ignore_non_elastic_batch_info) and the model parallelism.
#include <fmt/format.h>

#include "engine/config/config_error.h"
#include "engine/config/elasticity.h"
#include "engine/config/sections.h"

namespace zerod::config {

namespace {

constexpr size_t kMaxMicroBatchSizes = 64;

constexpr const char* kBatchKeys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps"};

std::optional<int64_t>& batch_key(JobConfig& cfg, size_t i) {
  return i == 0 ? cfg.train_batch_size
                : (i == 1 ? cfg.train_micro_batch_size_per_gpu : cfg.gradient_accumulation_steps);
}

void read_micro_batch_sizes(ObjectReader& r, ElasticityConfig& e) {
  const Json* v = r.find("micro_batch_sizes");
  if (v == nullptr) return;
  const std::string path = r.path_of("micro_batch_sizes");
  if (!v->is_array()) {
    r.type_error(path, "a list of integers", *v);
    return;
  }
  if (v->empty()) {
    r.problems().error(path, "must list at least one micro-batch size");
    return;
  }
  // The search tries each size and their LCM as a base against each size: bounded work.
  if (v->size() > kMaxMicroBatchSizes) {
    r.problems().error(path, fmt::format("lists {} sizes; at most {} are allowed", v->size(),
                                         kMaxMicroBatchSizes));
    return;
  }
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < v->size(); ++i) {
    int64_t m = 0;
    if (!r.value_to_int((*v)[i], fmt::format("{}[{}]", path, i), m, int_between(1, kMaxBatchSize)))
      return;
    sizes.push_back(m);
  }
  e.micro_batch_sizes = std::move(sizes);
}

}  // namespace

void read_elasticity(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("elasticity");
  if (obj == nullptr) return;
  ElasticityConfig& e = cfg.elasticity;
  ObjectReader r(*obj, "elasticity", top.problems());
  r.read_bool("enabled", e.enabled);
  if (e.enabled) {
    for (const char* key : {"max_train_batch_size", "micro_batch_sizes"}) {
      if (!r.has(key))
        r.problems().error(r.path_of(key), "required when elasticity.enabled is true");
    }
  }
  const IntRange gpus = int_between(1, 1 << 24);
  r.read_int("max_train_batch_size", e.max_train_batch_size, int_between(1, kMaxBatchSize));
  read_micro_batch_sizes(r, e);
  r.read_int("min_gpus", e.min_gpus, gpus);
  r.read_int("max_gpus", e.max_gpus, gpus);
  if (e.max_gpus < e.min_gpus)
    r.problems().error(r.path_of("max_gpus"),
                       fmt::format("{} is below min_gpus {}", e.max_gpus, e.min_gpus));
  r.read_real("min_time", e.min_time, real_at_least(0.0));
  double version = e.version;
  if (r.read_real("version", version, real_above(0.0))) {
    if (version == 0.1 || version == 0.2) {
      e.version = version;
    } else {
      r.problems().error(r.path_of("version"),
                         fmt::format("{} is not an elasticity version (allowed: 0.1, 0.2)",
                                     show(*r.find("version"))));
    }
  }
  r.read_bool("prefer_larger_batch", e.prefer_larger_batch);
  r.read_bool("ignore_non_elastic_batch_info", e.ignore_non_elastic_batch_info);
  r.read_int("num_gpus_per_node", e.num_gpus_per_node, gpus);
  r.read_int("model_parallel_size", e.model_parallel_size, gpus);
  r.finish("keys");
}

void validate_elasticity(JobConfig& cfg, bool resolved_given, Problems& p) {
  const ElasticityConfig& e = cfg.elasticity;
  if (!e.enabled) return;
  const int model_ranks = cfg.parallelism.model_ranks();
  if (!e.v01() && e.model_parallel_size != model_ranks) {
    p.error("elasticity.model_parallel_size",
            fmt::format("{} does not match the ranks of one model replica, {} = {} (version 0.2 "
                        "counts data-parallel ranks per node with it)",
                        e.model_parallel_size, model_ranks_text(cfg.parallelism), model_ranks));
    return;
  }
  try {
    elastic_shared_batch(e);
  } catch (const ConfigError& err) {
    for (const std::string& problem : err.problems()) p.errors.push_back(problem);
    return;
  }
  // The batch keys elasticity takes over. A resolved job (zerod check's output) carries the ones
  // derived for its resolved.world_size: they must be those.
  if (resolved_given) {
    if (cfg.world_size % model_ranks != 0) return;  // read_resolved reports it
    ElasticTriangle t;
    try {
      t = elastic_triangle(e, cfg.world_size, model_ranks);
    } catch (const ConfigError& err) {
      for (const std::string& problem : err.problems()) p.error("resolved.world_size", problem);
      return;
    }
    const int64_t derived[] = {t.train_batch_size, t.micro_batch, t.grad_accum};
    for (size_t i = 0; i < 3; ++i) {
      const std::optional<int64_t>& v = batch_key(cfg, i);
      if (v && *v != derived[i])
        p.error(kBatchKeys[i],
                fmt::format("{} does not match elasticity's {} for resolved.world_size {}; fix or "
                            "remove it",
                            *v, derived[i], cfg.world_size));
    }
    return;
  }
  for (size_t i = 0; i < 3; ++i) {
    std::optional<int64_t>& v = batch_key(cfg, i);
    if (!v) continue;
    if (e.ignore_non_elastic_batch_info) {
      p.warn(kBatchKeys[i], fmt::format("{} is ignored: elasticity sets the batch for the world "
                                        "size (elasticity.ignore_non_elastic_batch_info)",
                                        *v));
      v.reset();
    } else {
      p.error(kBatchKeys[i],
              fmt::format("{} is set with elasticity.enabled: elasticity sets train_batch_size, "
                          "train_micro_batch_size_per_gpu and gradient_accumulation_steps for the "
                          "world size; remove it, or set elasticity.ignore_non_elastic_batch_info: "
                          "true to have it ignored",
                          *v));
    }
  }
}

}  // namespace zerod::config
