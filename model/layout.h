// Parameter layout: the model's parameters grouped into units (embedding, each transformer
// block and a MoE block's routed experts, final norm (+ the untied output head)), each unit one
// flat buffer with every tensor at an aligned offset, except inside a packed group (a Llama block's
// q/k/v and gate/up weights lie back to back, so one matmul computes them). ZeRO partitions these
// flat buffers; checkpoints and safetensors use the Hugging Face names of the architecture (GPT-2:
// "h.3.attn.c_attn.weight" without the "transformer." prefix; Llama family:
// "model.layers.3.self_attn.q_proj.weight").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/shard.h"
#include "model/spec.h"

namespace zerod {

enum class InitKind : uint8_t { kNormal, kNormalResidual, kZeros, kOnes };

struct TensorInfo {
  std::string name;            // Hugging Face name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // our storage shape, row-major: matmul weights are (OC, C)
  int64_t offset = 0;          // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (2-D weights: matmuls and embeddings)
  bool hf_transposed = false;  // HF stores it transposed (Conv1D weights are (C, OC))
  int64_t real_rows = -1;      // rows that exist in HF (wte: V of Vp); -1: all
  InitKind init = InitKind::kZeros;
  // The random stream init_range draws this tensor's values from: (block << 16) | index, the
  // block (0 embedding, 1 + l block l, n_layer + 1 final) and the tensor's index among the
  // block's tensors in the order router, routed experts, shared experts for a MoE block
  // (whichever units hold them), so any rank's part of any split draws the single rank's values.
  uint64_t stream = 0;
  // Tensor parallelism (model/shard.h): how this rank's tensor is cut from the global one,
  // `shape` being the rank's part of `global_shape`. parts > 1: dimension 0 holds that many
  // tensors back to back (GPT-2's c_attn: q, k, v), each split on its own.
  Split split = Split::kReplicated;
  int parts = 1;
  std::vector<int64_t> global_shape;
};

struct UnitLayout {
  std::string name;  // "embedding", "h.3", "ln_f" (GPT-2); "embedding", "layers.3", "norm"
  std::vector<TensorInfo> tensors;
  int64_t numel = 0;  // flat buffer size in elements, a multiple of the alignment
  // The routed experts of a MoE block ("h.3.experts", "layers.3.experts"; ParamLayout::
  // experts_unit): expert parallelism stores, reduces and shards these apart from the rest.
  bool experts = false;

  const TensorInfo& tensor(const std::string& name) const;
};

// The layers a pipeline stage holds (DESIGN.md section 8): blocks [begin, end), the embedding
// when begin == 0, the final norm (and an untied head) when end == n_layer. end < 0: every layer
// (the whole model). A last stage that is not also the first holds a copy of a tied embedding for
// its head (Megatron's): its gradient is summed with the first stage's before the optimizer step,
// and it is not counted in the gradient norm there.
struct LayerRange {
  int begin = 0;
  int end = -1;
  bool operator==(const LayerRange&) const = default;
};

class ParamLayout {
 public:
  // Every tensor offset and every unit size is a multiple of align_elems. With shard.size > 1,
  // the layout of one tensor-parallel rank: the same units and tensors in the same order, each
  // tensor this rank's part (Error when the spec cannot be split: tensor_parallel_problem).
  // With a stage (LayerRange) the layout of one pipeline stage: its units only, in the global
  // order, keeping their names and their global initialisation (unit(u) is global unit
  // global_unit(u)); Error for a range outside [0, n_layer) or empty.
  explicit ParamLayout(const ModelSpec& spec, int64_t align_elems = 16, TensorShard shard = {},
                       LayerRange stage = {});
  // The layout of a pipeline rank holding several stages (interleaved schedules: chunks of
  // layers in increasing order, not overlapping): the units of all of them, in the global order
  // (the embedding when a chunk begins at layer 0, the final unit when one ends at n_layer, a
  // tied copy when one ends there and none begins at 0). What the rank's ZeRO engine and
  // checkpoints see; each chunk's model has its own single-stage layout.
  ParamLayout(const ModelSpec& spec, int64_t align_elems, TensorShard shard,
              std::vector<LayerRange> chunks);

