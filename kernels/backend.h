// The ops a GPT needs, forward and backward, behind one interface with one implementation per
// device (kernels/cpu/ is the reference; kernels/cuda/ mirrors it op for op).
//
// Conventions
// - Shapes are in comments: B batch, T sequence, C channels, NH heads, OC output channels,
//   N = B*T rows, V real vocabulary, Vp padded vocabulary.
// - `void*` tensors hold the compute dtype of the backend (compute_dtype()); `float*` tensors
//   are always fp32 (statistics, losses, master weights, optimizer moments).
// - Each backward says which outputs it overwrites (=) and which it accumulates into (+=).
// - The CPU backend stores every compute dtype as fp32 values; for bf16/fp16 runs the model
//   calls round_to_compute() wherever a GPU would store a bf16/fp16 tensor, which emulates the
//   precision exactly (round to nearest even) at fp32 speed. On CUDA round_to_compute is a no-op
//   because storage already has the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/memory.h"
#include "kernels/moe.h"

namespace zerod {

// The optimizers of OptimizerParams::kind. All keep their states in the same three fp32 slots per
// element (master, m, v), so partitioning, offload and checkpoints do not depend on the kind:
//   kAdam    m = exp_avg, v = exp_avg_sq (Adam / AdamW, DeepSpeed FusedAdam's formula)
//   kSgd     m = momentum_buffer (unused without momentum), v unused (torch.optim.SGD)
//   kAdagrad v = sum (torch's state_sum), m unused (torch.optim.Adagrad)
//   kLion    m = exp_avg, v unused (lion-pytorch / DeepSpeed FusedLion)
//   kMuon    hidden matrices: m = momentum_buffer, v unused (torch.optim.Muon); every other
//            tensor: AdamW's m and v. Not an elementwise step: ZeroEngine runs it (zero/muon_*),
//            optimizer_update refuses it.
//   kLamb    m = exp_avg, v = exp_avg_sq (DeepSpeed FusedLamb; two passes per step, lamb_moments
//            and lamb_apply, with each tensor's trust ratio in between)
enum class OptimizerKind : uint8_t { kAdam, kSgd, kAdagrad, kLion, kMuon, kLamb };

// Hyperparameters in double, as torch's param groups hold them: the kernels derive their fp32
// constants from them as torch does (1 - beta, 1 - lr * wd, Adagrad's decayed lr in double, then
// rounded); Adam rounds each to fp32 first, as DeepSpeed's FusedAdam.
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied only where the caller says (2-D weights)
  bool adam_w_mode = true;    // true: decoupled decay (AdamW); false: L2 added to the gradient
  bool bias_correction = true;
  int64_t step = 1;         // 1-based step count for bias correction
  float grad_scale = 1.0f;  // gradients are multiplied by this first (1/loss_scale * clip)
  // SGD (torch.optim.SGD); step == 1 starts the momentum buffer at the gradient, as torch does.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adagrad (torch.optim.Adagrad): lr / (1 + (step - 1) * lr_decay); step == 1 starts the sum at
  // initial_accumulator_value (the v slot holds 0 before the first step).
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
  // Lamb (DeepSpeed FusedLamb): the trust ratio's clamp, and eps under the square root.
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
};
using AdamWParams = OptimizerParams;  // (the Adam fields of it)

// The shape of one attention call (see attention_forward).
struct AttentionShape {
  int B = 0, T = 0;
  int NH = 0;      // query heads
  int KVH = 0;     // key/value heads; NH % KVH == 0 (KVH == NH: multi-head attention)
  int HS = 0;      // head size
  int window = 0;  // 0: causal; W > 0: causal within the last W positions (sliding window)
  // Document masking of packed sequences (null: none): doc_start (B,T) int32, in the backend's
  // memory (device memory on a GPU, like tokens), the first position of the document that
  // position t of row b belongs to; 0 <= doc_start[b,t] <= t and non-decreasing in t. Attention
  // then lets query t see keys j >= doc_start[b,t] only (with a window, the larger of both lower
  // bounds), and RoPE rotates row (b,t) by the table row t - doc_start[b,t] (its position in its
  // document). Only attention_forward / attention_backward and rope_forward / rope_backward take
  // it; the KV cache and block (ring) attention require null.
  const int32_t* doc_start = nullptr;

