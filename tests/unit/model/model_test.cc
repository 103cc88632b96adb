// Whole-model checks on tiny models of every architecture (GPT-2 and the Llama family):
// gradients against finite differences of the loss, determinism, activation checkpointing and
// reduced-precision emulation.
#include "model/gpt.h"
#include "model/llama.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"

namespace zerod {
namespace {

ModelSpec tiny_spec() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 3;
  s.n_embd = 18;      // head size 6: nothing is a multiple of 8
  s.vocab_size = 37;  // padded to 128
  s.seq_len = 11;
  return s;
}

// Llama-family variants of the tiny shape: grouped-query attention, untied or tied head,
// biases, a sliding window shorter than the sequence, rope scaling, head_dim != C / NH.
ModelSpec tiny_llama(ModelArch arch) {
  ModelSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.n_embd = 20;
  s.head_dim = 6;
  s.intermediate_size = 26;
  s.vocab_size = 37;
  s.seq_len = 11;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = false;
  if (arch == ModelArch::kLlama) {
    s.qkv_bias = s.o_bias = s.mlp_bias = true;
    s.rope_scaling.type = RopeScaling::Type::kLlama3;
    s.rope_scaling.factor = 4;
    s.rope_scaling.original_max_position_embeddings = 4;
  }
  if (arch == ModelArch::kMistral) s.sliding_window = 4;
  if (arch == ModelArch::kQwen2) {
    s.qkv_bias = true;
    s.tie_word_embeddings = true;
    s.n_kv_head = 1;
  }
  return s;
}

std::string arch_name(const testing::TestParamInfo<ModelSpec>& info) {
  return model_arch_name(info.param.arch);
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch random_batch(int B, int T, int V, uint64_t seed) {
  Batch b;
  Rng rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.uniform(V)));
    b.targets.push_back(static_cast<int32_t>(rng.uniform(V)));
  }
  b.targets[3] = -1;  // a position without loss
  return b;
}

// Weights and gradients per unit in plain vectors: the simplest ParamSource and GradSink.
class SimpleStates : public ParamSource, public GradSink {
 public:
  SimpleStates(const ParamLayout& layout, Backend& backend, uint64_t seed) {
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t n = layout.unit(u).numel;
      std::vector<float> master(n);
      layout.init_range(u, master.data(), 0, n, seed);
      weights.emplace_back(n);
      backend.cast_to_compute(weights.back().data(), master.data(), n);
      grads.emplace_back(n, 0.0f);
    }
  }
  const void* acquire(int u) override { return weights[u].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return grads[u].data(); }
  void unit_done(int) override {}
  void zero_grad() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
  }
  std::vector<std::vector<float>> weights, grads;
};

struct TinyModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<SimpleStates> states;
  TinyModel(const ModelSpec& s, int B, int T, bool ckpt, DType dtype = DType::kF32,
            uint64_t seed = 5) {
    backend = make_cpu_backend(dtype);
    model = make_model(s, *backend, B, T, ckpt, nullptr);
    states = std::make_unique<SimpleStates>(model->layout(), *backend, seed);
  }
  float train(const Batch& b, float weight = 1.0f) {
    return model->forward_backward(b.inputs.data(), b.targets.data(), *states, *states, weight);
  }
  float eval(const Batch& b) { return model->forward(b.inputs.data(), b.targets.data(), *states); }
  const std::vector<float>& grads(int u) const { return states->grads[u]; }
};

class ModelTest : public testing::TestWithParam<ModelSpec> {};

INSTANTIATE_TEST_SUITE_P(Archs, ModelTest,
                         testing::Values(tiny_spec(), tiny_llama(ModelArch::kLlama),
                                         tiny_llama(ModelArch::kMistral),
                                         tiny_llama(ModelArch::kQwen2)),
                         arch_name);