  // The global spec (whole model), whatever the shard.
  const ModelSpec& spec() const { return spec_; }
  const TensorShard& shard() const { return shard_; }
  // The dimensions this rank computes (the spec's own when shard.size == 1).
  const LocalDims& local() const { return local_; }
  // Counted in the global gradient norm by this rank: split tensors on every rank, replicated
  // ones on rank 0 only, so a sum over the tensor group counts every element once.
  bool counted_in_norm(const TensorInfo& t) const {
    return t.split == Split::kRows || t.split == Split::kColumns || shard_.rank == 0;
  }
  // A rank-0-only tensor on another rank: zeros whose gradient is dropped.
  bool drops_gradient(const TensorInfo& t) const {
    return t.split == Split::kOwnerOnly && shard_.rank != 0;
  }
  // As above for a tensor of unit u: not the tied embedding copy of a last stage.
  bool counted_in_norm(int u, const TensorInfo& t) const {
    return u != tied_copy_unit_ && counted_in_norm(t);
  }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitLayout& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  // Local unit indices (-1: this stage does not hold it). block_unit(l) for l in the stage.
  int embedding_unit() const { return embedding_unit_; }
  int block_unit(int layer) const { return layer_unit_.at(static_cast<size_t>(layer)); }
  // The unit of MoE block `layer`'s routed experts, right after its block unit (-1: a dense
  // block, or not held).
  int experts_unit(int layer) const { return experts_unit_.at(static_cast<size_t>(layer)); }
  int final_unit() const { return final_unit_; }
  // The stage: the layers held (begin, end with end resolved to n_layer for the whole model);
  // of a layout of several chunks, the first chunk (see chunks()).
  const LayerRange& stage() const { return stage_; }
  const std::vector<LayerRange>& chunks() const { return chunks_; }
  bool whole_model() const {
    return chunks_.size() == 1 && stage_.begin == 0 && stage_.end == spec_.n_layer;
  }
  // Unit u's index in the whole model's layout, which has num_global_units() units.
  int global_unit(int u) const { return global_unit_.at(static_cast<size_t>(u)); }
  int num_global_units() const { return num_global_units_; }
  // The embedding unit of a last stage that is not the first: the tied head's copy (-1: none).
  int tied_copy_unit() const { return tied_copy_unit_; }
  int64_t align_elems() const { return align_; }
  int64_t total_numel() const;  // sum of unit buffers (with padding)

