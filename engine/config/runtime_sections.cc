// fp16 / bf16, checkpoint, activation_checkpointing, csv_monitor / tensorboard, comms_logger.
#include <fmt/format.h>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {

void read_monitor(ObjectReader& top, const char* key, MonitorConfig& m) {
  const Json* obj = top.read_object(key);
  if (obj == nullptr) return;
  ObjectReader r(*obj, key, top.problems());
  r.read_bool("enabled", m.enabled);
  r.read_string("output_path", m.output_path);
  r.read_string("job_name", m.job_name, /*allow_empty=*/false);
  r.finish();
}

}  // namespace

void read_precision(ObjectReader& top, JobConfig& cfg) {
  Problems& problems = top.problems();
  if (const Json* obj = top.read_object("fp16")) {
    Fp16Config& f = cfg.fp16;
    ObjectReader r(*obj, "fp16", problems);
    r.read_bool("enabled", f.enabled);
    r.read_bool("auto_cast", f.auto_cast);
    r.read_real("loss_scale", f.loss_scale, real_at_least(0.0));
    r.read_int("initial_scale_power", f.initial_scale_power, int_between(0, 63));
    r.read_int("loss_scale_window", f.loss_scale_window, at_least(1));
    r.read_int("hysteresis", f.hysteresis, at_least(1));
    r.read_bool("consecutive_hysteresis", f.consecutive_hysteresis);
    r.read_real("min_loss_scale", f.min_loss_scale, real_above(0.0));
    r.expect_default("fp16_master_weights_and_grads", false, "false");
    r.finish();
  }

  // "bf16", or DeepSpeed's older "bfloat16" (it reads bf16 first).
  const Json* bf16 = top.read_object("bf16");
  const Json* old = top.read_object("bfloat16");
  if (old != nullptr) {
    problems.warn("bfloat16", "deprecated; use \"bf16\" instead");
    if (bf16 != nullptr && *bf16 != *old) {
      problems.error("bfloat16", "conflicts with \"bf16\"; give only \"bf16\"");
    }
  }
  const Json* use = bf16 != nullptr ? bf16 : old;
  if (use != nullptr) {
    ObjectReader r(*use, bf16 != nullptr ? "bf16" : "bfloat16", problems);
    r.read_bool("enabled", cfg.bf16.enabled);
    r.expect_default("immediate_grad_update", false, "false");
    r.finish();
  }
}

void read_runtime_sections(ObjectReader& top, JobConfig& cfg) {
  Problems& problems = top.problems();
  if (const Json* obj = top.read_object("checkpoint")) {
    CheckpointConfig& c = cfg.checkpoint;
    ObjectReader r(*obj, "checkpoint", problems);
    size_t idx = 0;
    // DeepSpeed upper-cases the value before comparing.
    const std::vector<std::string> modes = {"Ignore", "Warn", "Fail"};
    if (r.read_choice("tag_validation", idx, modes, /*case_insensitive=*/true)) {
      c.tag_validation = modes[idx];
    }
    r.read_bool("load_universal", c.load_universal);
    r.read_bool("use_node_local_storage", c.use_node_local_storage);
    r.read_bool("async", c.async);
    if (const Json* pw = r.read_object("parallel_write")) {
      ObjectReader w(*pw, "checkpoint.parallel_write", problems);
      w.expect_default("pipeline_stage", false, "false");
      w.finish();
    }
    r.finish();
  }

  if (const Json* obj = top.read_object("activation_checkpointing")) {
    ActivationCheckpointingConfig& a = cfg.activation_checkpointing;
    ObjectReader r(*obj, "activation_checkpointing", problems);
    r.read_bool("partition_activations", a.partition_activations);
    r.read_bool("cpu_checkpointing", a.cpu_checkpointing);
    r.read_bool("contiguous_memory_optimization", a.contiguous_memory_optimization);
    r.read_opt_int("number_checkpoints", a.number_checkpoints, at_least(1));
    r.read_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
    r.read_bool("profile", a.profile);
    r.finish();
  }

  read_monitor(top, "csv_monitor", cfg.csv_monitor);
  read_monitor(top, "tensorboard", cfg.tensorboard);

  if (const Json* obj = top.read_object("comms_logger")) {
    CommsLoggerConfig& c = cfg.comms_logger;
    ObjectReader r(*obj, "comms_logger", problems);
    r.read_bool("enabled", c.enabled);
    r.read_bool("verbose", c.verbose);
    r.read_bool("prof_all", c.prof_all);
    r.read_bool("debug", c.debug);
    if (const Json* ops = r.find("prof_ops")) {
      bool ok = ops->is_array();
      if (ok) {
        for (const Json& op : *ops) ok = ok && op.is_string() && !op.get<std::string>().empty();
      }
      if (ok) {
        c.prof_ops = ops->get<std::vector<std::string>>();
      } else {
        r.type_error(r.path_of("prof_ops"), "an array of operation names", *ops);
      }
    }
    r.finish();
  }
}

}  // namespace zerod::config