  int64_t qkv_row() const { return int64_t{NH + 2 * KVH} * HS; }  // channels of a qkv row
  int64_t out_row() const { return int64_t{NH} * HS; }            // channels of an out row
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  virtual DType compute_dtype() const = 0;
  // Bytes per element of compute-dtype storage (4 on the CPU backend whatever the dtype).
  virtual size_t compute_elem_size() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  // Device (or host, for the CPU backend) memory charged to a category of the tracker.
  virtual Buffer allocate(size_t bytes, MemCategory category, MemoryTracker* tracker) = 0;
  virtual void memset_zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst (rows, dst_ld)[:, :cols] = src (rows, src_ld)[:, :cols]: a strided copy of compute-dtype
  // elements within this backend's memory (e.g. packing the key/value columns of qkv rows into
  // a kv block and back). rows, cols >= 0, dst_ld and src_ld >= cols; the regions must not
  // overlap.
  virtual void copy_2d(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows,
                       int64_t cols) = 0;
  // Blocks until all queued work of this backend is done (no-op on the CPU).
  virtual void synchronize() {}
  // True when allocate() returns memory the host must not touch (a GPU's): host code then reads
  // and writes it only through copy() and the casts, which accept host memory on either side.
  virtual bool device_memory() const { return false; }
  // Host memory for data that moves to and from this backend's memory: pinned (page-locked, so
  // copies are asynchronous DMA) on a GPU backend, plain host_alloc() on the CPU. Zero-filled.
  virtual Buffer allocate_host(size_t bytes, MemCategory category, MemoryTracker* tracker) {
    return host_alloc(bytes, category, tracker);
  }
  // Registers host memory [p, p + bytes) for fast copies to and from this backend's memory
  // (page-locks it on a GPU: cudaHostRegister) until unregister_host(p); no-op on the CPU.
  virtual void register_host(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }
  virtual void unregister_host(void* p) { (void)p; }
  // The backend's native queue (a cudaStream_t on CUDA), null on the CPU: collectives on device
  // memory order themselves after the work queued on it.
  virtual void* native_stream() const { return nullptr; }
  // Device memory as the device's allocator sees it (bytes free and total), false on the CPU.
  virtual bool device_memory_info(int64_t* free_bytes, int64_t* total_bytes) const {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }
  // The device's name ("NVIDIA H200"), empty on the CPU.
  virtual std::string device_name() const { return {}; }

  // ---- precision ----------------------------------------------------------------------------
  // x (n) = round(x) to the compute dtype, in place. No-op for fp32 and for real bf16 storage.
  virtual void round_to_compute(void* x, int64_t n) = 0;
  // out (n, compute dtype) = in (n, fp32) converted.
  virtual void cast_to_compute(void* out, const float* in, int64_t n) = 0;
  // out (n, fp32) = in (n, compute dtype) converted.
  virtual void cast_from_compute(float* out, const void* in, int64_t n) = 0;

