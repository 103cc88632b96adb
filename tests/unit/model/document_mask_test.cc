// Document masking of packed sequences (model/document_mask.h, Model::set_document_masking): the
// document starts of a micro-batch, and the acceptance check on tiny models of every
// architecture: each document of a packed sequence gets the logits, and contributes the
// gradients, that it gets run alone as a sequence of its own (positions from 0).
#include "model/document_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../parallel/model_test_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"

namespace zerod {
namespace {

TEST(DocumentStarts, NewDocumentAfterEachEos) {
  const int32_t E = 9;
  // Row 0: EOS at 2 and 3 (a one-token document [3,4)), last token EOS (no effect inside the
  // row); row 1: no EOS; row 2: EOS first.
  const std::vector<int32_t> in = {1, 2, E, E, 4, 5, E,  //
                                   1, 1, 1, 1, 1, 1, 1,  //
                                   E, 3, 3, E, 3, 3, 3};
  std::vector<int32_t> ds(in.size(), -1);
  document_starts(in.data(), 3, 7, E, ds.data());
  const std::vector<int32_t> want = {0, 0, 0, 3, 4, 4, 4,  //
                                     0, 0, 0, 0, 0, 0, 0,  //
                                     0, 1, 1, 1, 4, 4, 4};
  EXPECT_EQ(ds, want);
  // An EOS id that never occurs: one document per row.
  document_starts(in.data(), 3, 7, 12345, ds.data());
  EXPECT_EQ(ds, std::vector<int32_t>(in.size(), 0));
}

// The parallelism tests' tiny models (GPT-2; the Llama family with grouped-query attention,
// Mistral with a window of 4, shorter than some documents below) at 12 positions.
ModelSpec tiny(ModelArch arch) {
  return arch == ModelArch::kGpt2 ? test::tiny_gpt2(12) : test::tiny_llama(arch, 12);
}

using test::global_weights;
using test::States;

// max |got - want| / max |want|.
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double{got[i]} - want[i]));
    den = std::max(den, std::fabs(double{want[i]}));
  }
  return den > 0 ? err / den : err;
}

constexpr int32_t kEos = 299;  // the last token of the vocabulary (300)

// Two rows of 12 positions packing documents (each ending with EOS, the last of a row cut off
// by the window): row 0 [0,4) [4,9) [9,12), row 1 [0,7) [7,12).
struct Packed {
  int B = 2, T = 12;
  std::vector<std::vector<int>> lengths = {{4, 5, 3}, {7, 5}};
  std::vector<int32_t> inputs, targets;
};

Packed packed_batch() {
  Packed p;
  Rng rng(41);
  for (const auto& row : p.lengths) {
    for (size_t d = 0; d < row.size(); ++d) {
      for (int i = 0; i < row[d]; ++i) {
        const bool eos = i == row[d] - 1 && d + 1 < row.size();
        p.inputs.push_back(eos ? kEos : static_cast<int32_t>(rng.uniform(kEos)));
        p.targets.push_back(static_cast<int32_t>(rng.uniform(kEos + 1)));
      }
    }
  }
  return p;
}

class DocumentMasking : public testing::TestWithParam<ModelArch> {};

