// "zero_optimization" (DeepSpeedZeroConfig: every key, its stage3_* alias, the deprecated offload
// flags), its offload_param / offload_optimizer subsections, and "aio".
#include <fmt/format.h>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {

const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};

bool read_device(ObjectReader& r, OffloadDevice& out) {
  size_t idx = 0;
  if (!r.read_choice("device", idx, kDevices, /*case_insensitive=*/false)) return false;
  out = static_cast<OffloadDevice>(idx);
  return true;
}

void read_nvme_path(ObjectReader& r, std::string& out) {
  std::optional<std::string> path;
  if (r.read_opt_string("nvme_path", path)) out = path.value_or("");
}

// Explicitly given keys of the offload sections, for the deprecated flags' conflict checks.
struct OffloadGiven {
  bool param_device = false, param_pin = false, opt_device = false, opt_pin = false;
};

void read_offload_param(const Json& obj, OffloadParamConfig& o, OffloadGiven& given,
                        Problems& problems) {
  ObjectReader r(obj, "zero_optimization.offload_param", problems);
  given.param_device = read_device(r, o.device);
  read_nvme_path(r, o.nvme_path);
  r.read_int("buffer_count", o.buffer_count, at_least(0));
  r.read_int("buffer_size", o.buffer_size, at_least(0));
  r.read_int("max_in_cpu", o.max_in_cpu, at_least(0));
  given.param_pin = r.read_bool("pin_memory", o.pin_memory);
  r.finish();
}

void read_offload_optimizer(const Json& obj, OffloadOptimizerConfig& o, OffloadGiven& given,
                            Problems& problems) {
  ObjectReader r(obj, "zero_optimization.offload_optimizer", problems);
  given.opt_device = read_device(r, o.device);
  read_nvme_path(r, o.nvme_path);
  r.read_int("buffer_count", o.buffer_count, at_least(0));
  given.opt_pin = r.read_bool("pin_memory", o.pin_memory);
  r.read_bool("pipeline_read", o.pipeline_read);
  r.read_bool("pipeline_write", o.pipeline_write);
  r.read_bool("fast_init", o.fast_init);
  r.read_real("ratio", o.ratio, real_between(0.0, 1.0));
  r.finish();
}

// DeepSpeed's pydantic fields accept both the field name and its alias ("prefetch_bucket_size"
// and "stage3_prefetch_bucket_size"). Given both with different values is an error.
bool check_alias_pair(ObjectReader& r, const char* name, const char* alias) {
  const Json* a = r.find(name);
  const Json* b = r.find(alias);
  if (a != nullptr && b != nullptr && *a != *b) {
    r.problems().error(r.path_of(name),
                       fmt::format("{} conflicts with {} {} (two names of one option; give one)",
                                   show(*a), alias, show(*b)));
    return false;
  }
  return true;
}

void read_aliased_int(ObjectReader& r, const char* name, const char* alias, int64_t& out) {
  if (!check_alias_pair(r, name, alias)) return;
  r.read_int(name, out, at_least(0));
  r.read_int(alias, out, at_least(0));
}

// A deprecated boolean flag mapped onto a new field. Returns the flag when given.
std::optional<bool> read_deprecated_flag(ObjectReader& r, const char* key, const char* use) {
  bool flag = false;
  if (!r.read_bool(key, flag)) return std::nullopt;
  r.problems().warn(r.path_of(key), fmt::format("deprecated; use {} instead", use));
  return flag;
}

