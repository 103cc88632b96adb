#include "bench_job.h"

#include <unistd.h>

#include <vector>

#include "core/rng.h"
#include "engine/config/parse.h"
#include "engine/data/shard.h"

namespace zerod::bench {

void BenchShape::add_options(CLI::App& app) {
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--embd", embd)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--batch", batch, "micro-batch per rank")->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
}

void BenchShape::add_model_options(CLI::App& app) {
  app.add_option("--model", model, "architecture of the job's model section")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "Llama: num_key_value_heads (default 2)");
  app.add_option("--intermediate", intermediate, "Llama: intermediate_size (default 688)");
  app.add_option("--experts", experts, "dropless experts per block (0: a dense MLP)")
      ->capture_default_str();
  app.add_option("--top-k", top_k, "experts per token (with --experts)")->capture_default_str();
}

void BenchShape::apply_model_defaults(const CLI::App& app) {
  if (model != "llama") return;
  if (app.count("--vocab") == 0) vocab = 32000;
  if (app.count("--kv-heads") == 0) kv_heads = 2;
  if (app.count("--intermediate") == 0) intermediate = 688;
}

SyntheticData::SyntheticData(const BenchShape& shape, int64_t samples) {
  dir_ = std::filesystem::temp_directory_path() / ("zerod_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir_);
  const int64_t ntok = samples * (shape.seq + 1) + shape.seq + 1;
  std::vector<uint16_t> tokens(static_cast<size_t>(ntok));
  Rng rng(7);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng.uniform(static_cast<uint64_t>(shape.vocab)));
  write_shard((dir_ / "bench_train_000000.bin").string(), tokens);
}

SyntheticData::~SyntheticData() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

JobConfig bench_job(const BenchShape& shape, const SyntheticData& data, int64_t steps,
                    int world_size, const std::string& zero, const std::string& extra) {
  const std::string moe =
      shape.experts > 0
          ? fmt::format(R"(, "moe": {{"num_experts": {}, "top_k": {}, "drop_tokens": false}})",
                        shape.experts, shape.top_k)
          : std::string();
  const std::string model =
      shape.model == "llama"
          ? fmt::format(
                R"({{"type": "llama", "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {}, "vocab_size": {}, "seq_len": {}{}}})",
                shape.embd, shape.intermediate, shape.layers, shape.heads,
                shape.kv_heads > 0 ? shape.kv_heads : shape.heads, shape.vocab, shape.seq, moe)
          : fmt::format(
                R"({{"n_layer": {}, "n_head": {}, "n_embd": {}, "vocab_size": {}, "seq_len": {}{}}})",
                shape.layers, shape.heads, shape.embd, shape.vocab, shape.seq, moe);
  const std::string text = fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}}},
    "gradient_clipping": 1.0, "bf16": {{"enabled": {}}}, "wall_clock_breakdown": true,
    "zero_optimization": {}{},
    "model": {},
    "data": {{"train": "{}"}},
    "train": {{"steps": {}}}}})",
                                       shape.batch, shape.dtype == "bf16" ? "true" : "false", zero,
                                       extra, model, data.glob(), steps);
  ParsedJob job = parse_job_text(text, "<bench job>");
  resolve_job(job.config, world_size);
  return job.config;
}

void use_muon(JobConfig& job) {
  job.optimizer.type = "Muon";
  job.optimizer.adam_lr = job.optimizer.lr;
  job.optimizer.lr = 0.02;
  job.optimizer.momentum = 0.95;
  job.optimizer.nesterov = true;
  job.optimizer.eps = 1e-10;
  job.optimizer.adam_weight_decay = job.optimizer.weight_decay;
}

}  // namespace zerod::bench