TEST_P(DocumentMasking, EachDocumentAsIfAlone) {
  const ModelSpec s = tiny(GetParam());
  const Packed p = packed_batch();
  const int N = p.B * p.T;
  auto be = make_cpu_backend(DType::kF32);
  auto packed = make_model(s, *be, p.B, p.T, false, nullptr);
  const int Vp = packed->layout().local().vocab_rows;
  States st(global_weights(packed->layout()));

  // Without masking the later documents see the earlier ones (the check below has teeth).
  std::vector<float> unmasked(static_cast<size_t>(N) * Vp);
  packed->forward(p.inputs.data(), p.targets.data(), st);
  packed->read_logits(unmasked.data());

  packed->set_document_masking(kEos);
  const float eval_loss = packed->forward(p.inputs.data(), p.targets.data(), st);
  std::vector<float> logits(static_cast<size_t>(N) * Vp);
  packed->read_logits(logits.data());
  // loss_weight 1: each position's loss weighs 1/N in the packed mean.
  const float loss = packed->forward_backward(p.inputs.data(), p.targets.data(), st, st, 1.0f);
  EXPECT_NEAR(loss, eval_loss, 1e-6);

  // Each document alone (B = 1, T = its length, no masking, the same weights). Its mean loss
  // weighs len/N in the packed mean, so loss_weight len/N gives its positions the packed
  // gradient weight 1/N; summed over the documents that is the packed gradient.
  States alone(global_weights(packed->layout()));
  double loss_sum = 0.0;
  bool differs = false;
  for (int b = 0; b < p.B; ++b) {
    int t0 = 0;
    for (int len : p.lengths[static_cast<size_t>(b)]) {
      SCOPED_TRACE("row " + std::to_string(b) + " document at " + std::to_string(t0));
      const size_t at = static_cast<size_t>(b) * p.T + t0;
      const std::vector<int32_t> in(p.inputs.begin() + at, p.inputs.begin() + at + len);
      const std::vector<int32_t> tg(p.targets.begin() + at, p.targets.begin() + at + len);
      auto one = make_model(s, *be, 1, len, false, nullptr);
      one->forward(in.data(), tg.data(), alone);
      std::vector<float> want(static_cast<size_t>(len) * Vp);
      one->read_logits(want.data());
      const std::vector<float> got(logits.begin() + at * Vp, logits.begin() + (at + len) * Vp);
      EXPECT_LT(rel_err(got, want), 1e-5);
      const std::vector<float> plain(unmasked.begin() + at * Vp,
                                     unmasked.begin() + (at + len) * Vp);
      differs = differs || rel_err(plain, want) > 1e-3;
      const float w = static_cast<float>(len) / static_cast<float>(N);
      loss_sum += w * one->forward_backward(in.data(), tg.data(), alone, alone, w);
      t0 += len;
    }
  }
  EXPECT_TRUE(differs) << "masking made no difference: the test proves nothing";
  EXPECT_NEAR(loss, loss_sum, 1e-5 * std::fabs(loss_sum));
  for (int u = 0; u < packed->layout().num_units(); ++u) {
    const auto& got = st.grads[static_cast<size_t>(u)];
    const auto& want = alone.grads[static_cast<size_t>(u)];
    EXPECT_LT(rel_err(got, want), 1e-5) << packed->layout().unit(u).name;
    double mx = 0;
    for (float g : want) mx = std::max(mx, std::fabs(double{g}));
    EXPECT_GT(mx, 1e-4) << packed->layout().unit(u).name << ": a vanishing gradient proves nothing";
  }
}

TEST_P(DocumentMasking, ActivationCheckpointingGivesTheSameGradients) {
  const ModelSpec s = tiny(GetParam());
  const Packed p = packed_batch();
  auto be = make_cpu_backend(DType::kF32);
  auto plain = make_model(s, *be, p.B, p.T, false, nullptr);
  auto ckpt = make_model(s, *be, p.B, p.T, true, nullptr);
  plain->set_document_masking(kEos);
  ckpt->set_document_masking(kEos);
  States a(global_weights(plain->layout())), c(global_weights(ckpt->layout()));
  EXPECT_EQ(plain->forward_backward(p.inputs.data(), p.targets.data(), a, a, 1.0f),
            ckpt->forward_backward(p.inputs.data(), p.targets.data(), c, c, 1.0f));
  for (size_t u = 0; u < a.grads.size(); ++u) EXPECT_EQ(a.grads[u], c.grads[u]) << u;
}

TEST_P(DocumentMasking, GenerationIsNotMasked) {
  // The KV-cache path ignores document masking: its logits are those of the unmasked forward.
  const ModelSpec s = tiny(GetParam());
  const Packed p = packed_batch();
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, 1, p.T, false, nullptr);
  States st(global_weights(model->layout()));
  const int Vp = model->layout().local().vocab_rows;
  std::vector<float> full(static_cast<size_t>(p.T) * Vp), last(static_cast<size_t>(Vp));
  model->forward(p.inputs.data(), p.targets.data(), st);
  model->read_logits(full.data());
  model->set_document_masking(kEos);
  model->start_generation(p.T);
  model->generate_step(p.inputs.data(), p.T, 0, st, last.data());
  const std::vector<float> want(full.end() - Vp, full.end());
  EXPECT_LT(rel_err(last, want), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Archs, DocumentMasking,
                         testing::Values(ModelArch::kGpt2, ModelArch::kLlama, ModelArch::kMistral,
                                         ModelArch::kQwen2),
                         [](const auto& info) { return std::string(model_arch_name(info.param)); });

TEST(DocumentMaskingRefusals, ContextParallelModelRefusesIt) {
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(tiny(ModelArch::kGpt2), *be, 1, 8, false, nullptr, TensorShard{},
                          ContextShard{0, 2});
  EXPECT_THROW(model->set_document_masking(kEos), InputError);
  model->set_document_masking(-1);  // off: fine
}

}  // namespace
}  // namespace zerod
