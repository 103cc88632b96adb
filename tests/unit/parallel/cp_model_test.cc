// Context parallelism applied to the single-device models from outside: C ranks (threads of this
// process, Gloo over 127.0.0.1) each build the model for their ContextShard (the load-balanced
// causal split: chunks r and 2C-1-r of every sequence), get the whole micro-batch, keep their
// positions, and attend over whole sequences through ContextParallelExchange: Ulysses'
// all-to-all of heads or ring attention. The loss (every rank's: the mean over all positions)
// and every gradient (summed over the context group, each rank's being its positions' part) must
// equal the single-rank model's, for GPT-2 (learned positions at the rows' global positions) and
// the Llama family (rotary angles of the global positions, grouped-query attention, Mistral's
// sliding window shorter than a chunk), with and without activation checkpointing, over two
// accumulated micro-batches, for C = 2, 3 and 4, and on T = 2 x C = 2 meshes (with and without
// Megatron's sequence parallelism inside the tensor group). Bad shapes are refused, naming the
// numbers, and the activations are what model_activation_bytes says.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "../comm/mesh_test_util.h"
#include "model/model.h"
#include "model/shard.h"
#include "model_test_util.h"
#include "parallel/cp_exchange.h"
#include "parallel/tp_exchange.h"
#include "parallel/tp_grads.h"

