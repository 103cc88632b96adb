// ZeRO model states of one rank: compute-dtype weights, gradients, fp32 master weights and Adam
// moments for every unit, laid out per Partition, and the optimizer step over them.
//
// It is the model's ParamSource (weights per unit) and GradSink (gradients per unit). This
// version holds one rank (world size 1, stage 0: everything resident); the distributed stages
// keep this interface and change what stays resident.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "zero/partition.h"

namespace zerod {

struct ZeroOptions {
  int stage = 0;
  int world_size = 1;
  int rank = 0;
};

// Hyper-parameters of one optimizer step.
struct OptimStep {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // applied to 2-D weights only (matmuls and embeddings)
  bool adam_w_mode = true;
  bool bias_correction = true;
  double loss_scale = 1.0;     // gradients are divided by it
  double max_grad_norm = 0.0;  // gradient_clipping; 0: off
};

struct StepResult {
  bool overflow = false;   // inf/NaN in the gradients: step skipped
  double grad_norm = 0.0;  // global L2 norm of the unscaled gradients, before clipping
  double clip_coef = 1.0;  // factor applied by clipping (1: none)
};

class ZeroEngine : public ParamSource, public GradSink {
 public:
  ZeroEngine(const ParamLayout& layout, Backend& backend, const ZeroOptions& options,
             MemoryTracker* tracker);

  // Master weights from the GPT-2 initialisation for seed; compute weights from the master.
  void init_weights(uint64_t seed);
  // Zeroes the gradient buffers (start of a gradient-accumulation window).
  void zero_grad();
  // Unscale, overflow check, global norm, clip, AdamW on this rank's shard, refresh the compute
  // weights. On overflow nothing is updated and the Adam step count does not advance.
  StepResult step(const OptimStep& s);
  int64_t adam_steps() const { return adam_steps_; }

  // ParamSource
  const void* acquire(int unit) override;
  void release(int unit) override;
  // GradSink
  void* grad_buffer(int unit) override;
  void unit_done(int unit) override;

  const Partition& partition() const { return partition_; }
  const ParamLayout& layout() const { return layout_; }
  // This rank's fp32 master shard of unit u, and its Adam moments.
  float* master(int u) { return master_.at(static_cast<size_t>(u)).as<float>(); }
  float* exp_avg(int u) { return m_.at(static_cast<size_t>(u)).as<float>(); }
  float* exp_avg_sq(int u) { return v_.at(static_cast<size_t>(u)).as<float>(); }
  void* weights(int u) { return weights_.at(static_cast<size_t>(u)).data(); }
  void* grads(int u) { return grads_.at(static_cast<size_t>(u)).data(); }
  // Refreshes the compute weights from the master (after loading a checkpoint).
  void refresh_weights();

 private:
  const ParamLayout& layout_;
  Backend& be_;
  ZeroOptions opt_;
  Partition partition_;
  std::vector<Buffer> weights_, grads_, master_, m_, v_;
  int64_t adam_steps_ = 0;
};

}  // namespace zerod
