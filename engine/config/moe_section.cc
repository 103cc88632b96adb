// Mixture of experts in the model section: Mixtral's Hugging Face keys (model.type "mixtral")
// and the "moe" section that turns the MLP of a GPT-2 or Llama-family model into experts
// (DeepSpeed-MoE's names: num_experts, top_k, capacity_factor, eval_capacity_factor,
// min_capacity, drop_tokens; aux_loss_coef, router_z_loss_coef, moe_layer_frequency,
// shared_experts). Their rules against the rest of the job: what zerod runs MoE layers with.
#include <fmt/format.h>

#include "engine/config/config_error.h"
#include "engine/config/parse.h"
#include "engine/config/sections.h"

namespace zerod::config {

void set_mixtral_defaults(ModelConfig& m) {
  // MixtralConfig's defaults where they differ from the Llama family's.
  m.rms_norm_eps = 1e-5;
  m.rope_theta = 1e6;
  MoeConfig& e = m.moe;
  e.num_experts = 8;
  e.top_k = 2;
  e.drop_tokens = false;
  e.aux_loss_coef = 0.001;
  e.output_router_logits = false;
}

void read_mixtral_keys(ObjectReader& r, ModelConfig& m) {
  MoeConfig& e = m.moe;
  r.read_int("num_local_experts", e.num_experts, int_between(1, 1 << 16));
  r.read_int("num_experts_per_tok", e.top_k, int_between(1, 1 << 16));
  r.read_real("router_aux_loss_coef", e.aux_loss_coef, real_at_least(0.0));
  r.read_bool("output_router_logits", e.output_router_logits);
  // Mixtral's sliding_window (null by default): zerod's Mixtral attends causally over the whole
  // sequence.
  if (const Json* w = r.find("sliding_window"); w != nullptr && !w->is_null()) {
    r.problems().error(r.path_of("sliding_window"),
                       fmt::format("{} is not supported for type \"mixtral\" (only null: full "
                                   "causal attention)",
                                   r.problems().quote(*w)));
  }
  if (const Json* j = r.find("router_jitter_noise");
      j != nullptr && !(j->is_number() && j->get<double>() == 0.0)) {
    r.problems().error(r.path_of("router_jitter_noise"),
                       fmt::format("{} is not supported (allowed: 0.0; zerod's router is "
                                   "deterministic)",
                                   r.problems().quote(*j)));
  }
}

void read_moe_section(ObjectReader& model, ModelConfig& m) {
  const Json* obj = model.read_object("moe");
  if (obj == nullptr) return;
  const std::string path = model.path_of("moe");
  if (m.type == "mixtral") {
    model.problems().error(path,
                           "a moe section cannot be combined with type \"mixtral\", whose experts "
                           "are its own keys (num_local_experts, num_experts_per_tok, "
                           "router_aux_loss_coef, output_router_logits)");
    return;
  }
  ObjectReader r(*obj, path, model.problems());
  MoeConfig& e = m.moe;
  if (!r.has("num_experts"))
    r.problems().error(r.path_of("num_experts"), "required in a moe section");
  r.read_int("num_experts", e.num_experts, int_between(1, 1 << 16));
  r.read_int("top_k", e.top_k, int_between(1, 1 << 16));
  r.read_real("capacity_factor", e.capacity_factor, real_above(0.0));
  r.read_real("eval_capacity_factor", e.eval_capacity_factor, real_above(0.0));
  r.read_int("min_capacity", e.min_capacity, int_between(0, int64_t{1} << 40));
  r.read_bool("drop_tokens", e.drop_tokens);
  r.read_real("aux_loss_coef", e.aux_loss_coef, real_at_least(0.0));
  r.read_real("router_z_loss_coef", e.router_z_loss_coef, real_at_least(0.0));
  r.read_int("moe_layer_frequency", e.moe_layer_frequency, int_between(1, 1 << 20));
  r.read_int("shared_experts", e.shared_experts, int_between(0, 1 << 10));
  r.finish();
}

namespace {
// parallelism.expert E > 1 (DeepSpeed-MoE's expert parallelism): E divides the experts. Every
// ZeRO stage: each rank stores its num_experts / E experts (TensorShard::expert_rank), which
// ZeRO partitions and reduces over their expert-data-parallel group, the rest over the
// data-parallel group. The optimizers whose work spans the data-parallel group outside ZeRO's
// two groups (Muon's and Lamb's whole matrices, the 1-bit optimizers', PowerSGD) are refused.
// That E divides the data-parallel size is checked once the world is known (resolve_job).
void validate_expert_parallelism(const JobConfig& cfg, const std::string& experts_key,
                                 Problems& p) {
  const int E = cfg.parallelism.expert, n = cfg.model.moe.num_experts;
  if (E <= 1) return;
  if (n % E != 0) {
    p.error("parallelism.expert",
            fmt::format("{} does not divide the {} experts ({}): each expert-parallel rank holds "
                        "num_experts / expert of them",
                        E, n, experts_key));
  }
  const std::string& type = cfg.optimizer.type;
  if (type == "OneBitAdam" || type == "ZeroOneAdam" || type == "OneBitLamb") {
    p.error("optimizer.type",
            fmt::format("{} does not run with parallelism.expert {} yet: each rank stores only "
                        "its experts, and {}'s step spans the data-parallel group (use Adam, "
                        "AdamW, SGD, Adagrad, Lion, Lamb or Muon, or expert 1)",
                        type, E, type));
  }
  if (!cfg.communication_compression.type.empty()) {
    p.error("communication_compression.type",
            fmt::format("\"{}\" does not run with parallelism.expert {} yet (the experts' "
                        "gradients reduce over their own group); use expert 1",
                        cfg.communication_compression.type, E));
  }
}
}  // namespace

void validate_moe(const JobConfig& cfg, Problems& p) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = m.moe;
  const ParallelismConfig& par = cfg.parallelism;
  if (e.num_experts == 0) {
    if (par.expert > 1) {
      p.error("parallelism.expert",
              fmt::format("{}: expert parallelism needs a model with experts (model.moe or "
                          "model.type \"mixtral\"); use 1",
                          par.expert));
    }
    return;
  }
  const bool mixtral = m.type == "mixtral";
  const std::string experts_key = mixtral ? "model.num_local_experts" : "model.moe.num_experts";
  const std::string top_k_key = mixtral ? "model.num_experts_per_tok" : "model.moe.top_k";
  if (e.top_k > e.num_experts) {
    p.error(top_k_key, fmt::format("{} is more than the {} experts ({})", e.top_k, e.num_experts,
                                   experts_key));
  }
  validate_expert_parallelism(cfg, experts_key, p);
  const char* layers_key = m.llama_family() ? "model.num_hidden_layers" : "model.n_layer";
  if (e.moe_layer_frequency > m.n_layer) {
    p.error("model.moe.moe_layer_frequency",
            fmt::format("{} is more than the {} layers ({}): block 0 would be the only MoE block; "
                        "use at most {}",
                        e.moe_layer_frequency, m.n_layer, layers_key, m.n_layer));
  }
  if (m.mlp_bias) {
    p.error("model.mlp_bias",
            "true is not supported with experts (Mixtral's experts have no biases)");
  }
  const std::string what = mixtral ? "type \"mixtral\"" : "a model.moe section";
  // Tensor parallelism splits every expert's width as the dense MLP's (model/layout.cc).
  // Context parallelism: each rank routes its rows, the router's statistics are summed over the
  // context group per layer (model/moe_block.h), also with expert groups and pipeline stages.
  // Capacity is a function of the whole micro-batch's order of tokens, which no rank holds.
  if (par.context > 1) {
    if (e.drop_tokens) {  // (Mixtral is dropless)
      p.error("model.moe.drop_tokens",
              fmt::format("true with parallelism.context {}: capacity and token dropping rank "
                          "the whole micro-batch's tokens, which the context ranks hold apart; "
                          "use false (dropless)",
                          par.context));
    }
  }
  // (Pipeline stages run their own MoE blocks, with expert parallelism over each stage's
  // data-parallel ranks; Mixtral's one load-balancing loss over every layer's router logits
  // passes its statistics from stage to stage: parallel/pipeline/runner.h.)
  if (cfg.train.device == TrainDevice::kCuda) {
    p.error("train.device",
            fmt::format("\"cuda\" cannot run {}: the CUDA backend has no mixture-of-experts "
                        "kernels yet (router, permutation, grouped matmul); use \"cpu\"",
                        what));
  }
}

}  // namespace zerod::config
