// Shared set-up of the training benchmarks: the benchmark shape, synthetic token shards in a
// temporary directory, and the job file that trains on them.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>

#include "engine/config/job_config.h"

namespace zerod::bench {

struct BenchShape {
  int layers = 4, embd = 256, heads = 4, seq = 256, batch = 4, vocab = 50257;
  std::string dtype = "fp32";
  // Registers --layers, --embd, --heads, --seq, --batch (micro-batch per rank), --vocab, --dtype.
  void add_options(CLI::App& app);
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
// zero_optimization object's JSON.
JobConfig bench_job(const BenchShape& shape, const SyntheticData& data, int64_t steps,
                    int world_size, const std::string& zero = R"({"stage": 0})");

}  // namespace zerod::bench
