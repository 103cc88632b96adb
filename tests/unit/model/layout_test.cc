#include "model/layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

namespace zerod {
namespace {

ModelSpec gpt2_small() {
  ModelSpec s;  // defaults are GPT-2 124M
  return s;
}

TEST(Layout, Gpt2SmallHasTheHuggingFaceParameterCount) {
  const ModelSpec s = gpt2_small();
  EXPECT_EQ(s.vp(), 50304);
  EXPECT_EQ(s.num_parameters(), 124439808);  // GPT-2 small with tied embeddings
  // The benchmark shape's FLOPs per token quoted in the issue: 98.2 MFLOP.
  ModelSpec b;
  b.n_layer = 4;
  b.n_head = 4;
  b.n_embd = 256;
  b.seq_len = 256;
  EXPECT_NEAR(b.flops_per_token(256) / 1e6, 98.2, 0.05);
}

TEST(Layout, UnitsTensorsAndAlignment) {
  ModelSpec s;
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
  ModelSpec s;
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

ModelSpec llama_like(ModelArch arch, int C, int I, int L, int NH, int KVH, int V, bool tied) {
  ModelSpec s;
  s.arch = arch;
  s.n_embd = C;
  s.intermediate_size = I;
  s.n_layer = L;
  s.n_head = NH;
  s.n_kv_head = KVH;
  s.vocab_size = V;
  s.tie_word_embeddings = tied;
  s.qkv_bias = arch == ModelArch::kQwen2;
  return s;
}

TEST(Layout, LlamaFamilyParameterCountsAreTheHuggingFaceOnes) {
  // The counts transformers reports for these configurations (model.num_parameters()).
  EXPECT_EQ(llama_like(ModelArch::kLlama, 4096, 11008, 32, 32, 32, 32000, false).num_parameters(),
            6738415616);  // Llama 2 7B
  EXPECT_EQ(llama_like(ModelArch::kLlama, 4096, 14336, 32, 32, 8, 128256, false).num_parameters(),
            8030261248);  // Llama 3 8B
  EXPECT_EQ(llama_like(ModelArch::kMistral, 4096, 14336, 32, 32, 8, 32000, false).num_parameters(),
            7241732096);  // Mistral 7B
  EXPECT_EQ(llama_like(ModelArch::kQwen2, 896, 4864, 24, 14, 2, 151936, true).num_parameters(),
            494032768);  // Qwen2 0.5B
}

TEST(Layout, LlamaBlocksPackQkvAndGateUpUnderTheirHuggingFaceNames) {
  ModelSpec s = llama_like(ModelArch::kLlama, 40, 56, 2, 4, 2, 300, false);
  s.qkv_bias = true;
  const ParamLayout layout(s, 16);
  ASSERT_EQ(layout.num_units(), 4);
  EXPECT_EQ(layout.unit(1).name, "layers.0");
  EXPECT_EQ(layout.unit(3).name, "norm");
  const UnitLayout& b = layout.unit(2);
  const auto& o = layout.llama_block();
  const TensorInfo& q = b.tensor("model.layers.1.self_attn.q_proj.weight");
  const TensorInfo& k = b.tensor("model.layers.1.self_attn.k_proj.weight");
  const TensorInfo& v = b.tensor("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.offset, o.qkv_w);
  EXPECT_EQ(k.offset, q.offset + 40 * 40);  // q (NH*HS = 40, C) then k (KVH*HS = 20, C)
  EXPECT_EQ(v.offset, k.offset + 20 * 40);
  EXPECT_EQ(b.tensor("model.layers.1.self_attn.k_proj.bias").offset, o.qkv_b + 40);
  const TensorInfo& gate = b.tensor("model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(gate.offset, o.gu_w);
  EXPECT_EQ(b.tensor("model.layers.1.mlp.up_proj.weight").offset, gate.offset + 56 * 40);
  EXPECT_EQ(b.tensor("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{40, 56}));
  EXPECT_EQ(o.o_b, -1);
  EXPECT_EQ(layout.unit(3).tensor("lm_head.weight").shape, (std::vector<int64_t>{384, 40}));
  EXPECT_EQ(layout.unit(3).tensor("lm_head.weight").real_rows, 300);
  EXPECT_GE(layout.lm_head_offset(), 0);
  s.tie_word_embeddings = true;
  EXPECT_EQ(ParamLayout(s, 16).lm_head_offset(), -1);
  EXPECT_EQ(ParamLayout(s, 16).unit(3).tensors.size(), 1u);
}

}  // namespace
}  // namespace zerod