namespace zerod {
namespace {

using test::Batch;
using test::expect_close;
using test::global_weights;
using test::random_batch;
using test::Reference;
using test::run_mesh;
using test::single_rank;
using test::States;

ModelSpec gpt2() {
  return test::tiny_gpt2(24);
}
ModelSpec llama(ModelArch arch) {
  return test::tiny_llama(arch, 24);
}

struct Case {
  ModelSpec spec;
  int cp;
  ContextImpl impl;
  int tp = 1;
  bool sp = false;  // Megatron's sequence parallelism inside the tensor group
  bool ckpt = false;
  int micro_batches = 1;
  int B = 2, T = 24;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << model_arch_name(c.spec.arch) << " C=" << c.cp << " " << context_impl_name(c.impl)
      << " T=" << c.tp << (c.sp ? " sequence-parallel" : "") << (c.ckpt ? " checkpointing" : "")
      << " micro-batch " << c.B << "x" << c.T << " times " << c.micro_batches;
}

class ContextParallelModel : public testing::TestWithParam<Case> {};

TEST_P(ContextParallelModel, LossAndGradientsEqualTheSingleRankModel) {
  const Case c = GetParam();
  std::vector<Batch> batches;
  for (int m = 0; m < c.micro_batches; ++m)
    batches.push_back(random_batch(c.B, c.T, c.spec.vocab_size, 3 + static_cast<uint64_t>(m)));
  const Reference ref = single_rank(c.spec, batches, c.B, c.T, c.ckpt);
  const ParamLayout global(c.spec);
  const auto gw = global_weights(global);
  const MeshShape shape{.context = c.cp, .tensor = c.tp};
  const size_t n = static_cast<size_t>(shape.world());
  std::vector<float> losses(n), evals(n);
  std::vector<std::vector<std::vector<float>>> grads(n);
  std::vector<int> tensor_rank(n);
  run_mesh(shape, [&](int r, const ProcessGroups& groups) {
    const ProcessGroup& tensor = groups.tensor();
    const ProcessGroup& context = groups.context();
    ASSERT_EQ(context.size(), c.cp);
    auto be = make_cpu_backend(DType::kF32);
    auto model =
        make_model(c.spec, *be, c.B, c.T, c.ckpt, nullptr, TensorShard{tensor.rank(), c.tp, c.sp},
                   ContextShard{context.rank(), c.cp});
    EXPECT_EQ(model->seq(), c.T);
    const ParamLayout& local = model->layout();
    std::vector<std::vector<float>> w;
    for (int u = 0; u < local.num_units(); ++u) {
      w.emplace_back(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, gw[static_cast<size_t>(u)].data(), w.back().data());
    }
    States st(std::move(w));
    std::unique_ptr<TensorParallelExchange> tpx;
    std::unique_ptr<TensorParallelGrads> tpg;
    GradSink* sink = &st;
    if (c.tp > 1) {
      tpx = std::make_unique<TensorParallelExchange>(tensor.comm(), *be, c.sp);
      tpg = std::make_unique<TensorParallelGrads>(local, st, *be, &tensor.comm());
      sink = tpg.get();
    }
    ContextParallelExchange cpx(context.comm(), *be, c.impl, tpx.get());
    model->set_exchange(&cpx);
    const size_t i = static_cast<size_t>(r);
    for (const Batch& b : batches)
      losses[i] = model->forward_backward(b.inputs.data(), b.targets.data(), st, *sink, 1.0f);
    const Batch& last = batches.back();
    evals[i] = model->forward(last.inputs.data(), last.targets.data(), st);
    grads[i] = st.grads;
    tensor_rank[i] = tensor.rank();
  });
  for (size_t r = 0; r < n; ++r) {
    EXPECT_NEAR(losses[r], ref.loss, 1e-5 * std::fabs(ref.loss)) << "rank " << r;
    EXPECT_NEAR(evals[r], ref.eval_loss, 1e-5 * std::fabs(ref.eval_loss)) << "rank " << r;
  }
  // Each tensor rank's part of the gradient: the sum of its context ranks' partial gradients.
  for (int t = 0; t < c.tp; ++t) {
    const ParamLayout local(c.spec, 16, TensorShard{t, c.tp});
    for (int u = 0; u < local.num_units(); ++u) {
      const size_t un = static_cast<size_t>(local.unit(u).numel);
      std::vector<float> want(un), got(un, 0.0f);
      shard_unit(global, local, u, ref.grads[static_cast<size_t>(u)].data(), want.data());
      for (size_t r = 0; r < n; ++r) {
        if (tensor_rank[r] != t) continue;
        const std::vector<float>& g = grads[r][static_cast<size_t>(u)];
        for (size_t k = 0; k < un; ++k) got[k] += g[k];
      }
      expect_close(got, want, 3e-6,
                   "tensor rank " + std::to_string(t) + " unit " + local.unit(u).name);
    }
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(model_arch_name(c.spec.arch)) + "_C" + std::to_string(c.cp) + "_" +
         context_impl_name(c.impl) + (c.tp > 1 ? "_T" + std::to_string(c.tp) : "") +
         (c.sp ? "_sequence" : "") + (c.ckpt ? "_checkpointing" : "") +
         (c.micro_batches > 1 ? "_accumulated" : "");
}

constexpr ContextImpl kUlysses = ContextImpl::kUlysses;
constexpr ContextImpl kRing = ContextImpl::kRing;

INSTANTIATE_TEST_SUITE_P(
    Ulysses, ContextParallelModel,
    testing::Values(Case{gpt2(), 2, kUlysses}, Case{gpt2(), 4, kUlysses, 1, false, true},
                    Case{gpt2(), 2, kUlysses, 1, false, false, 2},
                    Case{llama(ModelArch::kLlama), 2, kUlysses},
                    Case{llama(ModelArch::kLlama), 4, kUlysses, 1, false, true},
                    Case{llama(ModelArch::kMistral), 2, kUlysses},
                    Case{llama(ModelArch::kQwen2), 2, kUlysses, 1, false, false, 2}),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Ring, ContextParallelModel,
    testing::Values(Case{gpt2(), 2, kRing}, Case{gpt2(), 3, kRing}, Case{gpt2(), 4, kRing},
                    Case{gpt2(), 2, kRing, 1, false, true, 2},
                    Case{llama(ModelArch::kLlama), 2, kRing},
                    Case{llama(ModelArch::kLlama), 3, kRing, 1, false, true},
                    Case{llama(ModelArch::kLlama), 4, kRing, 1, false, false, 2},
                    Case{llama(ModelArch::kMistral), 2, kRing},
                    Case{llama(ModelArch::kMistral), 4, kRing, 1, false, true},
                    Case{llama(ModelArch::kQwen2), 3, kRing}),
    case_name);

// T = 2 x C = 2: tensor fastest (ranks 0, 1 one tensor group), Ulysses splitting each tensor
// rank's heads, ring passing its key/value heads; also with sequence parallelism, whose B x T/C
// rows split over the tensor group.
INSTANTIATE_TEST_SUITE_P(
    TensorTimesContext, ContextParallelModel,
    testing::Values(Case{gpt2(), 2, kUlysses, 2}, Case{gpt2(), 2, kRing, 2, false, true},
                    Case{gpt2(), 2, kRing, 2, true}, Case{llama(ModelArch::kLlama), 2, kUlysses, 2},
                    Case{llama(ModelArch::kLlama), 2, kRing, 2, true, false, 2},
                    Case{llama(ModelArch::kMistral), 2, kRing, 2},
                    Case{llama(ModelArch::kQwen2), 2, kUlysses, 2, true, true}),
    case_name);

// The split itself: rank r holds chunks r and 2C-1-r; together the ranks hold every position
// once.
TEST(ContextPositions, TheLoadBalancedCausalSplit) {
  EXPECT_EQ(context_positions(8, {0, 2}), (std::vector<int32_t>{0, 1, 6, 7}));
  EXPECT_EQ(context_positions(8, {1, 2}), (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(context_positions(6, {0, 1}), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  std::vector<int> seen(24, 0);
  for (int r = 0; r < 3; ++r)
    for (int32_t p : context_positions(24, {r, 3})) ++seen[static_cast<size_t>(p)];
  EXPECT_EQ(seen, std::vector<int>(24, 1));
  EXPECT_EQ(context_parallel_problem(24, 4), "");
  EXPECT_NE(context_parallel_problem(20, 3).find("20 is not a multiple of 6"), std::string::npos);
}

// A sequence that does not split into 2C chunks: an InputError naming the numbers.
TEST(ContextParallelModelInput, RefusesSequencesThatDoNotSplit) {
  auto be = make_cpu_backend(DType::kF32);
  try {
    make_model(gpt2(), *be, 2, 20, false, nullptr, {}, ContextShard{0, 3});
    ADD_FAILURE() << "sequences of 20 accepted for 3 context ranks";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("20 is not a multiple of 6"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(make_model(gpt2(), *be, 2, 24, false, nullptr, {}, ContextShard{2, 3}));
}

// Ulysses moves whole heads: C must divide the query and key/value heads of a tensor rank. Every
// rank refuses before any collective (an InputError naming the numbers); ring takes the same
// shape.
TEST(ContextParallelModelInput, UlyssesRefusesHeadsThatDoNotSplit) {
  struct Bad {
    ModelSpec spec;
    int cp;
    const char* says;
  };
  ModelSpec two_kv = llama(ModelArch::kLlama);
  two_kv.n_kv_head = 2;
  for (const Bad& bad : {Bad{gpt2(), 3, "3 does not divide the 4 attention heads"},
                         Bad{two_kv, 4,
                             "4 does not divide the 8 attention heads and 2 key/value "
                             "heads"}}) {
    const Batch b = random_batch(2, 24, bad.spec.vocab_size, 5);
    for (ContextImpl impl : {kUlysses, kRing}) {
      std::mutex mu;
      std::vector<std::string> errors;
      run_mesh(MeshShape{.context = bad.cp}, [&](int, const ProcessGroups& groups) {
        auto be = make_cpu_backend(DType::kF32);
        auto model = make_model(bad.spec, *be, 2, 24, false, nullptr, {},
                                ContextShard{groups.context().rank(), bad.cp});
        States st(global_weights(model->layout()));
        ContextParallelExchange cpx(groups.context().comm(), *be, impl);
        model->set_exchange(&cpx);
        try {
          model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
        } catch (const InputError& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back(e.what());
        }
      });
      if (impl == kRing) {
        EXPECT_TRUE(errors.empty()) << errors.front();
        continue;
      }
      ASSERT_EQ(errors.size(), static_cast<size_t>(bad.cp));
      for (const std::string& e : errors) EXPECT_TRUE(test::contains(e, bad.says)) << e;
    }
  }
}

// A context-parallel model needs an exchange over a context group of its size.
TEST(ContextParallelModelInput, RefusesAMissingOrMismatchedExchange) {
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(gpt2(), *be, 2, 24, false, nullptr, {}, ContextShard{0, 2});
  States st(global_weights(model->layout()));
  const Batch b = random_batch(2, 24, gpt2().vocab_size, 5);
  EXPECT_THROW(model->forward(b.inputs.data(), b.targets.data(), st), Error);
  test::World world = test::make_world(1);
  ContextParallelExchange one(*world.comms[0], *be, kRing);
  EXPECT_THROW(model->set_exchange(&one), Error);
  EXPECT_THROW(model->start_generation(8), InputError);
}

// The activation bytes a context-parallel model allocates are model_activation_bytes' for its
// T/C rows (and the rotary rows of its positions), less than one rank's.
TEST(ContextParallelModelInput, ActivationsAreAsPredicted) {
  const int B = 2, T = 24;
  for (const ModelSpec& s : {gpt2(), llama(ModelArch::kLlama)}) {
    for (int cp : {2, 4}) {
      auto be = make_cpu_backend(DType::kF32);
      MemoryTracker tracker, one;
      auto model = make_model(s, *be, B, T, false, &tracker, {}, ContextShard{cp - 1, cp});
      auto single = make_model(s, *be, B, T, false, &one);
      const int64_t got = tracker.current(MemCategory::kActivations);
      EXPECT_EQ(got, model_activation_bytes(s, B, T, false, 4, 1, false, cp))
          << model_arch_name(s.arch) << " C=" << cp;
      EXPECT_LT(got, one.current(MemCategory::kActivations));
    }
  }
}

}  // namespace
}  // namespace zerod
