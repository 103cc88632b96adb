// Top-level ds_config sections and keys DeepSpeed knows and zerod does not support. They are
// recognised (so a DeepSpeed user gets "not supported" instead of "unknown key"), and accepted
// only when they ask for nothing: a section with "enabled": false, a key at its default.
#include <fmt/format.h>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {

struct Feature {
  const char* key;
  const char* what;
};

// Sections that switch a DeepSpeed feature on; allowed only as {"enabled": false, ...}.
const Feature kSections[] = {
    {"amp", "NVIDIA Apex AMP"},
    {"pipeline", "DeepSpeed's pipeline section (pipeline parallelism is parallelism.pipeline)"},
    {"compression_training", "compression training"},
    {"data_efficiency", "data efficiency (curriculum learning, data routing)"},
    {"curriculum_learning", "curriculum learning"},
    {"flops_profiler", "the flops profiler"},
    {"wandb", "the Weights & Biases monitor"},
    {"comet", "the Comet monitor"},
    {"autotuning", "autotuning"},
    {"sparse_attention", "sparse attention"},
    {"progressive_layer_drop", "progressive layer drop"},
    {"eigenvalue", "eigenvalue computation"},
    {"quantize_training", "quantization-aware training (MoQ)"},
    {"nebula", "Nebula checkpointing"},
    {"hybrid_engine", "the hybrid (RLHF) engine"},
    {"weight_quantization", "weight quantization"},
    {"timers", "DeepSpeed's throughput timers"},
};

}  // namespace

void read_unsupported(ObjectReader& top) {
  Problems& problems = top.problems();
  for (const Feature& f : kSections) {
    const Json* v = top.find(f.key);
    if (v == nullptr) continue;
    if (v->is_object()) {
      auto it = v->find("enabled");
      if (it != v->end() && it->is_boolean() && !it->get<bool>()) continue;
    }
    problems.error(f.key, fmt::format("zerod does not support {} (\"{}\"); remove the section or "
                                      "set \"enabled\": false",
                                      f.what, f.key));
  }

  // Scalar keys: only DeepSpeed's default is accepted.
  top.expect_default("sparse_gradients", false, "false");
  top.expect_default("disable_allgather", false, "false");
  top.expect_default("communication_data_type", nullptr, "null");
  top.expect_default("seq_parallel_comm_data_type", "fp32", "\"fp32\"");
  top.expect_default("graph_harvesting", false, "false");
  top.expect_default("use_data_before_expert_parallelism", false, "false");
  top.expect_default("dataloader_drop_last", false, "false");
  if (const Json* dt = top.read_object("data_types")) {
    ObjectReader r(*dt, "data_types", problems);
    r.expect_default("grad_accum_dtype", nullptr, "null");
    r.finish();
  }
  // Keys that only steer DeepSpeed's Python side.
  top.accept_no_effect("zero_allow_untested_optimizer", "boolean");
  top.accept_no_effect("zero_force_ds_cpu_optimizer", "boolean");
  top.accept_no_effect("memory_breakdown", "boolean");
  top.accept_no_effect("vocabulary_size", "integer");
}

}  // namespace zerod::config
