// Shared by the model-level parallelism tests (tensor, sequence, context) and the document
// masking test (tests/unit/model): tiny specs, random micro-batches, weights and gradients per
// unit in host memory, the single-rank reference, and a closeness check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/param_source.h"

namespace zerod::test {

inline ModelSpec tiny_gpt2(int seq_len = 11) {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_embd = 24;
  s.vocab_size = 300;  // padded to 384: with T = 4 the last shard holds 12 real rows of 96
  s.seq_len = seq_len;
  return s;
}

inline ModelSpec tiny_llama(ModelArch arch, int seq_len = 11) {
  ModelSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_head = 8;
  s.n_kv_head = 4;
  s.n_embd = 24;
  s.head_dim = 6;
  s.intermediate_size = 36;
  s.vocab_size = 300;
  s.seq_len = seq_len;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = false;
  if (arch == ModelArch::kLlama) s.qkv_bias = s.o_bias = s.mlp_bias = true;
  if (arch == ModelArch::kMistral) s.sliding_window = 4;
  if (arch == ModelArch::kQwen2) {
    s.qkv_bias = true;
    s.tie_word_embeddings = true;
    s.sliding_window = 3;  // Qwen2's per-layer window: layer 1 only
    s.sliding_layers = {0, 1};
  }
  return s;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

inline Batch random_batch(int B, int T, int V, uint64_t seed) {
  Batch b;
  Rng rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.uniform(V)));
    b.targets.push_back(static_cast<int32_t>(rng.uniform(V)));
  }
  b.targets[3] = -1;    // a position without loss
  b.inputs[0] = V - 1;  // the last real token (the last shard)
  b.targets[1] = V - 1;
  return b;
}

// fp32 weights and gradients per unit of a layout (the CPU backend stores fp32).
class States : public ParamSource, public GradSink {
 public:
  explicit States(std::vector<std::vector<float>> w) : weights(std::move(w)) {
    for (const auto& x : weights) grads.emplace_back(x.size(), 0.0f);
  }
  const void* acquire(int u) override { return weights[static_cast<size_t>(u)].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return grads[static_cast<size_t>(u)].data(); }
  void unit_done(int) override {}
  std::vector<std::vector<float>> weights, grads;
};

// Weights with more than the init's spread (the comparison then has teeth), global layout.
inline std::vector<std::vector<float>> global_weights(const ParamLayout& layout) {
  std::vector<std::vector<float>> w;
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).numel;
    std::vector<float> x(static_cast<size_t>(n)), noise(static_cast<size_t>(n));
    layout.init_range(u, x.data(), 0, n, 7);
    fill_normal(noise.data(), n, 0.0f, 0.05f, 13, static_cast<uint64_t>(u));
    for (size_t i = 0; i < x.size(); ++i) x[i] += x[i] != 0.0f ? noise[i] : 0.0f;
    w.push_back(std::move(x));
  }
  return w;
}

struct Reference {
  float loss = 0, eval_loss = 0;
  std::vector<std::vector<float>> grads;  // global layout
};

// Forward and backward of each batch (gradients accumulated), then an evaluation of the last:
// the loss of the last batch. eos >= 0: with document masking at that EOS id.
inline Reference single_rank(const ModelSpec& s, const std::vector<Batch>& batches, int B, int T,
                             bool ckpt, int32_t eos = -1) {
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, B, T, ckpt, nullptr);
  model->set_document_masking(eos);
  States st(global_weights(model->layout()));
  Reference r;
  for (const Batch& b : batches)
    r.loss = model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
  r.eval_loss = model->forward(batches.back().inputs.data(), batches.back().targets.data(), st);
  r.grads = st.grads;
  return r;
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " is " << got[at] << ", want " << want[at];
}

}  // namespace zerod::test
