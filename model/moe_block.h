// The sparse MLP of a mixture-of-experts block (ModelSpec::moe), as the Gpt and Llama models run
// it in place of their dense MLP on the normed residual x (N,C):
//
//   logits (N,E) = x Wg^T                          the router (gate), no bias
//   probs, expert (N,k), weight (N,k)              softmax top-k (renormalised for Mixtral),
//                                                  capacity and dropping or dropless
//   xp (R,C) = x rows in expert order              R = kept assignments <= N k
//   h (R,H) = grouped matmul of each expert's      SwiGLU: w1 | w3 (H = 2I); GELU: c_fc (H = 4C)
//   act (R,I) = swiglu(h) or gelu(h)
//   yp (R,C) = grouped matmul of each expert's     w2 / c_proj
//   y (N,C) = sum over a token's kept slots of weight x its expert rows
//   (+ shared experts: one dense MLP of shared_experts x I on every token, added to y)
//
// and the backward of all of it, with the router's load-balancing and z losses added to the
// objective (their coefficients times the micro-batch's loss weight). Hugging Face's Mixtral
// computes one aux loss over every layer's router logits: each layer's backward then uses the
// assignment counts summed over the layers of the micro-batch's forward (so the forward of every
// layer precedes the backward of any, as in forward_backward); DeepSpeed's adds the layers' own.
//
// Activations: per slot and MoE layer the router's and the permuted rows' (or, with activation
// checkpointing, one set recomputed per layer in backward); shared: the backward's work buffers.
// saved_bytes / shared_bytes give them for the models' activation estimates.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "model/expert_exchange.h"
#include "model/layout.h"
#include "model/model.h"

namespace zerod {

// How the owning model allocates, rounds and times (its ModelBase services).
struct MoeHost {
  std::function<void*(size_t elems)> act;    // compute-dtype activations
  std::function<float*(size_t elems)> stat;  // 4-byte elements (fp32 statistics, int32 indices)
  std::function<void(void* x, int64_t n)> round;
  std::function<Backend*()> timer;  // null when not timing
  OpTimes* times = nullptr;
  // Tensor parallelism (the layout's shard size > 1): x (fp32, n elements, the backend's
  // memory) summed over the tensor group, in place.
  std::function<void(float* x, int64_t n)> tensor_sum;
  // Sequence parallelism (with tensor parallelism): the model keeps only its part of the
  // block's input, so the layers keep their own copy of the gathered input (N,C) per layer for
  // the backward (ignoring the x passed to it); and the router's gradients are computed on this
  // rank's rows of the N only (the part), since the tensor group sums the replicated tensors'
  // gradients and the block's input gradient.
  bool sequence_parallel = false;
  // Context parallelism (null without): x (host, n values) summed over the context group, whose
  // ranks hold the other rows of each micro-batch. The router's statistics (assignment counts,
  // probability sums, z-loss sum, rows) are summed per layer in forward, so the aux and z losses,
  // their gradients and the capacity-free routing are those of the whole micro-batch.
  std::function<void(double* x, int64_t n)> context_sum;
};

class MoeLayers {
 public:
  // For a model of `layout` over micro-batches of N rows, with `slots` micro-batches held.
  MoeLayers(const ParamLayout& layout, Backend& be, int64_t N, bool activation_checkpointing,
            int slots, MoeHost host);

  // Activation bytes (MemCategory::kActivations): per slot (its MoE layers' saved state, none
  // when checkpointing) and shared (recompute and backward buffers), for N rows and n_moe MoE
  // layers held.
  // `tensor`: the tensor group's size (each expert's width split that many ways).
  // `keep_input`: MoeHost::sequence_parallel (the layers keep their input).
  static int64_t saved_bytes(const ModelSpec& s, int64_t N, int n_moe,
                             bool activation_checkpointing, size_t esz, int tensor = 1,
                             bool keep_input = false);
  static int64_t shared_bytes(const ModelSpec& s, int64_t N, bool activation_checkpointing,
                              size_t esz, int tensor = 1, bool keep_input = false);
  // What a model's activation estimate changes with experts, for a stage's blocks of which the
  // MoE ones save no dense MLP state (dense_mlp bytes per block): per slot (the MoE layers'
  // state, less their dense MLP state unless checkpointing) and shared (the MoE work buffers,
  // less the recompute block's dense MLP state when no block is dense). {0, 0} when dense.
  struct ModelBytes {
    int64_t per_slot = 0, shared = 0;
  };
  static ModelBytes model_bytes(const ModelSpec& s, int64_t N, const LayerRange& stage,
                                bool activation_checkpointing, size_t esz, int64_t dense_mlp,
                                int tensor = 1, bool keep_input = false);

