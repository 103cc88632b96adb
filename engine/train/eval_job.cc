#include "engine/train/eval_job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "engine/config/parse.h"
#include "engine/train/generate.h"
#include "engine/train/trainer.h"

namespace zerod {

namespace fs = std::filesystem;

EvalResult evaluate_job(JobConfig cfg, const EvalOptions& o) {
  if (cfg.data.val.empty() && cfg.data.val_fraction == 0.0) {
    ZD_THROW_INPUT("{}: zerod eval needs validation data: data.val or data.val_fraction > 0",
                   cfg.source);
  }
  EvalResult r;
  std::error_code ec;
  bool resume = false;
  if (!o.from.empty()) {
    if (!fs::is_directory(o.from, ec)) ZD_THROW_INPUT("--from {}: not a directory", o.from);
    if (fs::exists(fs::path(o.from) / "config.json", ec)) {
      cfg.model.init_from = o.from;  // a Hugging Face directory
      r.source = "Hugging Face model " + o.from;
    } else {
      cfg.train.checkpoint_dir = o.from;
      resume = true;
      r.source = "checkpoint dir " + o.from;
    }
    r.weights_dir = o.from;
  } else if (!cfg.train.checkpoint_dir.empty() &&
             fs::exists(fs::path(cfg.train.checkpoint_dir) / "latest", ec)) {
    resume = true;
    r.source = "checkpoint dir " + cfg.train.checkpoint_dir;
    r.weights_dir = cfg.train.checkpoint_dir;
  } else {
    if (cfg.model.init_from && fs::is_directory(*cfg.model.init_from, ec))
      r.weights_dir = *cfg.model.init_from;
    r.source = cfg.model.init_from ? "Hugging Face weights " + *cfg.model.init_from
                                   : "the seeded initialisation (no checkpoint, no init_from)";
  }
  cfg.train.save_interval = 0;
  // One process evaluates: an elastic job's world sizes need not include 1, and only the
  // micro-batch matters here (the largest of its sizes).
  if (cfg.elasticity.enabled) {
    cfg.elasticity.enabled = false;
    cfg.train_batch_size.reset();
    cfg.gradient_accumulation_steps.reset();
    cfg.train_micro_batch_size_per_gpu = *std::max_element(cfg.elasticity.micro_batch_sizes.begin(),
                                                           cfg.elasticity.micro_batch_sizes.end());
  }
  resolve_job(cfg, 1);
  const int64_t per_batch = int64_t{cfg.micro_batch()} * cfg.model.seq_len;
  cfg.train.eval_batches =
      o.tokens > 0 ? std::max<int64_t>(1, (o.tokens + per_batch - 1) / per_batch) : INT32_MAX;
  TrainerOptions opts;
  opts.log_steps = false;
  Trainer trainer(cfg, opts);
  if (resume) trainer.resume("latest");
  const std::optional<double> loss = trainer.evaluate();
  if (!loss) ZD_THROW_INPUT("{}: the validation data gives no micro-batch", cfg.source);
  r.loss = *loss;
  r.perplexity = std::exp(*loss);
  r.tokens = trainer.evaluated_tokens();
  if (o.sample_tokens > 0 && o.sample_prompt > 0 && !r.weights_dir.empty() &&
      cfg.model.seq_len >= 2) {
    // The first validation sample, from the trainer's validation set (opened once).
    const int64_t T = cfg.model.seq_len;
    std::vector<int32_t> inputs(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
    trainer.validation_data()->read_sample(0, inputs.data(), targets.data());
    // Prompt and continuation within seq_len (GPT-2 has no positions beyond it).
    const int64_t prompt = std::min<int64_t>(o.sample_prompt, std::max<int64_t>(1, T / 2));
    GenerateOptions g;
    g.from = r.weights_dir;
    g.prompt.assign(inputs.begin(), inputs.begin() + prompt);
    g.max_new_tokens = static_cast<int>(std::min<int64_t>(o.sample_tokens, T - prompt));
    EvalSample sample;
    sample.prompt = g.prompt;
    sample.generated = generate(g).tokens;
    r.sample = std::move(sample);
  }
  return r;
}

}  // namespace zerod
