// Tensor parallelism applied to the single-device models from outside: T ranks (threads of this
// process, Gloo over 127.0.0.1) each build the model for their TensorShard, take their part of
// the single-rank weights, and combine through TensorParallelExchange. The loss and every
// gradient (each rank's part, rank-0-only tensors dropped elsewhere) must equal the single-rank
// model's, for GPT-2 and the Llama family (grouped-query attention, biases, untied head, a
// vocabulary whose last shard is mostly padding), with and without activation checkpointing,
// without and with Megatron's sequence parallelism (the sequence split into blocks that cross
// sequence boundaries; gradients accumulated over two micro-batches as ZeRO stages 0-1 do). The
// activations of a sequence-parallel rank are what model_activation_bytes says, and smaller.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../comm/comm_test_util.h"
#include "model/model.h"
#include "model/shard.h"
#include "model_test_util.h"
#include "parallel/tp_exchange.h"
#include "parallel/tp_grads.h"

namespace zerod {
namespace {

using test::Batch;
using test::expect_close;
using test::global_weights;
using test::random_batch;
using test::Reference;
using test::single_rank;
using test::States;
using test::tiny_gpt2;
using test::tiny_llama;

struct Case {
  ModelSpec spec;
  int tp;
  bool ckpt;
  bool sp = false;  // sequence parallelism
  int B = 2, T = 9;
  int micro_batches = 1;
  int32_t eos = -1;  // >= 0: document masking, EOS tokens put into the batches
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << model_arch_name(c.spec.arch) << " T=" << c.tp << (c.sp ? " sequence-parallel" : "")
      << (c.ckpt ? " checkpointing" : "") << " micro-batch " << c.B << "x" << c.T << " times "
      << c.micro_batches << (c.eos >= 0 ? " document masking" : "");
}

class TensorParallelModel : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelModel, LossAndGradientsEqualTheSingleRankModel) {
  const Case c = GetParam();
  const int B = c.B, T = c.T;
  std::vector<Batch> batches;
  for (int m = 0; m < c.micro_batches; ++m) {
    batches.push_back(random_batch(B, T, c.spec.vocab_size, 3 + static_cast<uint64_t>(m)));
    if (c.eos < 0) continue;
    // Documents of 1 to 4 positions, split differently in each row.
    std::vector<int32_t>& in = batches.back().inputs;
    for (size_t i = 0; i < in.size(); ++i)
      if (i % 4 == static_cast<size_t>(m) || i % 7 == 5) in[i] = c.eos;
  }
  const Reference ref = single_rank(c.spec, batches, B, T, c.ckpt, c.eos);
  const ParamLayout global(c.spec);
  test::World world = test::make_world(c.tp);
  std::vector<float> losses(static_cast<size_t>(c.tp)), evals(static_cast<size_t>(c.tp));
  std::vector<std::vector<std::vector<float>>> grads(static_cast<size_t>(c.tp));
  std::vector<std::unique_ptr<ParamLayout>> layouts(static_cast<size_t>(c.tp));
  const auto gw = global_weights(global);
  test::run_ranks(c.tp, [&](int r) {
    auto be = make_cpu_backend(DType::kF32);
    auto model = make_model(c.spec, *be, B, T, c.ckpt, nullptr, TensorShard{r, c.tp, c.sp});
    const ParamLayout& local = model->layout();
    std::vector<std::vector<float>> w;
    for (int u = 0; u < local.num_units(); ++u) {
      w.emplace_back(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, gw[static_cast<size_t>(u)].data(), w.back().data());
    }
    States st(std::move(w));
    Communicator& comm = *world.comms[static_cast<size_t>(r)];
    TensorParallelExchange ex(comm, *be, c.sp);
    TensorParallelGrads sink(local, st, *be, &comm);
    model->set_exchange(&ex);
    model->set_document_masking(c.eos);
    for (const Batch& b : batches) {
      losses[static_cast<size_t>(r)] =
          model->forward_backward(b.inputs.data(), b.targets.data(), st, sink, 1.0f);
    }
    const Batch& last = batches.back();
    evals[static_cast<size_t>(r)] = model->forward(last.inputs.data(), last.targets.data(), st);
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
  const Case& c = info.param;
  return std::string(model_arch_name(c.spec.arch)) + "_T" + std::to_string(c.tp) +
         (c.sp ? "_sequence" : "") + (c.ckpt ? "_checkpointing" : "") +
         (c.micro_batches > 1 ? "_accumulated" : "") + (c.eos >= 0 ? "_documents" : "");
}

INSTANTIATE_TEST_SUITE_P(Archs, TensorParallelModel,
                         testing::Values(Case{tiny_gpt2(), 2, false}, Case{tiny_gpt2(), 4, false},
                                         Case{tiny_gpt2(), 2, true},
                                         Case{tiny_llama(ModelArch::kLlama), 2, false},
                                         Case{tiny_llama(ModelArch::kLlama), 4, true},
                                         Case{tiny_llama(ModelArch::kMistral), 2, false},
                                         Case{tiny_llama(ModelArch::kQwen2), 4, false}),
                         case_name);

// Sequence parallelism: N = B x T rows split into T blocks that cross sequence boundaries (30
// rows of sequences of 10 in blocks of 15; 20 rows in blocks of 5).
Case sp(ModelSpec spec, int tp, bool ckpt, int micro_batches = 1) {
  Case c{std::move(spec), tp, ckpt, true, tp == 2 ? 3 : 2, 10};
  c.micro_batches = micro_batches;
  return c;
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelModel,
                         testing::Values(sp(tiny_gpt2(), 2, false), sp(tiny_gpt2(), 4, false),
                                         sp(tiny_gpt2(), 2, true), sp(tiny_gpt2(), 4, true),
                                         sp(tiny_gpt2(), 2, false, 2),
                                         sp(tiny_llama(ModelArch::kLlama), 2, false),
                                         sp(tiny_llama(ModelArch::kLlama), 4, true),
                                         sp(tiny_llama(ModelArch::kLlama), 4, false, 2),
                                         sp(tiny_llama(ModelArch::kMistral), 2, true),
                                         sp(tiny_llama(ModelArch::kQwen2), 4, false),
                                         sp(tiny_llama(ModelArch::kQwen2), 2, true)),
                         case_name);

// Document masking (attention inside documents, positions restarting) works the same on each
// tensor rank: every rank computes the document starts from the whole micro-batch's tokens.
Case docs(Case c) {
  c.eos = 7;
  return c;
}

INSTANTIATE_TEST_SUITE_P(DocumentMasking, TensorParallelModel,
                         testing::Values(docs(Case{tiny_gpt2(), 2, false}),
                                         docs(Case{tiny_llama(ModelArch::kMistral), 2, false}),
                                         docs(sp(tiny_gpt2(), 2, false, 2)),
                                         docs(sp(tiny_llama(ModelArch::kLlama), 2, true))),
                         case_name);

// The activation bytes a model allocates (its MemoryTracker) are model_activation_bytes', on one
// rank, tensor-parallel, and sequence-parallel; sequence parallelism divides the norm and
// residual regions by T (at least the residual stream's L + 1 buffers of B*T x C shrink to
// B*T/T x C), so its ranks hold less.
TEST(SequenceParallelModel, ActivationsAreSmallerAndAsPredicted) {
  const int B = 2, T = 10;
  for (const ModelSpec& s :
       {tiny_gpt2(), tiny_llama(ModelArch::kLlama), tiny_llama(ModelArch::kQwen2)}) {
    for (bool ckpt : {false, true}) {
      auto be = make_cpu_backend(DType::kF32);
      auto measured = [&](TensorShard shard) {
        MemoryTracker tracker;
        auto model = make_model(s, *be, B, T, ckpt, &tracker, shard);
        return tracker.current(MemCategory::kActivations);
      };
      const std::string what =
          std::string(model_arch_name(s.arch)) + (ckpt ? " checkpointing" : "");
      EXPECT_EQ(measured({}), model_activation_bytes(s, B, T, ckpt, 4)) << what;
      for (int tp : {2, 4}) {
        const std::string at = what + ", T=" + std::to_string(tp);
        const int64_t plain = measured({0, tp, false}), seq = measured({tp - 1, tp, true});
        EXPECT_EQ(plain, model_activation_bytes(s, B, T, ckpt, 4, tp)) << at;
        EXPECT_EQ(seq, model_activation_bytes(s, B, T, ckpt, 4, tp, true)) << at;
        const int64_t residual_saved = int64_t{s.n_layer + 1} * (B * T - B * T / tp) * s.n_embd * 4;
        EXPECT_LE(seq, plain - residual_saved) << at << ": " << seq << " vs " << plain;
      }
    }
  }
}

// Sequence parallelism needs B x T to split T ways: an InputError naming the numbers.
TEST(SequenceParallelModel, RefusesPositionsThatDoNotSplit) {
  auto be = make_cpu_backend(DType::kF32);
  try {
    make_model(tiny_gpt2(), *be, 3, 10, false, nullptr, TensorShard{0, 4, true});
    ADD_FAILURE() << "3 x 10 positions accepted for 4 sequence-parallel ranks";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("30 is not a multiple of 4"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(make_model(tiny_gpt2(), *be, 3, 10, false, nullptr, TensorShard{0, 4, false}));
  EXPECT_NO_THROW(make_model(tiny_gpt2(), *be, 2, 10, false, nullptr, TensorShard{0, 4, true}));
}

// The model and its exchange must agree on sequence parallelism.
TEST(SequenceParallelModel, RefusesAnExchangeThatDisagrees) {
  auto be = make_cpu_backend(DType::kF32);
  test::World world = test::make_world(1);
  auto model = make_model(tiny_gpt2(), *be, 2, 10, false, nullptr, TensorShard{0, 2, true});
  TensorParallelExchange plain(*world.comms[0], *be, false), seq(*world.comms[0], *be, true);
  EXPECT_THROW(model->set_exchange(&plain), Error);
  EXPECT_NO_THROW(model->set_exchange(&seq));
}

}  // namespace
}  // namespace zerod
