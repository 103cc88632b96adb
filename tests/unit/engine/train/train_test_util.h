// Shared by the multi-rank training tests: a small byte corpus in a temporary directory, a
// job file around it, and running a world of ranks as threads over Gloo on 127.0.0.1.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>
#include <vector>

#include "comm/store.h"
#include "core/log.h"
#include "core/rng.h"
#include "engine/config/config_error.h"
#include "engine/config/parse.h"
#include "engine/data/corpus.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/trainer.h"

namespace zerod::testing {

// A directory with byte-level shards "p_train_*.bin" / "p_val_*.bin" of random words.
class TempCorpus {
 public:
  explicit TempCorpus(const std::string& name) {
    dir_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    const char* words[] = {"alpha ", "beta ", "gamma ", "delta ",
                           "shard ", "rank ", "zero ",  "step "};
    Rng rng(2);
    std::string text;
    while (text.size() < 50000) text += words[rng.uniform(8)];
    write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()}, dir_.string(),
                      0.1, 1 << 20, "p");
  }
  ~TempCorpus() { std::filesystem::remove_all(dir_); }
  const std::filesystem::path& dir() const { return dir_; }
  std::string train_glob() const { return (dir_ / "p_train_*.bin").string(); }

 private:
  std::filesystem::path dir_;
};

// The "model" section of a tiny test job. Tests that hold for every architecture run over
// several of these (value-parametrized: `name` is the test-name suffix, [A-Za-z0-9]).
struct TinyModel {
  const char* name;
  std::string json;  // the "model" object
};
inline void PrintTo(const TinyModel& m, std::ostream* os) {
  *os << m.name;
}

// GPT-2: 2 layers, 2 heads, 32 wide, byte vocabulary.
inline TinyModel tiny_gpt2() {
  return {"Gpt2", R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 24})"};
}
// Llama with grouped-query attention (4 query heads on 2 key/value heads), an output head of its
// own (untied) and a vocabulary that pads (123 -> 128 columns; the corpus' largest byte is 'z',
// 122), in Hugging Face's key names.
inline TinyModel tiny_llama() {
  return {"Llama", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "vocab_size": 123, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": false, "seq_len": 16})"};
}
// The same with the output head tied to the embedding.
inline TinyModel tiny_llama_tied() {
  return {"LlamaTied", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                           "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "vocab_size": 123,
                           "tie_word_embeddings": true, "seq_len": 16})"};
}
// Mistral: a sliding window (6) shorter than the sequence (16), so it masks something.
inline TinyModel tiny_mistral() {
  return {"Mistral", R"({"type": "mistral", "hidden_size": 32, "intermediate_size": 48,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 123, "sliding_window": 6,
                         "rope_theta": 500.0, "seq_len": 16})"};
}

// Shapes that split 4 ways under tensor parallelism (heads, key/value heads, MLP width, padded
// vocabulary).
inline TinyModel tiny_gpt2_split4() {
  return {"Gpt2", R"({"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256, "seq_len": 24})"};
}
// Four layers (pipelines of up to four stages), otherwise tiny_gpt2_split4 / tiny_llama_split4.
inline TinyModel tiny_gpt2_4layers() {
  return {"Gpt2", R"({"n_layer": 4, "n_head": 4, "n_embd": 32, "vocab_size": 256, "seq_len": 24})"};
}
inline TinyModel tiny_llama_4layers() {
  return {"Llama", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 4, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "vocab_size": 123, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": false, "seq_len": 16})"};
}
// GPT-2 (32 wide, 2 heads, seq 24) of `layers` blocks with the model.moe section `moe`.
inline TinyModel tiny_moe_gpt2(const std::string& moe, int layers = 2) {
  return {"Gpt2", R"({"n_layer": )" + std::to_string(layers) +
                      R"(, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 24, "moe": )" +
                      moe + "}"};
}
inline TinyModel tiny_llama_split4() {
  return {"Llama", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 2, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "vocab_size": 123, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": false, "seq_len": 16})"};
}

// The optimizer of tiny_job unless told.
inline constexpr const char* kTinyAdamW =
    R"({"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}})";

// DeepSpeed's Lamb with weight decay on, at an lr it learns the tiny models with in a few steps.
// min_coeff is below its default 0.01: the tiny models' matrices (weights of about 0.02, update
// directions of about 1 per element) have ratios near 0.02, which the default would clamp,
// hiding the norms (a wrong norm sum over the ranks would go unnoticed).
inline constexpr const char* kTinyLamb =
    R"({"type": "Lamb", "params": {"lr": 0.1, "weight_decay": 0.01, "min_coeff": 0.001}})";

// One job of each other optimizer, with weight decay on, that learns the tiny models in a few
// steps: {name, optimizer section}.
inline std::vector<std::pair<std::string, std::string>> other_optimizers() {
  return {
      {"SGD nesterov",
       R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true,
           "weight_decay": 0.01}})"},
      {"SGD dampening",
       R"({"type": "SGD", "params": {"lr": 0.2, "momentum": 0.8, "dampening": 0.5,
           "weight_decay": 0.01}})"},
      {"Adagrad",
       R"({"type": "Adagrad", "params": {"lr": 0.03, "lr_decay": 0.01,
           "initial_accumulator_value": 0.1, "weight_decay": 0.01}})"},
      {"Lion", R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})"},
      {"Muon", R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
           "weight_decay": 0.01}})"},
  };
}

