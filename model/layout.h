// Parameter layout: the model's parameters grouped into units (embedding, each transformer
// block, final norm), each unit one flat buffer with every tensor at an aligned offset. ZeRO
// partitions these flat buffers; checkpoints and safetensors use the Hugging Face GPT-2 names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace zerod {

enum class InitKind : uint8_t { kNormal, kNormalResidual, kZeros, kOnes };

struct TensorInfo {
  std::string name;            // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // our storage shape, row-major: matmul weights are (OC, C)
  int64_t offset = 0;          // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (2-D weights: matmuls and embeddings)
  bool hf_transposed = false;  // HF stores it transposed (Conv1D weights are (C, OC))
  int64_t real_rows = -1;      // rows that exist in HF (wte: V of Vp); -1: all
  InitKind init = InitKind::kZeros;
};

struct UnitLayout {
  std::string name;  // "embedding", "h.3", "ln_f"
  std::vector<TensorInfo> tensors;
  int64_t numel = 0;  // flat buffer size in elements, a multiple of the alignment

  const TensorInfo& tensor(const std::string& name) const;
};

class ParamLayout {
 public:
  // Every tensor offset and every unit size is a multiple of align_elems.
  explicit ParamLayout(const GptSpec& spec, int64_t align_elems = 16);

  const GptSpec& spec() const { return spec_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitLayout& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int embedding_unit() const { return 0; }
  int block_unit(int layer) const { return 1 + layer; }
  int final_unit() const { return spec_.n_layer + 1; }
  int64_t align_elems() const { return align_; }
  int64_t total_numel() const;  // sum of unit buffers (with padding)

  // Offsets inside a block unit (identical for every block).
  struct BlockOffsets {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
        fcproj_b;
  };
  const BlockOffsets& block() const { return block_; }
  int64_t wte_offset() const { return 0; }
  int64_t wpe_offset() const { return wpe_offset_; }
  int64_t lnf_w_offset() const { return 0; }
  int64_t lnf_b_offset() const { return lnf_b_offset_; }

  // Fills elements [begin, end) of unit u's flat buffer with the GPT-2 initialisation for
  // `seed`: weights N(0, std), residual projections N(0, std/sqrt(2*n_layer)), biases 0,
  // LayerNorm weights 1, padding (alignment gaps and padded vocabulary rows) 0. Each value is a
  // function of (seed, tensor, element) only, so any slice can be initialised on its own.
  void init_range(int u, float* out, int64_t begin, int64_t end, uint64_t seed) const;

 private:
  GptSpec spec_;
  int64_t align_;
  std::vector<UnitLayout> units_;
  BlockOffsets block_{};
  int64_t wpe_offset_ = 0;
  int64_t lnf_b_offset_ = 0;
};

}  // namespace zerod