  // Offsets inside a GPT-2 block unit (identical for every block).
  struct BlockOffsets {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
        fcproj_b;
  };
  const BlockOffsets& block() const { return block_; }
  // Offsets inside a Llama-family block unit; -1 for a bias the spec does not have. qkv_w is
  // q_proj (q_dim, C), k_proj (kv_dim, C), v_proj (kv_dim, C) back to back, i.e. one
  // (qkv_dim, C) matrix; qkv_b likewise; gu_w is gate_proj (I, C) then up_proj (I, C).
  struct LlamaBlockOffsets {
    int64_t ln1_w, qkv_w, qkv_b, o_w, o_b, ln2_w, gu_w, gu_b, down_w, down_b;
  };
  const LlamaBlockOffsets& llama_block() const { return llama_block_; }
  // A MoE block (spec().moe.is_moe_layer(l)) has the dense block's offsets up to its second norm
  // (block() / llama_block()) and, instead of the MLP, these (identical in every MoE block; -1
  // where absent). In the block's unit: the router gate_w (E, C); the shared experts' MLP of
  // Is = shared_experts x I channels: shared_w13 (Hs, C), shared_b13, shared_w2 (C, Is),
  // shared_b2. In its experts unit (experts_unit(l)): this rank's local_experts() experts, expert
  // by expert, expert_stride elements apart: its first matmul w13 (H, C) with bias b13 (H)
  // (Llama family: w1 (I, C) then w3 (I, C), H = 2I, no biases; GPT-2: c_fc, H = 4C), its second
  // w2 (C, I) with bias b2 (C); the offsets are the first local expert's. Names: Mixtral's
  // (model.layers.N.block_sparse_moe.gate.weight,
  // ...experts.E.w1.weight, shared_experts.gate_proj.weight) for the Llama family; DeepSpeed-MoE's
  // (h.N.mlp.deepspeed_moe.gate.wg.weight, ...experts.deepspeed_experts.E.c_fc.weight) for GPT-2.
  struct MoeBlockOffsets {
    int64_t gate_w = -1, w13 = -1, b13 = -1, w2 = -1, b2 = -1, shared_w13 = -1, shared_b13 = -1,
            shared_w2 = -1, shared_b2 = -1;
    int64_t expert_stride = 0;
  };
  const MoeBlockOffsets& moe_block() const { return moe_block_; }
  // The routed experts this rank stores (TensorShard::expert_rank / expert_size): experts
  // [first_expert(), first_expert() + local_experts()) of every MoE block. Its experts unit is
  // elements [experts_offset(), experts_offset() + numel) of the unit holding every expert (the
  // layout with shard().all_experts()).
  int local_experts() const;
  int first_expert() const { return shard_.expert_rank * local_experts(); }
  int64_t experts_offset() const { return first_expert() * moe_block_.expert_stride; }
  // Llama family: the final unit holds model.norm.weight at 0 and, when the embedding is not
  // tied, lm_head.weight (Vp, C) at lm_head_offset() (-1 when tied: the head is embed_tokens).
  int64_t lm_head_offset() const { return lm_head_offset_; }
  int64_t wte_offset() const { return 0; }
  int64_t wpe_offset() const { return wpe_offset_; }
  int64_t lnf_w_offset() const { return 0; }
  int64_t lnf_b_offset() const { return lnf_b_offset_; }  // GPT-2 only

  // Fills elements [begin, end) of unit u's flat buffer with the initialisation for `seed`:
  // weights N(0, std) (GPT-2's residual projections N(0, std/sqrt(2*n_layer))), biases 0,
  // norm weights 1, padding (alignment gaps and padded vocabulary rows) 0. Each value is a
  // function of (seed, tensor, global element) only, so any slice can be initialised on its
  // own and a tensor-parallel rank's part equals that part of the single-rank initialisation.
  void init_range(int u, float* out, int64_t begin, int64_t end, uint64_t seed) const;

 private:
  ModelSpec spec_;
  int64_t align_;
  TensorShard shard_;
  LocalDims local_;
  std::vector<UnitLayout> units_;
  void build_gpt2();
  void build_llama();
  // (build, in global order) A unit of `layer` (-1 embedding, n_layer final); a MoE block's unit
  // and its routed experts' unit.
  void push_unit(UnitLayout unit, int layer);
  void push_moe_units(UnitLayout block, UnitLayout routed, int layer);
  void keep_stage_units();  // drops the units outside stage_ (after a build)
  std::vector<int> unit_layer_;  // (build) per global unit: its layer, -1 embedding, L final
  std::vector<LayerRange> chunks_;
  LayerRange stage_;
  std::vector<int> global_unit_;
  int num_global_units_ = 0;
  std::vector<int> layer_unit_;    // per global layer: its local unit, -1 when not held
  std::vector<int> experts_unit_;  // per global layer: its experts' local unit, -1: none
  int embedding_unit_ = 0, final_unit_ = 0, tied_copy_unit_ = -1;

  BlockOffsets block_{};
  LlamaBlockOffsets llama_block_{};
  MoeBlockOffsets moe_block_{};
  int64_t lm_head_offset_ = -1;
  int64_t wpe_offset_ = 0;
  int64_t lnf_b_offset_ = 0;
};

}  // namespace zerod
