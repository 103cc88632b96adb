#include "model/model_base.h"

#include "core/error.h"
#include "model/op_timing.h"

namespace zerod {

ModelBase::ModelBase(const ModelSpec& spec, Backend& backend, int B, int T,
                     bool activation_checkpointing, MemoryTracker* tracker)
    : layout_(spec),
      be_(backend),
      B_(B),
      T_(T),
      checkpointing_(activation_checkpointing),
      rounding_(backend.compute_dtype() != DType::kF32 &&
                backend.compute_elem_size() == sizeof(float)),
      esz_(backend.compute_elem_size()),
      tracker_(tracker) {
  const ModelSpec& s = layout_.spec();
  ZD_CHECK(B > 0 && T > 0 && T <= s.seq_len, "micro-batch {}x{} (seq_len {})", B, T, s.seq_len);
  const size_t N = static_cast<size_t>(B) * T;
  logits_ = act(N * static_cast<size_t>(s.vp()));
  losses_ = stat(N);
  tokens_ = reinterpret_cast<int32_t*>(stat(N));  // (4-byte elements, as floats)
  targets_ = reinterpret_cast<int32_t*>(stat(N));
  host_losses_.resize(N);
}

int64_t ModelBase::base_activation_bytes(const ModelSpec& s, int B, int T, size_t esz) {
  const int64_t N = int64_t{B} * T;
  return N * (s.vp() * static_cast<int64_t>(esz) + 3 * 4);
}

void* ModelBase::act(size_t elems) {
  buffers_.push_back(be_.allocate(elems * esz_, MemCategory::kActivations, tracker_));
  return buffers_.back().data();
}

float* ModelBase::stat(size_t elems) {
  buffers_.push_back(be_.allocate(elems * sizeof(float), MemCategory::kActivations, tracker_));
  return buffers_.back().as<float>();
}

void ModelBase::round(void* x, int64_t n) {
  if (rounding_) timed(timer(), times_.rounding, [&] { be_.round_to_compute(x, n); });
}

void ModelBase::upload(const int32_t* inputs, const int32_t* targets) {
  const size_t bytes = static_cast<size_t>(B_) * T_ * sizeof(int32_t);
  be_.copy(tokens_, inputs, bytes);
  be_.copy(targets_, targets, bytes);
}

float ModelBase::mean_loss(const int32_t* targets) {
  const int64_t N = int64_t{B_} * T_;
  be_.copy(host_losses_.data(), losses_, static_cast<size_t>(N) * sizeof(float));
  double sum = 0;
  int n = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    sum += host_losses_[static_cast<size_t>(i)];
    ++n;
  }
  return n > 0 ? static_cast<float>(sum / n) : 0.0f;
}

float ModelBase::loss_gradient(const int32_t* targets, float loss_weight) const {
  const int64_t N = int64_t{B_} * T_;
  int valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += targets[i] >= 0;
  return valid > 0 ? loss_weight / static_cast<float>(valid) : 0.0f;
}

void ModelBase::forward_phase_done() {
  if (phase_clock_ == nullptr) return;
  be_.synchronize();
  forward_wall_ = phase_clock_->seconds();
  forward_seam_ = *phase_seam_;
}

void ModelBase::read_logits(float* out) {
  be_.cast_from_compute(out, logits_, int64_t{B_} * T_ * layout_.spec().vp());
}

float ModelBase::forward_backward(const int32_t* inputs, const int32_t* targets,
                                  ParamSource& params, GradSink& grads, float loss_weight) {
  if (!timing_) return forward_backward_impl(inputs, targets, params, grads, loss_weight);
  double seam = 0;
  TimedParams timed_params(params, seam);
  TimedGrads timed_grads(grads, seam);
  Stopwatch sw;
  phase_seam_ = &seam;
  phase_clock_ = &sw;
  forward_seam_ = forward_wall_ = -1;
  const float loss = forward_backward_impl(inputs, targets, timed_params, timed_grads, loss_weight);
  const double wall = sw.seconds();
  times_.forward += forward_wall_ - forward_seam_;
  times_.backward += (wall - forward_wall_) - (seam - forward_seam_);
  times_.zero_wait += seam;
  phase_seam_ = nullptr;
  phase_clock_ = nullptr;
  return loss;
}

}  // namespace zerod