  // ---- encoder: token + position embedding ---------------------------------------------------
  // out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) in [0, Vp); wte (Vp,C); wpe (>=T,C).
  // wpe may be null (models without learned positions: out = wte[tokens]). A token < 0 has no
  // row here (a vocabulary-parallel shard that does not hold it): its wte term is 0 and it gets
  // no wte gradient. doc_start (B,T) int32 in the backend's memory, or null: with it the position
  // row is wpe[t - doc_start[b,t]] (document masking, see AttentionShape::doc_start).
  virtual void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                               int B, int T, int C, const int32_t* doc_start) = 0;
  // dwte (Vp,C) +=, dwpe (T,C) += from dout (B,T,C). dwpe may be null (no position embedding).
  // doc_start as encoder_forward's (row (b,t) adds to dwpe[t - doc_start[b,t]]).
  virtual void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                int B, int T, int C, const int32_t* doc_start) = 0;

  // ---- layernorm (eps 1e-5) ------------------------------------------------------------------
  // out (N,C) = (inp - mean) * rstd * weight + bias; mean (N) =, rstd (N) = (fp32).
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int64_t N, int C) = 0;
  // Fused residual + layernorm: res (N,C) = a + b stored in the compute dtype (exactly
  // residual_forward then round_to_compute), then out (N,C), mean, rstd = layernorm_forward of
  // res. One pass over the rows on a GPU. res may be a or b.
  virtual void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                          const void* a, const void* b, const void* weight,
                                          const void* bias, int64_t N, int C) = 0;
  // dinp (N,C) +=, dweight (C) +=, dbias (C) +=.
  virtual void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                  const void* inp, const void* weight, const float* mean,
                                  const float* rstd, int64_t N, int C) = 0;

  // ---- matmul: out = inp @ weight^T + bias ---------------------------------------------------
  // out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC, may be null).
  virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                              int64_t N, int C, int OC) = 0;
  // dinp (N,C) = (or += when accumulate_dinp) dout (N,OC) x weight (OC,C);
  // dweight (OC,C) += dout^T x inp; dbias (OC) += column sums of dout (skipped when null).
  // dinp may be null (no input gradient wanted), and so may dweight (no weight gradient: the
  // zero-bubble pipeline's input-gradient pass, whose weight pass later calls this with dinp
  // and dbias null and weight unused).
  virtual void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, int64_t N, int C, int OC,
                               bool accumulate_dinp) = 0;

  // ---- a matmul and a GELU as one op, where the backend fuses them ----------------------------
  // True when matmul_gelu_forward / matmul_backward_dgelu below are single fused ops (the CUDA
  // backend in 16-bit storage: cuBLASLt epilogues); the models then call them instead of the
  // matmul and GELU ops (which they keep calling elsewhere, and where this is false).
  virtual bool fuses_matmul_gelu() const { return false; }
  // pre (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC); out (N,OC) = gelu(pre): both stored.
  virtual void matmul_gelu_forward(void* out, void* pre, const void* inp, const void* weight,
                                   const void* bias, int64_t N, int C, int OC) {
    matmul_forward(pre, inp, weight, bias, N, C, OC);
    gelu_forward(out, pre, N * OC);
  }
  // The backward of a matmul whose input was inp = gelu(pre): dpre (N,C) = (dout (N,OC) x weight
  // (OC,C)) * gelu'(pre) (overwritten), dweight and dbias as matmul_backward.
  virtual void matmul_backward_dgelu(void* dpre, void* dweight, void* dbias, const void* dout,
                                     const void* inp, const void* weight, const void* pre,
                                     int64_t N, int C, int OC) {
    matmul_backward(dpre, dweight, dbias, dout, inp, weight, N, C, OC, false);
    gelu_backward(dpre, pre, dpre, N * C);
  }

  // ---- causal multi-head self-attention (MHA and grouped-query) ------------------------------
  // qkv (B,T,(NH+2*KVH)*HS) holds per position the NH query heads, then the KVH key heads, then
  // the KVH value heads, HS channels each (GPT-2: KVH = NH, HS = C/NH, i.e. q, k, v of C each).
  // Query head h reads key/value head h / (NH/KVH); K and V are never copied per query head.
  // Scores are scaled by 1/sqrt(HS); position i attends to positions j <= i, and with a window
  // W > 0 only to j > i - W (Mistral's sliding window: W positions including i itself).
  // out (B,T,NH*HS) =; lse (B,NH,T) = the log-sum-exp of each softmax row (fp32), kept for
  // backward. The T x T score matrix of all heads is never stored.
  virtual void attention_forward(void* out, float* lse, const void* qkv,
                                 const AttentionShape& s) = 0;
  // dqkv (B,T,(NH+2*KVH)*HS) = from dout (B,T,NH*HS), using qkv, out and lse of the forward
  // (dK and dV of a shared head sum over its query heads).
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, const AttentionShape& s) = 0;
  // Generation with a KV cache (forward only). qkv (B,Tq,(NH+2*KVH)*HS) holds Tq new positions
  // pos0 .. pos0+Tq-1 (s.T = Tq; q and k already rotated); their k and v are written into the
  // caches kcache, vcache (B,maxT,KVH*HS) at those positions, then out (B,Tq,NH*HS) = attention
  // of each new query over the cached positions it may see (causal, s.window), as
  // attention_forward would compute for the whole sequence. pos0 + Tq <= maxT.
  virtual void attention_kv_cache(void* out, const void* qkv, void* kcache, void* vcache, int pos0,
                                  int maxT, const AttentionShape& s) = 0;

  // ---- attention over one key/value block at global positions (ring attention) ---------------
  // A rank holds Tq = s.T query rows and meets the keys and values of the sequence one block at
  // a time (its own, then those passed round the ring). Layouts:
  //   qkv  (B,Tq,(NH+2*KVH)*HS)  the local rows, as attention_forward's; only the query heads are
  //                              read (and, backward, written: dqkv's key/value columns stay)
  //   qpos (Tq) int32            the global position of each local row, shared by the batch
  //   kv   (B,Tk,2*KVH*HS)       per key row the KVH key heads, then the KVH value heads (the
  //                              key/value columns of qkv rows: copy_2d packs them)
  //   kpos (Tk) int32            the global position of each key row, shared by the batch
  //   out, dout (B,Tq,NH*HS); lse (B,NH,Tq) fp32
  // qpos and kpos live in this backend's memory (device memory on a GPU, like tokens). Query i
  // may see key j iff kpos[j] <= qpos[i] and, with s.window = W > 0, kpos[j] > qpos[i] - W:
  // attention_forward's mask on global positions. Positions may come in any order (a
  // load-balanced causal split gives rank r the chunks r and 2C-1-r of the sequence); a block
  // may hold no key some query sees.
  //
  // out, lse: with first_block, = the attention of the queries over this block (a row that sees
  // none of its keys: out 0, lse -inf); otherwise merged with what they hold (online softmax):
  // lse' = log(exp(lse) + exp(lse_b)), out' = out exp(lse - lse') + out_b exp(lse_b - lse').
  // After every block of the sequence (in any order) out and lse are attention_forward's over
  // the whole sequence. A 16-bit out is rounded after each block.
  virtual void attention_block_forward(void* out, float* lse, const void* qkv, const int32_t* qpos,
                                       const void* kv, const int32_t* kpos, int Tk,
                                       const AttentionShape& s, bool first_block) = 0;
  // The gradients of one block from dout and the FINAL out and lse (after every block;
  // FlashAttention-2's backward: D = rowsum(dout * out), P = exp(S - lse)). dqkv (B,Tq,
  // (NH+2*KVH)*HS): its query heads += this block's dQ (key/value columns untouched; zero dqkv
  // before the first block). dkv (B,Tk,2*KVH*HS) = (or += with accumulate_dkv) this block's dK,
  // dV (summed over the query heads of a key/value head), to be sent home. Summed over the
  // blocks, dQ and each block's dK, dV are attention_backward's.
  virtual void attention_block_backward(void* dqkv, void* dkv, const void* dout, const void* qkv,
                                        const int32_t* qpos, const void* kv, const int32_t* kpos,
                                        int Tk, const void* out, const float* lse,
                                        const AttentionShape& s, bool accumulate_dkv) = 0;

  // ---- RMSNorm (Llama family) ----------------------------------------------------------------
  // rstd (N) = 1 / sqrt(mean(inp[n,:]^2) + eps) in fp32; out (N,C) = inp * rstd * weight.
  virtual void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight,
                               int64_t N, int C, float eps) = 0;
  // dinp (N,C) +=, dweight (C) += from dout (N,C), with inp and rstd of the forward.
  virtual void rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp,
                                const void* weight, const float* rstd, int64_t N, int C) = 0;

  // ---- rotary position embedding (Hugging Face's rotate-half convention) ---------------------
  // In place on the q and k heads (the first NH + KVH heads) of each row of qkv
  // (B,T,(NH+2*KVH)*HS); v is untouched. For each head x and i < HS/2, with c = cos[t,i],
  // s = sin[t,i]: (x[i], x[i+HS/2]) = (x[i] c - x[i+HS/2] s, x[i+HS/2] c + x[i] s).
  // cos, sin (T, HS/2) fp32: the tables of the rows' positions (the caller offsets them).
  virtual void rope_forward(void* qkv, const float* cos, const float* sin,
                            const AttentionShape& s) = 0;
  // The inverse rotation, in place on the q and k heads of dqkv (the gradient of a rotation is
  // its transpose).
  virtual void rope_backward(void* dqkv, const float* cos, const float* sin,
                             const AttentionShape& s) = 0;

  // ---- SwiGLU (Llama family MLP) -------------------------------------------------------------
  // gu (N,2I) holds gate (columns [0,I)) and up ([I,2I)) per row;
  // out (N,I) = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
  virtual void swiglu_forward(void* out, const void* gu, int64_t N, int I) = 0;
  // dgu (N,2I) = from dout (N,I) and gu: dgate = dout * up * silu'(gate), dup = dout * silu(gate).
  virtual void swiglu_backward(void* dgu, const void* dout, const void* gu, int64_t N, int I) = 0;

  // ---- GELU (tanh approximation) -------------------------------------------------------------
  // out (n) = gelu(inp)
  virtual void gelu_forward(void* out, const void* inp, int64_t n) = 0;
  // dinp (n) = gelu'(inp) * dout
  virtual void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n) = 0;

  // ---- residual ------------------------------------------------------------------------------
  // out (n) = a + b; out may be a or b (in place, e.g. accumulating gradients)
  virtual void residual_forward(void* out, const void* a, const void* b, int64_t n) = 0;

  // ---- softmax cross-entropy over the padded vocabulary -------------------------------------
  // losses (N) = -log softmax(logits[n, :V])[targets[n]]; columns V..Vp-1 are ignored.
  // A target < 0 marks a position without loss (losses[n] = 0).
  virtual void crossentropy_forward(float* losses, const void* logits, const int32_t* targets,
                                    int64_t N, int V, int Vp) = 0;
  // Fused forward + backward: losses (N) = as above, and logits (N,Vp) is overwritten by
  // dlogits = dloss * (softmax - onehot(target)) on columns < V and 0 on the padding;
  // dloss is the gradient of the objective with respect to each position's loss. Both are at
  // the compute dtype's precision: a backend that keeps 16-bit values in fp32 storage (the CPU's
  // bf16/fp16 modes) rounds the logits it reads and the dlogits it writes itself, so its caller
  // need not round them (the other cross-entropy entry points leave that to their callers).
  virtual void crossentropy_fused(float* losses, void* logits_to_dlogits, const int32_t* targets,
                                  int64_t N, int V, int Vp, float dloss) = 0;

  // ---- vocabulary-parallel softmax cross-entropy (tensor parallelism) ------------------------
  // A rank holds the logit columns [v0, v0 + Vl) of every row: logits (N,Vl), of which the first
  // `real` (0 <= real <= Vl) are real vocabulary, the rest padding. targets (N) are global token
  // ids (< 0: a position without loss). The full loss is the log-sum-exp of all shards' real
  // columns minus the target's logit; the caller combines the statistics over the shards between
  // the three steps. stats (3N, fp32) = [max (N) | target logit (N) | sum of exp (N)].
  // Step 1: stats[0,N) = max over the real local columns (-inf when real == 0); stats[N,2N) = the
  // target's logit when v0 <= target < v0 + real, else 0. (Then: max over shards of [0,N), sum of
  // [N,2N).)
  virtual void crossentropy_shard_stats(float* stats, const void* logits, const int32_t* targets,
                                        int64_t N, int real, int Vl, int v0) = 0;
  // Step 2: stats[2N,3N) = sum over the real local columns of exp(logit - max), max the combined
  // stats[0,N). (Then: sum over shards of [2N,3N).)
  virtual void crossentropy_shard_sumexp(float* stats, const void* logits, int64_t N, int real,
                                         int Vl) = 0;
  // Step 3, with every statistic combined: losses (N) = log(sumexp) + max - target logit (0 where
  // target < 0), and logits (N,Vl) overwritten by dlogits = dloss * (softmax - onehot(target)) on
  // the real columns, 0 on the padding and on rows whose target < 0. Over all shards this equals
  // crossentropy_fused of the full logits.
  virtual void crossentropy_shard_finish(float* losses, void* logits_to_dlogits,
                                         const int32_t* targets, const float* stats, int64_t N,
                                         int real, int Vl, int v0, float dloss) = 0;

  // ---- mixture of experts: router, token permutation, grouped matmul ------------------------
  // The CPU reference and what each op follows: kernels/cpu/moe_router.h, moe_permute.h,
  // grouped_matmul.h. Memory: offsets (E+1) and the per-expert counts (E) are in host memory
  // (the host sizes each expert's block from them, as Megatron's grouped GEMM reads its batch
  // sizes on the host); every other tensor is in this backend's memory. The defaults throw (a
  // backend without them cannot run a MoE layer: the CUDA backend so far).
  //
  // Router over logits (N,E) (compute dtype): probs (N,E) =, lse (N) =, weight (N,k) = fp32;
  // expert (N,k) int32 = the top-k experts, -1 where dropped; aux_counts (E) = the aux loss's
  // counts (before dropping), kept (E) = assignments kept per expert. Returns the layer's aux and
  // z losses, capacity and dropped count.
  virtual MoeRouterStats moe_router_forward(float* probs, float* lse, int32_t* expert,
                                            float* weight, int64_t* aux_counts, int64_t* kept,
                                            const void* logits, int64_t N,
                                            const MoeRouterOptions& o);
  // dlogits (N,E) (compute dtype) = the gradient of sum(dweight * weight) + the loss terms
  // (MoeRouterLossGrad) with respect to the logits. dweight (N,k) fp32 may be null.
  virtual void moe_router_backward(void* dlogits, const float* dweight, const float* probs,
                                   const float* lse, const int32_t* expert, int64_t N,
                                   const MoeRouterOptions& o, const MoeRouterLossGrad& loss);
  // The permutation of expert (N,k) into expert-contiguous rows: offsets (E+1, host) =,
  // row_token (R) = and slot_row (N,k) = int32; returns R = offsets[E].
  virtual int64_t moe_permute_plan(int64_t* offsets, int32_t* row_token, int32_t* slot_row,
                                   const int32_t* expert, int64_t N, int k, int E);
  // xp (R,C) = x (N,C) rows gathered by row_token; backward: dx (N,C) += dxp (R,C) summed back.
  virtual void moe_permute_forward(void* xp, const void* x, const int32_t* row_token, int64_t R,
                                   int C);
  virtual void moe_permute_backward(void* dx, const void* dxp, const int32_t* slot_row, int64_t N,
                                    int k, int C);
  // The combine: y (N,C) = sum over kept slots of weight (N,k) * yp (R,C) rows; backward: dyp
  // (R,C) =, dweight (N,k) fp32 = (may be null).
  virtual void moe_unpermute_forward(void* y, const void* yp, const float* weight,
                                     const int32_t* slot_row, int64_t N, int k, int C);
  virtual void moe_unpermute_backward(void* dyp, float* dweight, const void* dy, const void* yp,
                                      const float* weight, const int32_t* slot_row, int64_t N,
                                      int k, int C);
  // Dropless grouped matmul: for each expert e, its rows [offsets[e], offsets[e+1]) of out
  // (R,OC) = inp (R,C) rows x weight[e] (OC,C)^T + bias[e] (OC); weight[e] at weight + e x
  // weight_stride elements (0: packed, OC x C), bias[e] at bias + e x bias_stride (0: OC), bias
  // may be null (dweight and dbias take the same strides). Backward: dinp rows = (or += when
  // accumulate_dinp) dout rows x weight[e] (dinp may be null); dweight[e] +=, dbias[e] +=
  // (skipped when null), as matmul_backward per expert.
  virtual void grouped_matmul_forward(void* out, const void* inp, const void* weight,
                                      const void* bias, const int64_t* offsets, int E, int C,
                                      int OC, int64_t weight_stride, int64_t bias_stride);
  virtual void grouped_matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                       const void* inp, const void* weight, const int64_t* offsets,
                                       int E, int C, int OC, bool accumulate_dinp,
                                       int64_t weight_stride, int64_t bias_stride);

  // ---- optimizer -----------------------------------------------------------------------------
  // One optimizer step (p.kind: Adam/AdamW, SGD, Adagrad, Lion) over n fp32 elements: master, m,
  // v updated in place from grad * grad_scale (grad in compute dtype); decay (when weight_decay
  // != 0) applies to every element here, the caller splits decayed and non-decayed ranges.
  // param_out (n, compute dtype, may be null) = the updated master converted to the compute dtype.
  virtual void optimizer_update(float* master, float* m, float* v, const void* grad,
                                void* param_out, int64_t n, const OptimizerParams& p) = 0;
  // Lamb (DeepSpeed FusedLamb), over n elements of one tensor (or a piece of it), in two passes
  // with the tensor's trust ratio in between (zero/lamb_step.cc):
  // lamb_moments: m, v updated from grad * grad_scale (Adam's moments, no bias correction);
  //   returns the sums over the piece, in double, of master^2 (before the step) and of u^2, u =
  //   m / (sqrt(v) + eps) + weight_decay * master the update direction.
  // lamb_apply: master -= step_size * coeff * u, u recomputed from the updated m, v and master;
  //   param_out (n, compute dtype, may be null) = the new master rounded.
  // The defaults throw (a backend without them cannot run Lamb).
  struct LambSums {
    double w2 = 0, u2 = 0;
  };
  virtual LambSums lamb_moments(float* master, float* m, float* v, const void* grad, int64_t n,
                                const OptimizerParams& p);
  virtual void lamb_apply(float* master, const float* m, const float* v, void* param_out, int64_t n,
                          const OptimizerParams& p, float coeff);
  // Sum of squares of x (n, compute dtype), accumulated in double. Inf/NaN propagate.
  virtual double sum_squares(const void* x, int64_t n) = 0;
  // The same over several pieces (x_i, n_i): sum over i, in order, of sum_squares(x_i, n_i), with
  // the same rounding. A device backend reads the pieces' partial sums back once (one wait for
  // the device instead of one per piece); this default calls sum_squares per piece.
  virtual double sum_squares_pieces(const std::vector<std::pair<const void*, int64_t>>& pieces) {
    double total = 0.0;
    for (const auto& [x, n] : pieces) total += sum_squares(x, n);
    return total;
  }
  // x (n) *= s
  virtual void scale(void* x, float s, int64_t n) = 0;
};

// The CPU reference backend for a compute dtype (see round_to_compute above).
std::unique_ptr<Backend> make_cpu_backend(DType compute_dtype);

}  // namespace zerod