  // Expert parallelism (null: every expert on this rank): the experts are spread over the
  // exchange's P ranks, this rank computing experts [r E/P, (r+1) E/P) for the rows every rank
  // of the group routes to them (dispatched and combined through the exchange). The router, the
  // shared experts and the gate stay replicated. The layout stores those experts (its
  // TensorShard's expert_rank r of P), or every expert, whose others' gradients are then left
  // untouched (zero). Not owned; must outlive the layers.
  void set_expert_exchange(ExpertExchange* x);

  void select_slot(int k) { slot_ = k; }
  // Starts the forward of a micro-batch in the current slot (resets its router totals);
  // training: the training capacity factor, else the evaluation one; loss_weight: the factor of
  // the slot's loss gradient (the aux and z losses' gradients are scaled by it). A forward of a
  // layer that already ran since is a recompute (activation checkpointing), which neither counts
  // nor changes the totals.
  void begin_forward(bool training, float loss_weight);

  // y (N,C) = the MoE MLP of block l on x (N,C), n <= the constructor's N rows: the router and
  // shared experts from the block unit's weights w, the routed experts from its experts unit's
  // ew (ParamLayout::experts_unit).
  void forward(int l, const void* w, const void* ew, const void* x, void* y, int64_t n);
  // dx (N,C) = the gradient of x from dy (N,C) (overwritten); the block unit's gradients dw +=,
  // the experts unit's dew +=.
  void backward(int l, const void* w, void* dw, const void* ew, void* dew, const void* x,
                const void* dy, void* dx);

  // The current slot's routing and losses (after its forward; aux and z losses complete once
  // every MoE layer ran).
  MoeStepStats stats() const;

  // Hugging Face's all-layer aux loss across pipeline stages: its statistics (2E + 1 doubles:
  // the assignment counts per expert, the probability sums per expert, the tokens) summed over
  // every layer of a micro-batch. A stage's forward adds its layers' to those its previous stage
  // passed on (set_totals with final = false, before the slot's forward; stage 0: none) and
  // passes totals() on; the last stage's totals are the whole model's, which go back stage by
  // stage with the gradients (set_totals with final = true, before the slot's backward), so
  // every layer's backward uses the whole model's counts. totals_size(): 0 when the layers do
  // not need them (a whole model, or another aux loss).
  int totals_size() const;
  void totals(int slot, double* out) const;
  void set_totals(int slot, const double* in, bool final);

