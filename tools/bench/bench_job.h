// Shared set-up of the training benchmarks: the benchmark shape, synthetic token shards in a
// temporary directory, and the job file that trains on them.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>

#include "engine/config/job_config.h"

namespace zerod::bench {

struct BenchShape {
  // "gpt2" (the issue's shape, tied embeddings) or "llama" (RMSNorm, RoPE, SwiGLU, grouped-query
  // attention, untied output head: the job's model section has type "llama").
  std::string model = "gpt2";
  int layers = 4, embd = 256, heads = 4, seq = 256, batch = 4, vocab = 50257;
  int kv_heads = 0, intermediate = 0;  // Llama only: num_key_value_heads, intermediate_size
  std::string dtype = "fp32";
  // > 0: every block's MLP becomes `experts` dropless experts of the model's MLP, top `top_k`
  // (the model section's "moe"; docs/moe.md).
  int experts = 0, top_k = 2;
  // Registers --layers, --embd, --heads, --seq, --batch (micro-batch per rank), --vocab, --dtype.
  void add_options(CLI::App& app);
  // Registers --model, --kv-heads, --intermediate (the benchmarks that can train a Llama),
  // --experts and --top-k.
  void add_model_options(CLI::App& app);
  // After parsing: with --model llama, the Llama bench shape's defaults for what the command line
  // left out (vocabulary 32000, 2 KV heads, intermediate 688; the rest as GPT-2's).
  void apply_model_defaults(const CLI::App& app);
};

// A temporary directory holding one shard of uniform random tokens (removed by the destructor).
class SyntheticData {
 public:
  SyntheticData(const BenchShape& shape, int64_t samples);
  ~SyntheticData();
  std::string glob() const { return (dir_ / "bench_train_*.bin").string(); }

 private:
  std::filesystem::path dir_;
};

// The benchmark job: AdamW, clipping 1.0, the shape, `steps` steps over `data`, resolved for
// `world_size` ranks with micro-batch shape.batch and accumulation 1. `zero` is the
// zero_optimization object's JSON; `extra`, top-level members spliced in after it (e.g.
// R"(, "parallelism": {"tensor": 2})").
JobConfig bench_job(const BenchShape& shape, const SyntheticData& data, int64_t steps,
                    int world_size, const std::string& zero = R"({"stage": 0})",
                    const std::string& extra = "");

// Turns the bench job's AdamW into Muon (lr 0.02, momentum 0.95, Nesterov) for the hidden
// matrices, keeping that AdamW (its lr and decay) for the other tensors.
void use_muon(JobConfig& job);

}  // namespace zerod::bench
