// Tensor parallelism applied to the single-device models from outside: T ranks (threads of this
// process, Gloo over 127.0.0.1) each build the model for their TensorShard, take their part of
// the single-rank weights, and combine through TensorParallelExchange. The loss and every
// gradient (each rank's part, rank-0-only tensors dropped elsewhere) must equal the single-rank
// model's, for GPT-2 and the Llama family (grouped-query attention, biases, untied head, a
// vocabulary whose last shard is mostly padding), with and without activation checkpointing.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "../comm/comm_test_util.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/shard.h"
#include "parallel/tp_exchange.h"
#include "parallel/tp_grads.h"

namespace zerod {
namespace {

ModelSpec tiny_gpt2() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_embd = 24;
  s.vocab_size = 300;  // padded to 384: with T = 4 the last shard holds 12 real rows of 96
  s.seq_len = 11;
  return s;
}

ModelSpec tiny_llama(ModelArch arch) {
  ModelSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_head = 8;
  s.n_kv_head = 4;
  s.n_embd = 24;
  s.head_dim = 6;
  s.intermediate_size = 36;
  s.vocab_size = 300;
  s.seq_len = 11;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = false;
  if (arch == ModelArch::kLlama) s.qkv_bias = s.o_bias = s.mlp_bias = true;
  if (arch == ModelArch::kMistral) s.sliding_window = 4;
  if (arch == ModelArch::kQwen2) {
    s.qkv_bias = true;
    s.tie_word_embeddings = true;
  }
  return s;
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
  const void* acquire(int u) override { return weights[u].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return grads[u].data(); }
  void unit_done(int) override {}
  std::vector<std::vector<float>> weights, grads;
};

// Weights with more than the init's spread (the comparison then has teeth), global layout.
std::vector<std::vector<float>> global_weights(const ParamLayout& layout) {
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

Reference single_rank(const ModelSpec& s, const Batch& b, int B, int T, bool ckpt) {
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, B, T, ckpt, nullptr);
  States st(global_weights(model->layout()));
  Reference r;
  r.loss = model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
  r.eval_loss = model->forward(b.inputs.data(), b.targets.data(), st);
  r.grads = st.grads;
  return r;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
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

struct Case {
  ModelSpec spec;
  int tp;
  bool ckpt;
};

class TensorParallelModel : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelModel, LossAndGradientsEqualTheSingleRankModel) {
  const Case c = GetParam();
  const int B = 2, T = 9;
  const Batch b = random_batch(B, T, c.spec.vocab_size, 3);
  const Reference ref = single_rank(c.spec, b, B, T, c.ckpt);
  const ParamLayout global(c.spec);
  test::World world = test::make_world(c.tp);
  std::vector<float> losses(static_cast<size_t>(c.tp)), evals(static_cast<size_t>(c.tp));
  std::vector<std::vector<std::vector<float>>> grads(static_cast<size_t>(c.tp));
  std::vector<std::unique_ptr<ParamLayout>> layouts(static_cast<size_t>(c.tp));
  const auto gw = global_weights(global);
  test::run_ranks(c.tp, [&](int r) {
    auto be = make_cpu_backend(DType::kF32);
    auto model = make_model(c.spec, *be, B, T, c.ckpt, nullptr, TensorShard{r, c.tp});
    const ParamLayout& local = model->layout();
    std::vector<std::vector<float>> w;
    for (int u = 0; u < local.num_units(); ++u) {
      w.emplace_back(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, gw[static_cast<size_t>(u)].data(), w.back().data());
    }
    States st(std::move(w));
    TensorParallelExchange ex(*world.comms[static_cast<size_t>(r)], *be);
    TensorParallelGrads sink(local, st, *be);
    model->set_exchange(&ex);
    losses[static_cast<size_t>(r)] =
        model->forward_backward(b.inputs.data(), b.targets.data(), st, sink, 1.0f);
    evals[static_cast<size_t>(r)] = model->forward(b.inputs.data(), b.targets.data(), st);
    grads[static_cast<size_t>(r)] = st.grads;
    layouts[static_cast<size_t>(r)] =
        std::make_unique<ParamLayout>(c.spec, 16, TensorShard{r, c.tp});
  });
  for (int r = 0; r < c.tp; ++r) {
    EXPECT_NEAR(losses[static_cast<size_t>(r)], ref.loss, 1e-5 * std::fabs(ref.loss))
        << "rank " << r;
    EXPECT_NEAR(evals[static_cast<size_t>(r)], ref.eval_loss, 1e-5 * std::fabs(ref.eval_loss))
        << "rank " << r;
    const ParamLayout& local = *layouts[static_cast<size_t>(r)];
    for (int u = 0; u < local.num_units(); ++u) {
      // This rank's part of the single-rank gradient (zeros where it holds nothing).
      std::vector<float> want(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, ref.grads[static_cast<size_t>(u)].data(), want.data());
      expect_close(grads[static_cast<size_t>(r)][static_cast<size_t>(u)], want, 2e-6,
                   "rank " + std::to_string(r) + " unit " + local.unit(u).name);
    }
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(model_arch_name(info.param.spec.arch)) + "_T" + std::to_string(info.param.tp) +
         (info.param.ckpt ? "_checkpointing" : "");
}

INSTANTIATE_TEST_SUITE_P(Archs, TensorParallelModel,
                         testing::Values(Case{tiny_gpt2(), 2, false}, Case{tiny_gpt2(), 4, false},
                                         Case{tiny_gpt2(), 2, true},
                                         Case{tiny_llama(ModelArch::kLlama), 2, false},
                                         Case{tiny_llama(ModelArch::kLlama), 4, true},
                                         Case{tiny_llama(ModelArch::kMistral), 2, false},
                                         Case{tiny_llama(ModelArch::kQwen2), 4, false}),
                         case_name);

}  // namespace
}  // namespace zerod