 private:
  struct Acts {  // one MoE layer's forward state (rows: N tokens, Rmax = N k permuted rows)
    void* logits = nullptr;        // (N,E)
    float* probs = nullptr;        // (N,E)
    float* lse = nullptr;          // (N)
    int32_t* expert = nullptr;     // (N,k)
    float* weight = nullptr;       // (N,k)
    int32_t* slot_row = nullptr;   // (N,k)
    int32_t* row_token = nullptr;  // (Rmax)
    void* xp = nullptr;            // (Rmax,C)
    void* h = nullptr;             // (Rmax,H)
    void* a = nullptr;             // (Rmax,I)
    void* yp = nullptr;            // (Rmax,C)
    void* sh = nullptr;            // shared experts: (N,Hs)
    void* sa = nullptr;            // (N,Is)
    void* x = nullptr;             // (N,C) the input, kept under sequence parallelism
    std::vector<int64_t> offsets;  // (E+1) host
    std::vector<int64_t> counts;   // (E) the aux loss's counts
    std::vector<int64_t> kept;     // (E)
    MoeRouterStats stats;
    int64_t n = 0;  // rows of the forward
    // Expert parallelism: the rows rank s sends this rank for local expert j at s El + j (the
    // received blocks are source-major), the local experts' offsets (El+1, expert-major), the
    // rows sent to / received from each rank (P), and the local experts' rows xl (Rl,C), h
    // (Rl,H) and a (Rl,I) in expert-major order (host vectors sized to the rows received).
    std::vector<int64_t> ep_recv, ep_offsets, ep_send_rows, ep_recv_rows;
    std::vector<char> xl, hl, al;
  };
  struct Slot {
    std::vector<Acts> layers;            // per model layer (empty for dense and unheld ones)
    std::vector<int64_t> total_counts;   // (E) summed over the MoE layers of the forward
    std::vector<double> total_prob_sum;  // (E)
    int64_t total_tokens = 0;
    // Pipeline stages (totals()): the previous stages' sums (carried into this stage's), or the
    // whole model's once received back (final: total_* are they).
    std::vector<int64_t> carried_counts;
    std::vector<double> carried_prob_sum;
    int64_t carried_tokens = 0;
    bool final = false;
    // Per model layer: the aux loss's assignment counts (E) and the rows of the micro-batch
    // (summed over the context group under context parallelism), for its backward.
    std::vector<std::vector<int64_t>> layer_counts;
    std::vector<int64_t> layer_rows;
    double z_sum = 0, aux_sum = 0;           // sum of the layers' z and own aux losses
    std::vector<int> order;                  // MoE layers in forward order
    std::vector<std::vector<int64_t>> kept;  // per layer in `order`: rows per expert
    std::vector<int64_t> dropped;            // per layer in `order`
    std::vector<double> layer_aux, layer_z;  // per layer in `order`
    int64_t tokens = 0;
    bool training = true;
    float loss_weight = 0;
  };
  Acts make_acts();
  // The expert MLP over rows in expert order: h = x W13^T (+b13), act, out = act W2^T (+b2),
  // for the `experts` experts from `first` on (offsets: experts + 1 row offsets).
  void experts_forward(const void* w, const void* x, void* h, void* act, void* out,
                       const int64_t* offsets, int experts, int first, int64_t R);
  // Its backward from dout (R,C): dx (R,C) (overwritten), the experts' weight gradients +=.
  // da (R,I), dh (R,H): work rows. dout may be dx (read before dx is written).
  void experts_backward(const void* w, void* dw, const void* x, const void* h, const void* act,
                        const void* dout, void* dx, void* da, void* dh, const int64_t* offsets,
                        int experts, int first, int64_t R);
  // Expert parallelism: yp (R,C) = the experts of every rank of the group on xp (R,C), this rank
  // computing its local experts for the whole group; and the backward, dxp from dyp.
  void dispatch_forward(Acts& a, const void* w, int64_t R);
  void dispatch_backward(const Acts& a, const void* w, void* dw);
  Acts& acts_for(int l);
  // Experts [first, first + experts)'s index among the experts the layout stores (Error when it
  // does not store them all).
  int64_t stored_expert(int first, int experts) const;
  bool swiglu() const { return layout_.spec().llama_family(); }

  const ParamLayout& layout_;
  Backend& be_;
  MoeHost host_;
  size_t esz_;
  int64_t N_;
  bool checkpointing_;
  std::vector<Slot> slots_;
  int slot_ = 0;
  Acts work_;  // checkpointing: the layer being run
  // Backward work (shared): dlogits (N,E), dweight (N,k) fp32, and (Rmax or N rows) dyp / dxp
  // (.,C), dh (.,H), da (.,I).
  void* dlogits_ = nullptr;
  float* dweight_ = nullptr;
  void* dyp_ = nullptr;
  void* dh_ = nullptr;
  void* da_ = nullptr;
  ExpertExchange* ep_ = nullptr;
  // Expert parallelism's work rows (host): the received / sent blocks and the local experts'
  // backward (Rl rows).
  std::vector<char> ep_rows_, ep_d_, ep_dh_, ep_da_;
};

}  // namespace zerod