TEST_P(ModelTest, GradientsMatchFiniteDifferencesOfTheLoss) {
  const ModelSpec s = GetParam();
  const int B = 2, T = 9;
  TinyModel st(s, B, T, false);
  // Larger weights than the init make the loss surface less flat, so the check has teeth.
  for (int u = 0; u < st.model->layout().num_units(); ++u) {
    std::vector<float>& w = st.states->weights[u];
    std::vector<float> noise(w.size());
    fill_normal(noise.data(), static_cast<int64_t>(noise.size()), 0, 0.1f, 11, u);
    for (size_t i = 0; i < noise.size(); ++i) w[i] += noise[i];
  }
  const Batch b = random_batch(B, T, s.vocab_size, 3);
  const float loss = st.train(b);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(st.eval(b), loss, 1e-6);

  // Per unit: the directional derivative along a random direction d (unit norm over the
  // unit's real tensors) against a central difference of the loss. fp32 loss noise is ~1e-7
  // relative; with eps 1e-2 along a unit vector that is ~1e-4 absolute on the derivative.
  for (int u = 0; u < st.model->layout().num_units(); ++u) {
    const UnitLayout& unit = st.model->layout().unit(u);
    std::vector<float> d(unit.numel, 0.0f);
    for (const TensorInfo& t : unit.tensors) {
      const int64_t real = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      fill_normal(d.data() + t.offset, real, 0, 1, 21, u * 100 + (&t - unit.tensors.data()));
    }
    double norm = 0;
    for (float x : d) norm += double{x} * x;
    norm = std::sqrt(norm);
    const std::vector<float> g = st.grads(u);
    double analytic = 0;
    for (int64_t i = 0; i < unit.numel; ++i) analytic += double{g[i]} * d[i] / norm;
    float* w = st.states->weights[u].data();
    const std::vector<float> saved(w, w + unit.numel);
    const double eps = 1e-2;
    auto loss_at = [&](double sign) {
      for (int64_t i = 0; i < unit.numel; ++i)
        w[i] = static_cast<float>(saved[i] + sign * eps * d[i] / norm);
      return double{st.eval(b)};
    };
    const double numeric = (loss_at(+1) - loss_at(-1)) / (2 * eps);
    std::copy(saved.begin(), saved.end(), w);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << unit.name;
    EXPECT_GT(std::abs(analytic), 1e-3) << unit.name << ": a vanishing gradient proves nothing";
  }
}

TEST_P(ModelTest, LossWeightScalesGradientsAndAccumulates) {
  const ModelSpec s = GetParam();
  TinyModel st(s, 2, 8, false);
  const Batch b = random_batch(2, 8, s.vocab_size, 4);
  st.train(b, 1.0f);
  const std::vector<float> g1 = st.grads(1);
  st.train(b, 2.0f);
  const std::vector<float> g3 = st.grads(1);  // g1 + 2 g1
  for (size_t i = 0; i < g1.size(); ++i)
    ASSERT_NEAR(g3[i], 3 * g1[i], 1e-5f + 1e-4f * std::abs(g1[i]));
}

TEST_P(ModelTest, ActivationCheckpointingGivesBitIdenticalGradients) {
  const ModelSpec s = GetParam();
  TinyModel plain(s, 3, 11, false), ckpt(s, 3, 11, true);
  const Batch b = random_batch(3, 11, s.vocab_size, 5);
  const float l1 = plain.train(b);
  const float l2 = ckpt.train(b);
  EXPECT_EQ(l1, l2);
  for (int u = 0; u < plain.model->layout().num_units(); ++u)
    EXPECT_EQ(plain.grads(u), ckpt.grads(u)) << u;
}

TEST_P(ModelTest, RepeatedRunsAreBitIdentical) {
  const ModelSpec s = GetParam();
  const Batch b = random_batch(2, 11, s.vocab_size, 6);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    TinyModel st(s, 2, 11, false);
    std::vector<float> losses;
    for (int step = 1; step <= 3; ++step) {
      st.states->zero_grad();
      losses.push_back(st.train(b));
      for (size_t u = 0; u < st.states->weights.size(); ++u)  // plain SGD
        for (size_t i = 0; i < st.states->weights[u].size(); ++i)
          st.states->weights[u][i] -= 0.5f * st.states->grads[u][i];
    }
    EXPECT_LT(losses.back(), losses.front());
    if (run == 0)
      first = losses;
    else
      EXPECT_EQ(first, losses);
  }
}