// A tiny job over the corpus (GPT-2 unless `model` says otherwise); `extra` (top-level members),
// `train_extra` (members of "train") and `zero_extra` (members of "zero_optimization") are
// spliced into the JSON; `optimizer` is its "optimizer" section.
inline JobConfig tiny_job(const TempCorpus& corpus, int world, int stage, int accum, int steps,
                          const std::string& extra = "", const std::string& train_extra = "",
                          int global_batch = 8, const std::string& zero_extra = "",
                          const TinyModel& model = tiny_gpt2(),
                          const std::string& optimizer = kTinyAdamW) {
  const std::string text = R"({
    "train_batch_size": )" +
                           std::to_string(global_batch) + R"(,
    "gradient_accumulation_steps": )" +
                           std::to_string(accum) + R"(,
    "optimizer": )" + optimizer +
                           R"(,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": )" +
                           std::to_string(stage) + zero_extra + R"(},
    "model": )" + model.json +
                           R"(,
    "data": {"train": ")" + corpus.train_glob() +
                           R"(", "seed": 9},
    "train": {"steps": )" + std::to_string(steps) +
                           R"(, "seed": 4, "peak_flops": 1e11,
              "collective_timeout": 60)" +
                           train_extra + R"(}
    )" + extra + "}";
  ParsedJob job = parse_job_text(text, "test job");
  resolve_job(job.config, world);
  return job.config;
}

// The problems a job's configuration check finds while `parse` runs (one per line), "" when it
// raises none.
inline std::string config_problems(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ConfigError& e) {
    std::string all;
    for (const std::string& p : e.problems()) all += p + "\n";
    return all;
  }
  return std::string();
}

// Runs `body` on `world` ranks (threads, Gloo on 127.0.0.1).
inline void run_world(int world, const std::function<void(const RankContext&)>& body) {
  LocalRanksOptions o;
  o.world_size = world;
  o.local_world_size = world;
  o.store = std::make_shared<MemoryStore>();
  o.timeout = std::chrono::seconds(60);
  o.threads_per_rank = 1;
  run_local_ranks(o, body);
}

// For the duration of a test, the default logger writes only to a string, at info level.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    log::init();  // (idempotent: the default logger that every rank's thread logs to)
    auto& logger = *spdlog::default_logger();
    level_ = logger.level();
    saved_ = logger.sinks();
    logger.sinks() = {sink_};
    logger.set_level(spdlog::level::info);
  }
  ~CapturedLog() {
    auto& logger = *spdlog::default_logger();
    logger.sinks() = saved_;
    logger.set_level(level_);
  }
  std::string text() {
    spdlog::default_logger()->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum level_;
};

inline TrainerOptions quiet_trainer() {
  TrainerOptions o;
  o.log_steps = false;
  return o;
}

// Rank 0's losses of `cfg` trained on `world` ranks (resumed from `resume` when not empty).
inline std::vector<double> rank0_losses(const JobConfig& cfg, int world,
                                        const std::string& resume = "") {
  std::vector<double> out;
  run_world(world, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, quiet_trainer());
    if (!resume.empty()) t.resume(resume);
    const TrainResult res = t.run();
    if (ctx.rank == 0)
      for (const StepMetrics& s : res.steps) out.push_back(s.loss);
  });
  return out;
}

// Rank 0's losses and gradient norms per step, and every rank's last loss; rank 0's tensor
// group size and the elements of its model unit 1 (the first block: a tensor slice of it under
// tensor parallelism).
struct RunOutcome {
  std::vector<double> losses, norms;
  std::vector<double> rank_last_loss;
  int tensor_size = 0;
  int64_t block_elems = 0;
  // Rank 0's model states after the run, and the elements of its experts units.
  ModelStateBytes states;
  int64_t experts_elems = 0;
};

// Trains `cfg` on `world` ranks (threads), resumed from `resume` first when given.
inline RunOutcome train_outcome(const JobConfig& cfg, int world, const std::string& resume = "") {
  RunOutcome out;
  out.rank_last_loss.resize(static_cast<size_t>(world));
  std::mutex mu;
  run_world(world, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, quiet_trainer());
    if (!resume.empty()) t.resume(resume);
    const TrainResult res = t.run();
    std::lock_guard<std::mutex> lock(mu);
    out.rank_last_loss[static_cast<size_t>(ctx.rank)] = res.steps.back().loss;
    if (ctx.rank == 0) {
      for (const auto& s : res.steps) {
        out.losses.push_back(s.loss);
        out.norms.push_back(s.grad_norm);
      }
      out.tensor_size = t.groups().tensor().size();
      const ParamLayout& layout = t.model().layout();
      out.block_elems = layout.unit(layout.block_unit(0)).numel;
      if (const int e = layout.experts_unit(0); e >= 0) out.block_elems += layout.unit(e).numel;
      out.states = t.engine().measured_bytes();
      for (int u = 0; u < t.engine().layout().num_units(); ++u)
        if (t.engine().layout().unit(u).experts)
          out.experts_elems += t.engine().layout().unit(u).numel;
    }
  });
  return out;
}

// a's losses and norms within `rel` (relative) of ref's, step by step; prints the worst loss
// difference.
inline void expect_outcome_close(const RunOutcome& a, const RunOutcome& ref, double rel,
                                 const std::string& what) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], ref.losses[i], rel * std::abs(ref.losses[i])) << what << " step " << i;
    EXPECT_NEAR(a.norms[i], ref.norms[i], rel * std::abs(ref.norms[i])) << what << " norm " << i;
    worst = std::max(worst, std::abs(a.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
  }
  std::printf("%s: worst relative loss difference %.3g over %zu steps\n", what.c_str(), worst,
              a.losses.size());
}

}  // namespace zerod::testing
