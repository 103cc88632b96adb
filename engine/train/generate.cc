#include "engine/train/generate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/shard_io.h"
#include "engine/checkpoint/unit_reader.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace zerod {

namespace {

namespace fs = std::filesystem;

// Whole units of compute-dtype weights in host memory: the ParamSource of a one-rank model.
class HeldWeights : public ParamSource {
 public:
  const void* acquire(int u) override { return units[static_cast<size_t>(u)].data(); }
  void release(int) override {}
  std::vector<std::vector<float>> units;
};

struct Loaded {
  ModelSpec spec;
  std::string what;
  HeldWeights weights;
};

bool is_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "latest", ec) ||
         (!fs::exists(fs::path(dir) / "config.json", ec) && fs::is_directory(dir, ec));
}

// The spec of the source and its seq_len fitted to `needed` positions: a Llama-family model's
// rotary tables are extended (positions are not weights); GPT-2 has seq_len learned positions.
void fit_context(ModelSpec& spec, int needed, int prompt) {
  if (spec.llama_family()) {
    // rope dynamic derives its frequencies from the sequence length: that of the text made
    // here (transformers re-derives them at each step past max_position_embeddings, keeping the
    // keys cached before; zerod uses the final length for all).
    spec.seq_len = spec.rope_scaling.type == RopeScaling::Type::kDynamic
                       ? needed
                       : std::max(spec.seq_len, needed);
    return;
  }
  if (needed > spec.seq_len) {
    ZD_THROW_INPUT(
        "the prompt ({} tokens) plus --max-new-tokens ({}) is {} positions, but this GPT-2 "
        "model has {} (seq_len); shorten the prompt or ask for fewer tokens",
        prompt, needed - prompt, needed, spec.seq_len);
  }
}

void load(const GenerateOptions& o, int needed, Loaded& out) {
  std::error_code ec;
  if (!fs::exists(o.from, ec)) ZD_THROW_INPUT("--from {}: no such file or directory", o.from);
  if (is_checkpoint_dir(o.from)) {
    FoundCheckpoint found = find_checkpoint(o.from, o.tag);
    const Manifest& m = found.manifest;
    if (!m.job.is_object() || !m.job.contains("model"))
      ZD_THROW_INPUT("{}/manifest.json: no job to take the model from", found.path);
    ModelSpec spec = model_spec(parse_model_config(m.job["model"], found.path + "/manifest.json"));
    const ModelSpec saved = spec;
    fit_context(spec, needed, static_cast<int>(o.prompt.size()));
    // The layout does not depend on seq_len for the Llama family, so the saved units fit.
    const ParamLayout layout(saved.llama_family() ? spec : saved);
    UnitReader reader(found.path, m, saved);  // (tensor-parallel parts put back together)
    for (int u = 0; u < layout.num_units(); ++u) {
      out.weights.units.emplace_back(static_cast<size_t>(layout.unit(u).numel));
      reader.read_global(u, out.weights.units.back().data(), nullptr, nullptr);
    }
    out.spec = spec;
    out.what = fmt::format("checkpoint {} (global step {})", found.path, m.progress.global_step);
    return;
  }
  // A Hugging Face directory (or safetensors file with a config.json beside it).
  const nlohmann::json job = {{"model", {{"init_from", o.from}}}, {"train", {{"steps", 1}}}};
  ParsedJob parsed = parse_job_text(job.dump(), o.from);
  ModelSpec spec = model_spec(parsed.config.model);
  if (!spec.llama_family()) {
    // GPT-2: as many positions as the file has rows of wpe (n_positions).
    spec.seq_len = parsed.config.model.seq_len;
  }
  fit_context(spec, needed, static_cast<int>(o.prompt.size()));
  const ParamLayout layout(spec);
  out.weights.units.resize(static_cast<size_t>(layout.num_units()));
  import_hf_model(o.from, layout, [&](int u, const float* flat) {
    out.weights.units[static_cast<size_t>(u)].assign(flat, flat + layout.unit(u).numel);
  });
  out.spec = spec;
  out.what = "Hugging Face model " + o.from;
}

}  // namespace

int32_t pick_token(const float* logits, int V, const GenerateOptions& o, double u) {
  if (o.temperature <= 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  // Descending by logit, ties by id: the same order on every machine.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = ids.size();
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  std::vector<double> p(keep);
  const double top = logits[ids[0]] / o.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp(logits[ids[i]] / o.temperature - top);
    sum += p[i];
  }
  if (o.top_p < 1.0) {
    // The fewest most likely tokens whose probability reaches top_p (at least one).
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += p[n] / sum;
      ++n;
      if (cum >= o.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  double target = u * sum, acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return ids[i];
  }
  return ids[keep - 1];
}

GenerateResult generate(const GenerateOptions& o) {
  ZD_CHECK_INPUT(!o.prompt.empty(), "the prompt is empty: give at least one token");
  ZD_CHECK_INPUT(o.max_new_tokens >= 1, "--max-new-tokens {}: must be >= 1", o.max_new_tokens);
  ZD_CHECK_INPUT(o.temperature >= 0.0, "--temperature {}: must be >= 0", o.temperature);
  ZD_CHECK_INPUT(o.top_k >= 0, "--top-k {}: must be >= 0", o.top_k);
  ZD_CHECK_INPUT(o.top_p > 0.0 && o.top_p <= 1.0, "--top-p {}: must be in (0, 1]", o.top_p);
  GenerateResult r;
  Stopwatch sw;
  const int P = static_cast<int>(o.prompt.size());
  const int needed = P + o.max_new_tokens;
  Loaded loaded;
  load(o, needed, loaded);
  const ModelSpec& spec = loaded.spec;
  for (size_t i = 0; i < o.prompt.size(); ++i) {
    if (o.prompt[i] < 0 || o.prompt[i] >= spec.vocab_size) {
      ZD_THROW_INPUT("prompt token {} (position {}) is outside the vocabulary [0, {})", o.prompt[i],
                     i, spec.vocab_size);
    }
  }
  auto backend = make_cpu_backend(DType::kF32);
  auto model = make_model(spec, *backend, 1, P, false, nullptr);
  model->start_generation(needed);
  r.model = loaded.what;
  r.load_seconds = sw.seconds();

  const int Vp = spec.vp();
  std::vector<float> logits(static_cast<size_t>(Vp));
  Rng rng(o.seed, 0x67656e);
  sw.restart();
  model->generate_step(o.prompt.data(), P, 0, loaded.weights, logits.data());
  r.prefill_seconds = sw.seconds();
  sw.restart();
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const int32_t next = pick_token(logits.data(), spec.vocab_size, o, rng.uniform01());
    r.tokens.push_back(next);
    if (o.eos_token && next == *o.eos_token) break;
    if (i + 1 == o.max_new_tokens) break;
    model->generate_step(&next, 1, P + i, loaded.weights, logits.data());
  }
  r.decode_seconds = sw.seconds();
  return r;
}

}  // namespace zerod