void apply_deprecated_offload(ObjectReader& r, ZeroConfig& z, const OffloadGiven& given) {
  Problems& problems = r.problems();
  if (auto flag = read_deprecated_flag(r, "cpu_offload", "offload_optimizer.device \"cpu\"")) {
    const OffloadDevice want = *flag ? OffloadDevice::kCpu : OffloadDevice::kNone;
    if (given.opt_device && z.offload_optimizer.device != want) {
      problems.error(r.path_of("cpu_offload"),
                     fmt::format("{} conflicts with offload_optimizer.device \"{}\"", *flag,
                                 offload_device_name(z.offload_optimizer.device)));
    } else {
      z.offload_optimizer.device = want;
    }
  }
  for (const char* key : {"cpu_offload_param", "cpu_offload_params"}) {
    if (auto flag = read_deprecated_flag(r, key, "offload_param.device \"cpu\"")) {
      const OffloadDevice want = *flag ? OffloadDevice::kCpu : OffloadDevice::kNone;
      if (given.param_device && z.offload_param.device != want) {
        problems.error(r.path_of(key),
                       fmt::format("{} conflicts with offload_param.device \"{}\"", *flag,
                                   offload_device_name(z.offload_param.device)));
      } else {
        z.offload_param.device = want;
      }
    }
  }
  if (auto flag = read_deprecated_flag(r, "cpu_offload_use_pin_memory",
                                       "offload_param.pin_memory / offload_optimizer.pin_memory")) {
    if ((given.param_pin && z.offload_param.pin_memory != *flag) ||
        (given.opt_pin && z.offload_optimizer.pin_memory != *flag)) {
      problems.error(r.path_of("cpu_offload_use_pin_memory"),
                     fmt::format("{} conflicts with the pin_memory of offload_param or "
                                 "offload_optimizer",
                                 *flag));
    } else {
      z.offload_param.pin_memory = *flag;
      z.offload_optimizer.pin_memory = *flag;
    }
  }
  const char* kOld = "stage3_gather_fp16_weights_on_model_save";
  if (auto flag = read_deprecated_flag(r, kOld, "stage3_gather_16bit_weights_on_model_save")) {
    const Json* n1 = r.find("stage3_gather_16bit_weights_on_model_save");
    const Json* n2 = r.find("gather_16bit_weights_on_model_save");
    if ((n1 != nullptr && *n1 != Json(*flag)) || (n2 != nullptr && *n2 != Json(*flag))) {
      problems.error(
          r.path_of(kOld),
          fmt::format("{} conflicts with stage3_gather_16bit_weights_on_model_save", *flag));
    } else {
      z.stage3_gather_16bit_weights_on_model_save = *flag;
    }
  }
}

}  // namespace

