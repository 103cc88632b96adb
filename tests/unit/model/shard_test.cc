// Tensor-parallel layouts (model/shard.h): each rank's part of every tensor, the initialisation
// by global element, shard/unshard round trips, the norm-counting rule and the refusals.
#include "model/shard.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "model/layout.h"

namespace zerod {
namespace {

ModelSpec gpt2() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_embd = 24;
  s.vocab_size = 300;
  s.seq_len = 11;
  return s;
}

ModelSpec llama() {
  ModelSpec s = gpt2();
  s.arch = ModelArch::kLlama;
  s.n_head = 8;
  s.n_kv_head = 4;
  s.head_dim = 6;
  s.intermediate_size = 36;
  s.tie_word_embeddings = false;
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  return s;
}

std::vector<float> unit_init(const ParamLayout& l, int u, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(l.unit(u).numel));
  l.init_range(u, x.data(), 0, l.unit(u).numel, seed);
  return x;
}

class ShardLayout : public testing::TestWithParam<ModelSpec> {};
INSTANTIATE_TEST_SUITE_P(Archs, ShardLayout, testing::Values(gpt2(), llama()),
                         [](const auto& info) { return model_arch_name(info.param.arch); });

TEST_P(ShardLayout, EachRankInitialisesItsPartOfTheSingleRankWeights) {
  const ModelSpec s = GetParam();
  const ParamLayout global(s);
  for (int T : {2, 4}) {
    for (int r = 0; r < T; ++r) {
      const ParamLayout local(s, 16, TensorShard{r, T});
      ASSERT_EQ(local.num_units(), global.num_units());
      for (int u = 0; u < local.num_units(); ++u) {
        const std::vector<float> whole = unit_init(global, u, 9);
        std::vector<float> want(static_cast<size_t>(local.unit(u).numel));
        shard_unit(global, local, u, whole.data(), want.data());
        EXPECT_EQ(unit_init(local, u, 9), want) << "T " << T << " rank " << r << " unit " << u;
        // A slice initialised on its own equals the same slice of the whole.
        const int64_t n = local.unit(u).numel, lo = n / 3, hi = n - n / 5;
        std::vector<float> part(static_cast<size_t>(hi - lo));
        local.init_range(u, part.data(), lo, hi, 9);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + lo));
      }
    }
  }
}

TEST_P(ShardLayout, UnshardOfEveryRankRebuildsTheWholeUnitAndNormCountsEachElementOnce) {
  const ModelSpec s = GetParam();
  const ParamLayout global(s);
  const int T = 4;
  for (int u = 0; u < global.num_units(); ++u) {
    std::vector<float> whole(static_cast<size_t>(global.unit(u).numel));
    for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i % 1000) + 1.0f;
    std::vector<float> rebuilt(whole.size(), 0.0f);
    int64_t counted = 0, global_numel = 0;
    for (const TensorInfo& t : global.unit(u).tensors) global_numel += t.numel;
    for (int r = 0; r < T; ++r) {
      const ParamLayout local(s, 16, TensorShard{r, T});
      std::vector<float> part(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, whole.data(), part.data());
      unshard_unit(global, local, u, part.data(), rebuilt.data());
      for (const TensorInfo& t : local.unit(u).tensors)
        if (local.counted_in_norm(t)) counted += t.numel;
    }
    for (const TensorInfo& t : global.unit(u).tensors) {
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i)
        ASSERT_EQ(rebuilt[static_cast<size_t>(i)], whole[static_cast<size_t>(i)])
            << t.name << " element " << i - t.offset;
    }
    EXPECT_EQ(counted, global_numel) << global.unit(u).name;
  }
}

TEST(ShardLayout, LocalShapesFollowMegatronsPartitioning) {
  const ModelSpec s = llama();
  const ParamLayout l(s, 16, TensorShard{1, 2});
  const UnitLayout& b = l.unit(1);
  EXPECT_EQ(b.tensor("model.layers.0.self_attn.q_proj.weight").shape,
            (std::vector<int64_t>{24, 24}));  // 4 of 8 heads x 6
  EXPECT_EQ(b.tensor("model.layers.0.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{12, 24}));  // 2 of 4 KV heads
  EXPECT_EQ(b.tensor("model.layers.0.self_attn.o_proj.weight").shape,
            (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(b.tensor("model.layers.0.self_attn.o_proj.weight").split, Split::kColumns);
  EXPECT_EQ(b.tensor("model.layers.0.self_attn.o_proj.bias").split, Split::kOwnerOnly);
  EXPECT_EQ(b.tensor("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{24, 18}));
  EXPECT_EQ(b.tensor("model.layers.0.input_layernorm.weight").split, Split::kReplicated);
  EXPECT_EQ(l.unit(0).tensor("model.embed_tokens.weight").shape, (std::vector<int64_t>{192, 24}));
  EXPECT_EQ(l.local().vocab_begin, 192);
  EXPECT_EQ(l.local().vocab_real, 108);  // 300 - 192
  EXPECT_TRUE(l.drops_gradient(b.tensor("model.layers.0.self_attn.o_proj.bias")));
  EXPECT_FALSE(l.counted_in_norm(b.tensor("model.layers.0.input_layernorm.weight")));
  // GPT-2's c_attn splits q, k and v each.
  const ParamLayout g(gpt2(), 16, TensorShard{0, 2});
  EXPECT_EQ(g.unit(1).tensor("h.0.attn.c_attn.weight").parts, 3);
  EXPECT_EQ(g.unit(1).tensor("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{36, 24}));
}

TEST(ShardLayout, RefusesWhatTheTensorSizeDoesNotDivideNamingTheNumbers) {
  ModelSpec s = llama();
  EXPECT_EQ(tensor_parallel_problem(s, 2), "");
  EXPECT_NE(tensor_parallel_problem(s, 8).find("4 key/value heads"), std::string::npos);
  EXPECT_NE(tensor_parallel_problem(s, 3).find("8 attention heads"), std::string::npos);
  ModelSpec v = gpt2();
  v.padded_vocab_size = 302;
  EXPECT_NE(tensor_parallel_problem(v, 4).find("padded vocabulary 302"), std::string::npos);
  s.intermediate_size = 30;
  EXPECT_NE(tensor_parallel_problem(s, 4).find("MLP width 30"), std::string::npos);
  try {
    ParamLayout l(s, 16, TensorShard{0, 4});
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor parallel size 4"), std::string::npos);
  }
}

}  // namespace
}  // namespace zerod