// Generation with the KV cache: a prefill of some positions, then one position at a time, gives
// the logits forward() computes over the whole sequence at each last position.
TEST_P(ModelTest, GenerationWithTheKvCacheEqualsTheFullForward) {
  const ModelSpec s = GetParam();
  const int T = s.seq_len, Vp = s.vp();
  TinyModel full(s, 1, T, false);
  const Batch b = random_batch(1, T, s.vocab_size, 9);
  full.eval(b);
  std::vector<float> want(static_cast<size_t>(T) * Vp);
  full.model->read_logits(want.data());

  TinyModel gen(s, 1, 4, false);  // same seed: same weights
  gen.model->start_generation(T);
  std::vector<float> last(static_cast<size_t>(Vp));
  auto check = [&](int pos) {
    for (int v = 0; v < s.vocab_size; ++v)
      ASSERT_NEAR(last[v], want[static_cast<size_t>(pos) * Vp + v],
                  1e-5f * (1.0f + std::abs(want[static_cast<size_t>(pos) * Vp + v])))
          << "position " << pos << " token " << v;
  };
  gen.model->generate_step(b.inputs.data(), 4, 0, *gen.states, last.data());  // prefill 0..3
  check(3);
  for (int pos = 4; pos < T; ++pos) {
    gen.model->generate_step(b.inputs.data() + pos, 1, pos, *gen.states, last.data());
    check(pos);
  }
  // Positions past the cache are refused.
  EXPECT_THROW(gen.model->generate_step(b.inputs.data(), 1, T, *gen.states, last.data()), Error);
}

TEST_P(ModelTest, Bf16EmulationRoundsWeightsAndActivationsAndStaysClose) {
  const ModelSpec s = GetParam();
  TinyModel f32(s, 2, 11, false, DType::kF32), bf16(s, 2, 11, false, DType::kBF16);
  const Batch b = random_batch(2, 11, s.vocab_size, 7);
  // Compute weights are the fp32 init rounded to bf16.
  const std::vector<float>& w = bf16.states->weights[1];
  const std::vector<float>& m = f32.states->weights[1];
  bool any_changed = false;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(w[i], round_bf16(m[i]));
    any_changed |= w[i] != m[i];
  }
  EXPECT_TRUE(any_changed);
  const float l32 = f32.train(b);
  const float l16 = bf16.train(b);
  EXPECT_NE(l32, l16);                // the emulation does change the numbers
  EXPECT_NEAR(l16, l32, 2e-2 * l32);  // bf16 has ~3 significant digits
  const std::vector<float> g = bf16.grads(1);
  for (float x : g) ASSERT_EQ(x, round_bf16(x));  // gradients are stored as bf16 values
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

// A ParamSource/GradSink that sleeps in every call, like a ZeRO engine waiting on a gather.
class SlowStates : public SimpleStates {
 public:
  using SimpleStates::SimpleStates;
  const void* acquire(int u) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return SimpleStates::acquire(u);
  }
};

TEST(Gpt, TimingSplitsForwardBackwardAndTimeInsideTheSeams) {
  const ModelSpec s = tiny_spec();
  auto backend = make_cpu_backend(DType::kF32);
  Gpt model(s, *backend, 2, 11, false, nullptr);
  SlowStates states(model.layout(), *backend, 5);
  const Batch b = random_batch(2, 11, s.vocab_size, 8);
  model.set_timing(true);
  Stopwatch sw;
  model.forward_backward(b.inputs.data(), b.targets.data(), states, states, 1.0f);
  const double wall = sw.seconds();
  const OpTimes& t = model.times();
  EXPECT_GT(t.forward, 0);
  EXPECT_GT(t.backward, 0);
  // acquire is called for the embedding (twice), every block (twice) and the final norm.
  const int acquires = 2 + 2 * s.n_layer + 1;
  EXPECT_GE(t.zero_wait, acquires * 0.002);
  EXPECT_LE(t.forward + t.backward + t.zero_wait, wall + 1e-6);
  EXPECT_GE(t.forward + t.backward + t.zero_wait, 0.9 * wall);
}

// Summing the times of several models (an interleaved pipeline rank's chunks) adds every field.
TEST(OpTimes, SumAddsEveryField) {
  OpTimes a, b;
  double* fa = &a.encoder;  // (the struct is doubles only)
  double* fb = &b.encoder;
  const size_t n = sizeof(OpTimes) / sizeof(double);
  for (size_t i = 0; i < n; ++i) {
    fa[i] = static_cast<double>(i + 1);
    fb[i] = 100.0 * static_cast<double>(i + 1);
  }
  a += b;
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(fa[i], 101.0 * static_cast<double>(i + 1)) << "field " << i;
}

}  // namespace
}  // namespace zerod