void read_zero(ObjectReader& top, JobConfig& cfg) {
  Problems& problems = top.problems();
  ZeroConfig& z = cfg.zero;
  const Json* v = top.find("zero_optimization");
  const Json* allgather_size = top.find("allgather_size");
  if (v != nullptr && v->is_boolean()) {
    // DeepSpeed's oldest form: "zero_optimization": true means stage 1, with a top-level
    // "allgather_size" for the bucket.
    problems.warn("zero_optimization",
                  "the boolean form is deprecated; use an object such as {\"stage\": 1}");
    z.stage = v->get<bool>() ? 1 : 0;
    if (allgather_size != nullptr) {
      top.read_int("allgather_size", z.allgather_bucket_size, at_least(0));
      problems.warn("allgather_size", "deprecated; use zero_optimization.allgather_bucket_size");
    }
    return;
  }
  if (allgather_size != nullptr) {
    problems.error("allgather_size",
                   "only used with the deprecated boolean \"zero_optimization\"; use "
                   "zero_optimization.allgather_bucket_size");
  }
  if (v == nullptr || v->is_null()) return;
  if (!v->is_object()) {
    top.type_error("zero_optimization", "an object", *v);
    return;
  }

  ObjectReader r(*v, "zero_optimization", problems);
  r.read_int("stage", z.stage, one_of_ints(0, 3));
  r.read_bool("contiguous_gradients", z.contiguous_gradients);
  r.read_bool("reduce_scatter", z.reduce_scatter);
  r.read_int("reduce_bucket_size", z.reduce_bucket_size, at_least(0));
  r.read_bool("allgather_partitions", z.allgather_partitions);
  r.read_int("allgather_bucket_size", z.allgather_bucket_size, at_least(0));
  r.read_opt_bool("overlap_comm", z.overlap_comm);
  r.read_bool("load_from_fp32_weights", z.load_from_fp32_weights);
  r.read_int("sub_group_size", z.sub_group_size, at_least(0));
  r.read_bool("round_robin_gradients", z.round_robin_gradients);
  read_aliased_int(r, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                   z.stage3_prefetch_bucket_size);
  read_aliased_int(r, "stage3_param_persistence_threshold", "param_persistence_threshold",
                   z.stage3_param_persistence_threshold);
  read_aliased_int(r, "stage3_max_live_parameters", "max_live_parameters",
                   z.stage3_max_live_parameters);
  read_aliased_int(r, "stage3_max_reuse_distance", "max_reuse_distance",
                   z.stage3_max_reuse_distance);
  if (check_alias_pair(r, "stage3_gather_16bit_weights_on_model_save",
                       "gather_16bit_weights_on_model_save")) {
    r.read_bool("stage3_gather_16bit_weights_on_model_save",
                z.stage3_gather_16bit_weights_on_model_save);
    r.read_bool("gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  }

  OffloadGiven given;
  if (const Json* op = r.read_object("offload_param")) {
    read_offload_param(*op, z.offload_param, given, problems);
  }
  if (const Json* oo = r.read_object("offload_optimizer")) {
    read_offload_optimizer(*oo, z.offload_optimizer, given, problems);
  }
  apply_deprecated_offload(r, z, given);

  // DeepSpeed features zerod does not have: accepted only when off.
  r.expect_default("elastic_checkpoint", false, "false");
  r.expect_default("legacy_stage1", false, "false");
  r.expect_default("zero_quantized_weights", false, "false");
  r.expect_default("zero_quantized_nontrainable_weights", false, "false");
  r.expect_default("zero_quantized_gradients", false, "false");
  r.expect_default("zeropp_loco_param", nullptr, "null");
  r.expect_default("mics_hierarchical_params_gather", false, "false");
  int64_t hpz = 1;
  if (r.read_int("zero_hpz_partition_size", hpz, at_least(0)) && hpz > 1) {
    problems.error(r.path_of("zero_hpz_partition_size"),
                   fmt::format("{} is not supported by zerod (hierarchical partitioning, ZeRO++; "
                               "only 0 or 1)",
                               hpz));
  }
  int64_t mics = -1;
  if (r.read_int("mics_shard_size", mics, IntRange{}) && mics > 0) {
    problems.error(r.path_of("mics_shard_size"),
                   fmt::format("{} is not supported by zerod (MiCS; only values <= 0)", mics));
  }
  // PyTorch-hook tuning knobs with no meaning here.
  for (const char* key :
       {"use_multi_rank_bucket_allreduce", "ignore_unused_parameters", "memory_efficient_linear",
        "override_module_apply", "log_trace_cache_warnings", "pipeline_loading_checkpoint",
        "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"}) {
    r.accept_no_effect(key, "boolean");
  }
  for (const char* key : {"module_granularity_threshold", "stage3_module_granularity_threshold",
                          "model_persistence_threshold", "stage3_model_persistence_threshold"}) {
    r.accept_no_effect(key, "integer");
  }
  r.finish();
}

void read_aio(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("aio");
  if (obj == nullptr) return;
  AioConfig& a = cfg.aio;
  ObjectReader r(*obj, "aio", top.problems());
  r.read_int("block_size", a.block_size, at_least(1));
  r.read_int("queue_depth", a.queue_depth, at_least(1));
  // DeepSpeed renamed thread_count to intra_op_parallelism (DeepSpeed PR #7056); the old name
  // is still in its documentation, so it is mapped with a warning.
  const Json* old_name = r.find("thread_count");
  const Json* new_name = r.find("intra_op_parallelism");
  if (old_name != nullptr && new_name != nullptr && *old_name != *new_name) {
    top.problems().error(
        r.path_of("thread_count"),
        fmt::format("{} conflicts with intra_op_parallelism {}", show(*old_name), show(*new_name)));
  } else {
    if (old_name != nullptr && r.read_int("thread_count", a.intra_op_parallelism, at_least(1))) {
      top.problems().warn(r.path_of("thread_count"),
                          "deprecated (renamed by DeepSpeed); use intra_op_parallelism instead");
    }
    r.read_int("intra_op_parallelism", a.intra_op_parallelism, at_least(1));
  }
  r.read_bool("single_submit", a.single_submit);
  r.read_bool("overlap_events", a.overlap_events);
  r.read_bool("use_gds", a.use_gds);
  r.finish();
}

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
    case OffloadDevice::kNone:
      break;
  }
  return "none";
}

}  // namespace zerod::config
