// The "parallelism" section and DeepSpeed's aliases for it (tensor_parallel.autotp_size,
// sequence_parallel_size), and the rules that tie it to the model: tensor parallelism splits
// heads (GQA: key/value head groups) and the MLP width, Ulysses context parallelism splits
// heads (per tensor rank), context parallelism splits each sequence in 2C chunks, and the
// vocabulary is padded to a multiple of 128 x tensor as Megatron does. Pipeline parallelism
// splits the layers into pipeline x virtual_stages stages (parallel/pipeline/partition.h) run in
// a schedule's order (parallel/pipeline/schedule.h).
#include <fmt/format.h>

#include "engine/config/sections.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"

namespace zerod::config {

namespace {

// "pipeline", "pipeline_schedule", "virtual_stages" and "pipeline_partition": "uniform",
// "parameters" or a list of layer counts.
void read_pipeline(ObjectReader& r, ParallelismConfig& p) {
  r.read_int("pipeline", p.pipeline, int_between(1, 1 << 16));
  size_t idx = 0;
  if (r.read_choice("pipeline_schedule", idx, pipeline::schedule_names(), false))
    p.pipeline_schedule = pipeline::schedule_names()[idx];
  r.read_int("virtual_stages", p.virtual_stages, int_between(1, 1 << 10));
  const Json* part = r.find("pipeline_partition");
  if (part == nullptr || !part->is_array()) {
    const std::vector<std::string> methods = {"uniform", "parameters"};
    if (r.read_choice("pipeline_partition", idx, methods, false))
      p.pipeline_partition = methods[idx];
    return;
  }
  std::vector<int> counts;
  for (size_t i = 0; i < part->size(); ++i) {
    int64_t n = 0;
    if (!r.value_to_int((*part)[i], fmt::format("{}[{}]", r.path_of("pipeline_partition"), i), n,
                        int_between(1, 1 << 20)))
      return;
    counts.push_back(static_cast<int>(n));
  }
  p.pipeline_partition = "explicit";
  p.pipeline_layers = std::move(counts);
}

// The pipeline's rules against the model: P x V stages of at least one layer each, V dividing
// the layers and only with interleaved_1f1b, an explicit list of P x V counts summing to them.
void validate_pipeline(const JobConfig& cfg, Problems& p) {
  const ParallelismConfig& par = cfg.parallelism;
  const int layers = cfg.model.n_layer, P = par.pipeline, V = par.virtual_stages;
  const char* layers_key = cfg.model.llama_family() ? "model.num_hidden_layers" : "model.n_layer";
  if (V > 1 && par.pipeline_schedule != "interleaved_1f1b") {
    p.error("parallelism.virtual_stages",
            fmt::format("{} virtual stages need \"pipeline_schedule\": \"interleaved_1f1b\" (the "
                        "schedule is \"{}\")",
                        V, par.pipeline_schedule));
  }
  if (V > 1 && layers % V != 0) {
    p.error("parallelism.virtual_stages",
            fmt::format("{} does not divide the {} layers ({})", V, layers, layers_key));
  }
  const pipeline::PartitionMethod method = par.pipeline_partition == "explicit"
                                               ? pipeline::PartitionMethod::kExplicit
                                               : pipeline::PartitionMethod::kUniform;
  const std::string why = pipeline::partition_problem(layers, P * V, method, par.pipeline_layers);
  if (!why.empty()) {
    p.error(method == pipeline::PartitionMethod::kExplicit ? "parallelism.pipeline_partition"
                                                           : "parallelism.pipeline",
            fmt::format("{} ({} = {}; pipeline {} x virtual_stages {})", why, layers_key, layers, P,
                        V));
  }
}

}  // namespace

std::string model_ranks_text(const ParallelismConfig& p) {
  return fmt::format("{}parallelism.tensor {} x parallelism.context {}",
                     p.pipeline > 1 ? fmt::format("parallelism.pipeline {} x ", p.pipeline) : "",
                     p.tensor, p.context);
}

void read_parallelism(ObjectReader& top, JobConfig& cfg) {
  ParallelismConfig& p = cfg.parallelism;
  Problems& problems = top.problems();
  if (const Json* obj = top.read_object("parallelism")) {
    ObjectReader r(*obj, "parallelism", problems);
    r.read_int("tensor", p.tensor, int_between(1, 1 << 16));
    r.read_bool("sequence_parallel", p.sequence_parallel);
    r.read_int("context", p.context, int_between(1, 1 << 16));
    size_t idx = 0;
    const std::vector<std::string> impls = {"ulysses", "ring"};
    if (r.read_choice("context_impl", idx, impls, false)) p.context_impl = impls[idx];
    r.read_int("expert", p.expert, int_between(1, 1 << 16));
    read_pipeline(r, p);
    r.finish();
  }
  const bool has_tensor = top.has("parallelism") && top.find("parallelism")->is_object() &&
                          top.find("parallelism")->contains("tensor");
  const bool has_context = top.has("parallelism") && top.find("parallelism")->is_object() &&
                           top.find("parallelism")->contains("context");
  // DeepSpeed: "tensor_parallel": {"autotp_size": T}.
  if (const Json* tp = top.read_object("tensor_parallel")) {
    ObjectReader r(*tp, "tensor_parallel", problems);
    int autotp = 0;
    if (r.read_int("autotp_size", autotp, int_between(1, 1 << 16))) {
      if (has_tensor && autotp != p.tensor) {
        problems.error("tensor_parallel.autotp_size",
                       fmt::format("{} conflicts with parallelism.tensor {}", autotp, p.tensor));
      } else {
        p.tensor = autotp;
      }
    }
    r.finish();
  }
  // DeepSpeed: "sequence_parallel_size": C (Ulysses).
  int sp = 0;
  if (top.read_int("sequence_parallel_size", sp, int_between(1, 1 << 16))) {
    if (has_context && sp != p.context) {
      problems.error("sequence_parallel_size",
                     fmt::format("{} conflicts with parallelism.context {}", sp, p.context));
    } else {
      p.context = sp;
      p.context_impl = "ulysses";
    }
  }
}

void validate_parallelism(const JobConfig& cfg, Problems& p) {
  validate_pipeline(cfg, p);
  const ParallelismConfig& par = cfg.parallelism;
  const ModelConfig& m = cfg.model;
  const int T = par.tensor, C = par.context;
  const int heads = m.n_head;
  const int kv = m.llama_family() && m.n_kv_head > 0 ? m.n_kv_head : heads;
  const int ffn = m.llama_family() ? m.intermediate_size : 4 * m.n_embd;
  const char* heads_key = m.llama_family() ? "model.num_attention_heads" : "model.n_head";
  if (T > 1) {
    if (heads % T != 0) {
      p.error("parallelism.tensor",
              fmt::format("{} does not divide the {} attention heads ({})", T, heads, heads_key));
    }
    if (m.llama_family() && kv != heads && kv % T != 0) {
      p.error("parallelism.tensor",
              fmt::format("{} does not divide the {} key/value heads "
                          "(model.num_key_value_heads; each rank holds whole KV head groups)",
                          T, kv));
    }
    if (ffn > 0 && ffn % T != 0) {
      p.error("parallelism.tensor",
              fmt::format("{} does not divide the MLP width {} ({})", T, ffn,
                          m.llama_family() ? "model.intermediate_size" : "4 x model.n_embd"));
    }
    if (cfg.model.padded_vocab_size != (m.vocab_size + 127) / 128 * 128) {
      p.warn("model.vocab_size",
             fmt::format("{} padded to {} rows (a multiple of 128 and of parallelism.tensor {}), "
                         "so every tensor rank holds an equal slice",
                         m.vocab_size, cfg.model.padded_vocab_size, T));
    }
  } else if (par.sequence_parallel) {
    p.warn("parallelism.sequence_parallel", "true has no effect with parallelism.tensor 1");
  }
  if (C > 1 && par.context_impl == "ulysses") {
    if (heads % C != 0 || kv % C != 0) {
      p.error("parallelism.context",
              fmt::format("{} (ulysses) does not divide the {} attention heads{}; Ulysses moves "
                          "whole heads between ranks (use \"context_impl\": \"ring\")",
                          C, heads, kv != heads ? fmt::format(" and {} key/value heads", kv) : ""));
    }
    if (T > 1 && (heads / std::max(T, 1)) % C != 0) {
      p.error(
          "parallelism.context",
          fmt::format("{} (ulysses) does not divide the {} heads per tensor rank", C, heads / T));
    } else if (T > 1 && kv != heads && kv % T == 0 && (kv / T) % C != 0) {
      p.error("parallelism.context",
              fmt::format("{} (ulysses) does not divide the {} key/value heads per tensor rank "
                          "(use \"context_impl\": \"ring\")",
                          C, kv / T));
    }
  }
  // The load-balanced causal split: each sequence in 2C equal chunks, rank r holding r and
  // 2C-1-r.
  if (C > 1 && m.seq_len > 0 && m.seq_len % (2 * C) != 0) {
    p.error("parallelism.context",
            fmt::format("{}: a sequence of {} positions (model.seq_len) does not split into 2 x "
                        "{} = {} equal chunks (each context rank holds chunks r and {}-r); {} is "
                        "not a multiple of {}",
                        C, m.seq_len, C, 2 * C, 2 * C - 1, m.seq_len, 2 * C));
  }
}

}  // namespace zerod::config
