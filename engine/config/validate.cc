// The rules that tie keys together (each key's own type and range are checked where it is read),
// and the derived values that do not depend on the world size.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/config/sections.h"

namespace zerod::config {

namespace {

void validate_precision(const JobConfig& cfg, Problems& p) {
  if (cfg.fp16.enabled && cfg.bf16.enabled) {
    p.error("bf16.enabled",
            "true together with fp16.enabled: true; enable at most one of fp16 and bf16");
  }
  const Fp16Config& f = cfg.fp16;
  if (f.enabled && f.loss_scale == 0.0) {
    const double initial = std::ldexp(1.0, f.initial_scale_power);
    if (f.min_loss_scale > initial) {
      p.error("fp16.min_loss_scale",
              fmt::format("{} is above the initial dynamic loss scale 2^{} = {}", f.min_loss_scale,
                          f.initial_scale_power, initial));
    }
  }
}

void validate_scheduler(const JobConfig& cfg, Problems& p) {
  const SchedulerConfig& s = cfg.scheduler;
  // DeepSpeed's OneCycle cycles the betas of the optimizer; one without betas (SGD, Adagrad) has
  // cycle_momentum turned off, with a warning.
  if (s.type == SchedulerType::kOneCycle && s.cycle_momentum &&
      (cfg.optimizer.type == "SGD" || cfg.optimizer.type == "Adagrad")) {
    p.warn("scheduler.params.cycle_momentum",
           fmt::format("has no effect with {} (it has no betas; as DeepSpeed, the momentum is not "
                       "cycled)",
                       cfg.optimizer.type));
  }
  if (s.type != SchedulerType::kWarmupDecayLR && s.type != SchedulerType::kWarmupCosineLR) return;
  if (s.total_num_steps < s.warmup_num_steps) {
    // DeepSpeed warns and carries on.
    p.warn("scheduler.params.total_num_steps", fmt::format("{} is less than warmup_num_steps {}",
                                                           s.total_num_steps, s.warmup_num_steps));
  }
  // WarmupCosineLR divides by total_num_steps - max(2, warmup_num_steps).
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  if (s.type == SchedulerType::kWarmupCosineLR && s.total_num_steps == warmup) {
    p.error("scheduler.params.total_num_steps",
            fmt::format("{} must differ from the warmup length {} (warmup_num_steps, at least 2): "
                        "WarmupCosineLR divides by their difference",
                        s.total_num_steps, warmup));
  }
}

// Muon's Newton-Schulz step runs on the host, so on a GPU the optimizer states must be offloaded
// there at stages 1-3 (all of them: cpu with ratio 1, or nvme); at stage 0, where offload cannot
// be set, the trainer keeps them on the host itself (as the 1-bit optimizers'). (A
// tensor-parallel rank's slices of a matrix are orthogonalised whole over the tensor group:
// zero/muon_exchange.h.)
void validate_muon(const JobConfig& cfg, Problems& p) {
  if (cfg.optimizer.type != "Muon") return;
  const OffloadOptimizerConfig& off = cfg.zero.offload_optimizer;
  const bool all_on_host =
      off.device == OffloadDevice::kNvme || (off.device == OffloadDevice::kCpu && off.ratio >= 1.0);
  if (cfg.train.device == TrainDevice::kCuda && cfg.zero.stage > 0 && !all_on_host) {
    p.error("zero_optimization.offload_optimizer.device",
            fmt::format("optimizer Muon on train.device cuda at stage {} runs its step on the "
                        "host: set offload_optimizer device to \"cpu\" (ratio 1) or \"nvme\"",
                        cfg.zero.stage));
  }
}

void validate_zero(const JobConfig& cfg, Problems& p) {
  const ZeroConfig& z = cfg.zero;
  const OffloadParamConfig& op = z.offload_param;
  const OffloadOptimizerConfig& oo = z.offload_optimizer;
  if (op.device != OffloadDevice::kNone && z.stage != 3) {
    p.error("zero_optimization.offload_param.device",
            fmt::format("\"{}\" needs zero_optimization.stage 3 (only stage 3 partitions the "
                        "parameters), got stage {}",
                        offload_device_name(op.device), z.stage));
  }
  if (oo.device != OffloadDevice::kNone && z.stage == 0) {
    p.error("zero_optimization.offload_optimizer.device",
            fmt::format("\"{}\" needs zero_optimization.stage 1, 2 or 3, got stage 0",
                        offload_device_name(oo.device)));
  }
  if (op.device == OffloadDevice::kNvme && op.nvme_path.empty()) {
    p.error("zero_optimization.offload_param.nvme_path", "required when device is \"nvme\"");
  }
  if (oo.device == OffloadDevice::kNvme && oo.nvme_path.empty()) {
    p.error("zero_optimization.offload_optimizer.nvme_path", "required when device is \"nvme\"");
  }
  if (oo.ratio < 1.0 && oo.device == OffloadDevice::kNvme) {
    p.error("zero_optimization.offload_optimizer.ratio",
            fmt::format("{} (partial offload) applies to device \"cpu\"; with \"nvme\" every "
                        "sub-group is swapped",
                        oo.ratio));
  }
  if (oo.ratio < 1.0 && z.stage != 3) {
    // DeepSpeed: "Partial offloading only supported for ZeRO Stage 3."
    p.error("zero_optimization.offload_optimizer.ratio",
            fmt::format("{} (partial offload) needs zero_optimization.stage 3, got stage {}",
                        oo.ratio, z.stage));
  }
}

void validate_llama(const ModelConfig& m, Problems& p) {
  const int kv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  if (m.n_head > 0 && m.n_head % kv != 0) {
    p.error("model.num_attention_heads",
            fmt::format("{} is not divisible by model.num_key_value_heads {} (each key/value "
                        "head serves a whole group of query heads)",
                        m.n_head, kv));
  }
  if (m.head_dim == 0 && m.n_head > 0 && m.n_embd % m.n_head != 0) {
    p.error("model.hidden_size",
            fmt::format("{} is not divisible by model.num_attention_heads {} (give head_dim)",
                        m.n_embd, m.n_head));
  }
  const int hs = m.head_dim > 0 ? m.head_dim : (m.n_head > 0 ? m.n_embd / m.n_head : 0);
  if (hs % 2 != 0) {
    p.error(m.head_dim > 0 ? "model.head_dim" : "model.hidden_size",
            fmt::format("the head size {} is odd; rotary embeddings rotate pairs of channels", hs));
  }
  if (m.rope_type == "llama3" && !(m.rope_high_freq_factor > m.rope_low_freq_factor)) {
    p.error("model.rope_scaling.high_freq_factor",
            fmt::format("{} must be above low_freq_factor {}", m.rope_high_freq_factor,
                        m.rope_low_freq_factor));
  }
  if (!m.layer_types.empty() && m.n_layer > 0 &&
      m.layer_types.size() != static_cast<size_t>(m.n_layer)) {
    p.error("model.layer_types",
            fmt::format("{} entries for model.num_hidden_layers {} (one per layer)",
                        m.layer_types.size(), m.n_layer));
  }
  if (m.rope_type == "dynamic" || m.rope_type == "yarn") {
    if (m.rope_factor < 1.0) {
      p.error("model.rope_scaling.factor",
              fmt::format("{} must be at least 1 with rope_type \"{}\" (it stretches the "
                          "context by that factor)",
                          m.rope_factor, m.rope_type));
    }
    const bool yarn_has_length =
        m.rope_type == "yarn" && m.rope_original_max_position_embeddings > 0;
    if (m.max_position_embeddings == 0 && !yarn_has_length) {
      p.error("model.max_position_embeddings",
              fmt::format("required with rope_type \"{}\" ({})", m.rope_type,
                          m.rope_type == "dynamic"
                              ? "the length past which the rotary base grows"
                              : "the pretraining length that sets the ramp between extrapolated "
                                "and interpolated channels, unless "
                                "rope_scaling.original_max_position_embeddings gives it"));
    }
  }
}

void validate_document_masking(const JobConfig& cfg, Problems& p) {
  const DataConfig& d = cfg.data;
  const int64_t V = cfg.model.vocab_size;
  if (d.eos_token_id.has_value() && V > 0 && *d.eos_token_id >= V) {
    p.error("data.eos_token_id",
            fmt::format("{} is not a token of the model: model.vocab_size is {} (ids 0 to {})",
                        *d.eos_token_id, V, V - 1));
  }
  if (!d.document_masking) {
    if (d.eos_token_id.has_value()) {
      p.warn("data.eos_token_id",
             fmt::format("{} is unused without data.document_masking: true", *d.eos_token_id));
    }
    return;
  }
  if (!d.eos_token_id.has_value() && d.tokenizer.empty()) {
    p.error("data.eos_token_id",
            "required with data.document_masking: true (the id of the token that ends each "
            "document in the shards, e.g. zerod-shards --append-eos), unless data.tokenizer "
            "gives it");
  }
  const ModelConfig& m = cfg.model;
  if (m.rope_type == "dynamic" && m.max_position_embeddings > 0 &&
      m.seq_len > m.max_position_embeddings) {
    p.error("data.document_masking",
            fmt::format("true cannot be combined with rope_type \"dynamic\" when model.seq_len "
                        "{} is above model.max_position_embeddings {} (the frequencies then "
                        "depend on the longest document of each batch, as transformers derives "
                        "them from the largest position)",
                        m.seq_len, m.max_position_embeddings));
  }
  if (cfg.parallelism.context > 1) {
    p.error("data.document_masking",
            fmt::format("true cannot be combined with parallelism.context {} (context parallelism "
                        "splits every sequence over ranks; document masking is implemented for "
                        "whole sequences only): set parallelism.context to 1 or "
                        "data.document_masking to false",
                        cfg.parallelism.context));
  }
}

void validate_zerod_sections(const JobConfig& cfg, Problems& p) {
  const ModelConfig& m = cfg.model;
  if (!m.llama_family() && m.n_head > 0 && m.n_embd % m.n_head != 0) {
    p.error("model.n_embd",
            fmt::format("{} is not divisible by model.n_head {}", m.n_embd, m.n_head));
  }
  if (m.llama_family()) validate_llama(m, p);
  const DataConfig& d = cfg.data;
  if (!d.val.empty() && d.val_fraction > 0.0) {
    p.error("data.val_fraction",
            fmt::format("{} cannot be combined with data.val (val_fraction holds out part of "
                        "data.train when data.val is not given)",
                        d.val_fraction));
  }
  if (!d.train_weights.empty() && d.val_fraction > 0.0) {
    p.error("data.val_fraction",
            fmt::format("{} cannot be combined with a blend (data.train as weighted paths): "
                        "give the validation shards as data.val",
                        d.val_fraction));
  }
  validate_document_masking(cfg, p);
  const TrainConfig& t = cfg.train;
  if (t.save_interval > 0 && t.checkpoint_dir.empty()) {
    p.error("train.save_interval",
            fmt::format("{} needs train.checkpoint_dir (where to save)", t.save_interval));
  }
  if (t.eval_interval > 0 && d.val.empty() && d.val_fraction == 0.0) {
    p.error("train.eval_interval",
            fmt::format("{} needs validation data: data.val or data.val_fraction > 0",
                        t.eval_interval));
  }
  const ActivationCheckpointingConfig& a = cfg.activation_checkpointing;
  if (a.contiguous_memory_optimization && !a.partition_activations) {
    // DeepSpeed asserts the same.
    p.error("activation_checkpointing.contiguous_memory_optimization",
            "true needs activation_checkpointing.partition_activations: true");
  }
}

}  // namespace

void validate_job(const JobConfig& cfg, Problems& problems) {
  validate_precision(cfg, problems);
  validate_scheduler(cfg, problems);
  validate_zero(cfg, problems);
  validate_muon(cfg, problems);
  validate_zerod_sections(cfg, problems);
  validate_moe(cfg, problems);
  validate_onebit(cfg, problems);
  validate_communication_compression(cfg, problems);
}

void validate_derived(const JobConfig& cfg, Problems& problems) {
  validate_parallelism(cfg, problems);
}

int padded_vocab_size(int vocab_size, int tensor) {
  // A multiple of 128 that every tensor rank's equal slice divides: lcm(128, T). (Megatron pads
  // to 128 x T; lcm keeps the padded shape the same for T = 1, 2, 4, ... 128, so checkpoints
  // reshard across those sizes with no change of shape.)
  const int64_t t = std::max(tensor, 1);
  const int64_t align = int64_t{128} * t / std::gcd(int64_t{128}, t);
  return static_cast<int>((vocab_size + align - 1) / align * align);
}

void derive_values(JobConfig& cfg) {
  cfg.model.padded_vocab_size = padded_vocab_size(cfg.model.vocab_size, cfg.parallelism.tensor);
  // DeepSpeedZeroConfig.overlap_comm_valid: unset means true at stage 3, false otherwise.
  cfg.zero.overlap_comm_resolved = cfg.zero.overlap_comm.value_or(cfg.zero.stage == 3);
}

}  // namespace zerod::config
