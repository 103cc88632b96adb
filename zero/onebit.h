// DeepSpeed's 1-bit optimizers (deepspeed/runtime/fp16/onebit/) over the states of a stage-0
// ZeroEngine, always in host memory (GPU ranks: the engine keeps them on the host and hands this
// an fp32 host copy of the gradients; `comm` is then the group's Gloo communicator, not the one
// that moves device tensors): after a warm-up of ordinary steps on all-reduced gradients, each rank
// updates its momentum from its own gradients and the momenta are averaged through the 1-bit
// compressed all-reduce (comm/compressed_allreduce.h), with worker and server errors kept per rank.
//
//   OneBitAdam (arXiv 2102.02888, adam.py). Steps 1..freeze_step: Adam with DeepSpeed's 1-bit
//     formula (no bias correction, decoupled decay: p -= lr (m / (sqrt(v) + eps) + wd p)), the
//     engine's Adam kernel on all-reduced gradients. After: v frozen, gradients not reduced;
//       m = b1 m + (1 - b1) g_local;  m = compressed_allreduce(m);  m *= mask;
//       p -= lr (m / (sqrt(v) + eps) + wd p)
//     The compression is per unit (one flat tensor each, as DeepSpeed's FP16_Optimizer flattens
//     a parameter group); the mask zeroes the momentum outside the unit's tensors (alignment,
//     padding, the padded vocabulary rows: DeepSpeed's exp_avg_mask), which 1 bit cannot.
//
//   OneBitLamb (arXiv 2104.06069, lamb.py), per tensor t (whole at stage 0: every rank holds
//     every tensor; norms over its real elements). Steps 1..freeze_step: LAMB on all-reduced
//     gradients without bias correction (zerod's own loop, not the Adam kernel):
//       m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  u = m / (sqrt(v) + eps) + wd p
//       c = clamp(||p|| / ||u||, min_coeff, max_coeff) (1 where either norm is 0)
//       c != 1: c_freeze = coeff_beta c_freeze + (1 - coeff_beta) c;   p -= lr c u
//     After, at the first compressed step: scaling_t = mean_t'(rms(m_t')) / rms(m_t) (1 where
//     rms(m_t) is 0; DeepSpeed divides by it), v_fresh = v (DeepSpeed copies it at freeze_step;
//     v does not change in between). Each compressed step, m_last = m:
//       m_t = (b1 m_t + (1 - b1) g_local) * scaling_t;  m = compressed_allreduce(m);
//       m_t /= scaling_t;  m *= mask;  r = (m - b1 m_last) / (1 - b1)
//       v_fresh = b2 v_fresh + (1 - b2) r^2                 (v stays frozen)
//       d = sqrt(v) + eps;  u' = m / d;  u = u' + wd p;  f = max(d / (sqrt(v_fresh) + eps))
//       wd > 0: q = min(1, ||u'|| / ||u||), f = f q + (1 - q)
//       f = clamp(f, factor_min, factor_max), then within last_f (1 -+ factor_threshold)
//       last_f = f;  p -= lr (c_freeze f) u
//
//   ZeroOneAdam (0/1 Adam, arXiv 2202.06009, zoadam.py; zero/zeroone_adam.cc). DeepSpeed's step
//     counter c = k + 1 at zerod's step k (its first call only creates buffers: see below).
//     Steps k <= var_freeze_step (variance phase): a variance step where c % var_interval == 0,
//     on all-reduced gradients:  v = b2 v + (1 - b2) g^2;  m = b1 m + (1 - b1) g;
//     otherwise gradients are not reduced:  m = b1 m + (1 - b1) mask(compressed_allreduce(g));
//     then p -= lr (m / (sqrt(v) + eps) + wd p). Each variance step counts; after
//     var_update_scaler of them var_interval doubles (the gradients of step k are all-reduced
//     iff the next c is a multiple of it).
//     Steps k > var_freeze_step (v frozen, no gradient reduction; the errors zeroed once):
//       m = b1 m + (1 - b1) g_local;  lrs += lr;  d = sqrt(v) + eps;  u = m / d + wd p;
//       p -= lr u;  acc -= lr u
//       where c % local_step_interval == 0 (a synchronisation):  p -= acc;  acc *= d;
//         acc = mask(compressed_allreduce(acc));  m = -acc / lrs;  p += acc / d;
//         acc = 0;  lrs = 0
//     and each step counts; after local_step_scaler of them local_step_interval doubles, up to
//     local_step_clipper. In between, the ranks' weights and momenta differ (local steps).
//     Deviation: at world 1 DeepSpeed skips the momentum update of a non-variance step (inside
//     its `size > 1` branch); zerod treats the all-reduce of one rank as the identity.
//     Checkpoints: this rank's errors, the accumulator, the counters, lrs, and (between
//     synchronisations) this rank's weights and momentum; DeepSpeed drops and resets them on
//     load (not bitwise), zerod resumes bitwise.
//
// Deviation, stated: DeepSpeed's first step() call only initialises its buffers (the moments
// take the first gradient and the weights do not move); zerod's first step is a full step, so
// with freeze_step >= the steps run OneBitAdam is bitwise the Adam kernel without bias
// correction. Step numbers here are zerod's (1-based optimizer steps).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/compressed_allreduce.h"
#include "engine/config/onebit_config.h"
#include "model/layout.h"
#include "zero/onebit_bytes.h"
#include "zero/partition.h"

