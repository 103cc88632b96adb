#include "model/layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

namespace zerod {
namespace {

GptSpec gpt2_small() {
  GptSpec s;  // defaults are GPT-2 124M
  return s;
}

TEST(Layout, Gpt2SmallHasTheHuggingFaceParameterCount) {
  const GptSpec s = gpt2_small();
  EXPECT_EQ(s.vp(), 50304);
  EXPECT_EQ(s.num_parameters(), 124439808);  // GPT-2 small with tied embeddings
  // The benchmark shape's FLOPs per token quoted in the issue: 98.2 MFLOP.
  GptSpec b;
  b.n_layer = 4;
  b.n_head = 4;
  b.n_embd = 256;
  b.seq_len = 256;
  EXPECT_NEAR(b.flops_per_token(256) / 1e6, 98.2, 0.05);
}

TEST(Layout, UnitsTensorsAndAlignment) {
  GptSpec s;
  s.n_layer = 3;
  s.n_head = 3;
  s.n_embd = 24;
  s.vocab_size = 300;  // padded to 384
  s.seq_len = 17;
  const ParamLayout layout(s, 16);
  ASSERT_EQ(layout.num_units(), 5);
  EXPECT_EQ(layout.unit(0).name, "embedding");
  EXPECT_EQ(layout.unit(2).name, "h.1");
  EXPECT_EQ(layout.unit(4).name, "ln_f");
  std::set<std::string> names;
  int64_t real = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& unit = layout.unit(u);
    EXPECT_EQ(unit.numel % 16, 0);
    int64_t end = 0;
    for (const TensorInfo& t : unit.tensors) {
      EXPECT_EQ(t.offset % 16, 0) << t.name;
      EXPECT_GE(t.offset, end) << t.name << " overlaps the previous tensor";
      end = t.offset + t.numel;
      EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
      real += t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
    }
    EXPECT_LE(end, unit.numel);
  }
  EXPECT_EQ(real, s.num_parameters());
  const TensorInfo& wte = layout.unit(0).tensor("wte.weight");
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{384, 24}));
  EXPECT_EQ(wte.real_rows, 300);
  const TensorInfo& qkv = layout.unit(1).tensor("h.0.attn.c_attn.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{72, 24}));
  EXPECT_TRUE(qkv.hf_transposed);
  EXPECT_TRUE(qkv.decay);
  EXPECT_FALSE(layout.unit(1).tensor("h.0.ln_1.weight").decay);
  EXPECT_EQ(layout.block().qkv_w, qkv.offset);
}

TEST(Layout, InitIsSliceableAndFollowsGpt2) {
  GptSpec s;
  s.n_layer = 4;
  s.n_head = 2;
  s.n_embd = 32;
  s.vocab_size = 200;
  s.seq_len = 16;
  const ParamLayout layout(s);
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).numel;
    std::vector<float> whole(n), pieces(n);
    layout.init_range(u, whole.data(), 0, n, 99);
    // Three uneven slices give the same values (what a ZeRO shard initialises on its own).
    const int64_t a = n / 3 + 1, b = 2 * n / 3 + 5 > n ? n : 2 * n / 3 + 5;
    layout.init_range(u, pieces.data(), 0, a, 99);
    layout.init_range(u, pieces.data() + a, a, b, 99);
    layout.init_range(u, pieces.data() + b, b, n, 99);
    ASSERT_EQ(whole, pieces) << layout.unit(u).name;
  }
  // Embedding: padded vocabulary rows are zero, real rows N(0, 0.02).
  const UnitLayout& emb = layout.unit(0);
  std::vector<float> w(emb.numel);
  layout.init_range(0, w.data(), 0, emb.numel, 7);
  for (int64_t i = 200 * 32; i < 256 * 32; ++i) ASSERT_EQ(w[i], 0.0f);
  double sq = 0;
  for (int64_t i = 0; i < 200 * 32; ++i) sq += w[i] * w[i];
  EXPECT_NEAR(std::sqrt(sq / (200 * 32)), 0.02, 0.002);
  // A block: LayerNorm weights 1, biases 0, residual projections std 0.02/sqrt(2L).
  const UnitLayout& blk = layout.unit(1);
  std::vector<float> bw(blk.numel);
  layout.init_range(1, bw.data(), 0, blk.numel, 7);
  const auto& o = layout.block();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(bw[o.ln1_w + i], 1.0f);
    EXPECT_EQ(bw[o.ln1_b + i], 0.0f);
    EXPECT_EQ(bw[o.fcproj_b + i], 0.0f);
  }
  double p2 = 0;
  for (int64_t i = 0; i < 32 * 128; ++i) p2 += bw[o.fcproj_w + i] * bw[o.fcproj_w + i];
  EXPECT_NEAR(std::sqrt(p2 / (32 * 128)), 0.02 / std::sqrt(8.0), 0.0015);
  // Another seed gives other weights.
  std::vector<float> other(blk.numel);
  layout.init_range(1, other.data(), 0, blk.numel, 8);
  EXPECT_NE(bw, other);
}

}  // namespace
}  // namespace zerod
