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
                    int world_size, const std::string& zero) {
  const std::string text =
      fmt::format(R"({{
    "train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
    "optimizer": {{"type": "AdamW", "params": {{"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}}},
    "gradient_clipping": 1.0, "bf16": {{"enabled": {}}}, "wall_clock_breakdown": true,
    "zero_optimization": {},
    "model": {{"n_layer": {}, "n_head": {}, "n_embd": {}, "vocab_size": {}, "seq_len": {}}},
    "data": {{"train": "{}"}},
    "train": {{"steps": {}}}}})",
                  shape.batch, shape.dtype == "bf16" ? "true" : "false", zero, shape.layers,
                  shape.heads, shape.embd, shape.vocab, shape.seq, data.glob(), steps);
  ParsedJob job = parse_job_text(text, "<bench job>");
  resolve_job(job.config, world_size);
  return job.config;
}

}  // namespace zerod::bench