namespace zerod {

enum class OnebitKind { kNone, kAdam, kZeroOneAdam, kLamb };
// "OneBitAdam" -> kAdam, ...; any other type -> kNone.
OnebitKind onebit_kind(const std::string& type);

// One unit's states and gradients as the compressed step sees them (host fp32, n elements each,
// the unit's flat buffer: stage 0 holds it whole).
struct OnebitUnit {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grad = nullptr;  // this rank's own gradients, still multiplied by the loss scale
  int64_t n = 0;
};

// The hyperparameters of one step.
struct OnebitStep {
  int64_t step = 1;  // 1-based, this step's number
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  float grad_scale = 1.0f;  // 1 / loss scale x clipping
};

class OnebitOptimizer {
 public:
  // comm: the data-parallel group the momenta are averaged over. model_parallel (null: none):
  // the pipeline stages' group, over which OneBitLamb's mean momentum scale at the freeze is
  // taken (each stage holds its own units; a last stage's tied embedding copy is left out).
  OnebitOptimizer(OnebitKind kind, const OnebitConfig& cfg, const ParamLayout& layout,
                  const Partition& part, Communicator& comm,
                  Communicator* model_parallel = nullptr);

  OnebitKind kind() const { return kind_; }
  // Whether step `step` is an ordinary step on all-reduced gradients (the warm-up).
  bool reduces_gradients(int64_t step) const;
  // Whether the warm-up steps are this object's (OneBitLamb: LAMB; ZeroOneAdam: all its steps)
  // rather than the engine's Adam kernel's (OneBitAdam).
  bool owns_warmup() const { return kind_ != OnebitKind::kAdam; }
  // ZeroOneAdam between two synchronisations: each rank's weights and momentum are its own
  // (local steps), not rank 0's that a checkpoint's shards hold. A checkpoint captures them
  // (elements [lo, hi) of unit u, before serialize) into the rank's file, and after deserialize
  // restores them (has_rank_states) over what the shards loaded.
  bool keeps_rank_states() const { return kind_ == OnebitKind::kZeroOneAdam && zo_.lrs != 0.0; }
  void capture_rank_states(int u, int64_t lo, int64_t hi, const float* master, const float* m);
  bool has_rank_states() const { return !own_.empty(); }
  void restore_rank_states(int u, int64_t lo, int64_t hi, float* master, float* m) const;
  // One warm-up step (OneBitLamb) on all-reduced gradients: units[u].grad is the sum over the
  // ranks, s.grad_scale includes 1 / world.
  void warmup_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);
  // One step past the warm-up on this rank's local gradients (collective: the compressed
  // all-reduces). units[u] is unit u.
  void compressed_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);

  // This rank's errors, for a checkpoint (a little-endian binary file with a header naming the
  // kind, world, rank and sizes) and back: load refuses another world size or kind (InputError).
  std::string serialize(int64_t step) const;
  void deserialize(const std::string& bytes, const std::string& what);
  // The state every rank holds alike (OneBitLamb: the per-tensor coefficients and v_fresh), for
  // one file of a checkpoint whatever the world size (rank 0 writes it). load refuses another
  // kind or model (InputError).
  // OneBitLamb's frozen lamb coefficients (DeepSpeed's lamb_coeff_freeze), [unit][tensor].
  std::vector<std::vector<double>> lamb_coeff_freeze() const;
  bool has_shared_state() const { return kind_ == OnebitKind::kLamb; }
  std::string serialize_shared() const;
  void deserialize_shared(const std::string& bytes, const std::string& what);

 private:
  // Zeroes m outside the tensors of unit u (the mask).
  void mask(int u, float* m) const;
  void adam_compressed_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);
  void lamb_compressed_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);
  void lamb_freeze(const std::vector<OnebitUnit>& units);  // scaling_t, v_fresh
  // ZeroOneAdam's step, every phase (zero/zeroone_adam.cc), and its part of the rank's file.
  void zeroone_step(const std::vector<OnebitUnit>& units, const OnebitStep& s);
  void zeroone_serialize(std::string& out) const;
  void zeroone_deserialize(onebit_bytes::Reader& in, const std::string& what);

  OnebitKind kind_;
  OnebitConfig cfg_;
  const ParamLayout& layout_;
  const Partition& part_;
  Communicator& comm_;
  Communicator* model_parallel_ = nullptr;
  CompressedAllReduce car_;
  // Per unit: the element ranges [begin, end) that hold real parameters.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> live_;
  std::vector<std::vector<float>> worker_, server_;  // per unit

  // OneBitLamb, per tensor (units' tensors in order) and per unit.
  struct LambTensor {
    double coeff_freeze = 0.0;  // DeepSpeed's lamb_coeff_freeze
    double last_factor = 1.0;
    double scaling = 1.0;  // scaling_coeff (set at the freeze)
  };
  std::vector<std::vector<LambTensor>> lamb_;  // [unit][tensor]
  std::vector<std::vector<float>> fresh_;      // v_fresh per unit (after the freeze)
  bool frozen_ = false;                        // scaling and v_fresh are set
  std::vector<float> last_;                    // m before the step (scratch)

  // ZeroOneAdam (DeepSpeed's per-tensor scalars: the same for every tensor and rank).
  struct ZeroOneCounters {
    int64_t var_interval = 1, var_counter = 0;
    int64_t local_interval = 1, local_counter = 0;
    double lrs = 0.0;            // the lrs summed since the last synchronisation
    bool errors_zeroed = false;  // at the variance freeze (DeepSpeed's reinitial_error_buffer)
  };
  ZeroOneCounters zo_;
  std::vector<std::vector<float>> acc_;  // per unit: DeepSpeed's momentum_accumulator
  std::vector<float> sent_;              // the compressed gradient (scratch)
  // keeps_rank_states: per unit, this rank's weights then momentum (2 x the unit's elements).
  std::vector<std::vector<float>> own_;
};

}  // namespace zerod
