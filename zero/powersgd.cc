#include "zero/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "zero/compute_comm.h"

namespace zerod {

void orthogonalize_columns(float* a, int64_t rows, int cols, double epsilon) {
  for (int i = 0; i < cols; ++i) {
    double ss = 0;
    for (int64_t k = 0; k < rows; ++k) ss += static_cast<double>(a[k * cols + i]) * a[k * cols + i];
    const double norm = std::sqrt(ss) + epsilon;
    for (int64_t k = 0; k < rows; ++k) {
      float& x = a[k * cols + i];
      x = norm > 0 ? static_cast<float>(x / norm) : 0.0f;
    }
    for (int j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k)
        dot += static_cast<double>(a[k * cols + i]) * a[k * cols + j];
      const auto d = static_cast<float>(dot);
      for (int64_t k = 0; k < rows; ++k) a[k * cols + j] -= d * a[k * cols + i];
    }
  }
}

void PowerSgd::random_q(float* q, int64_t m, int r, uint64_t seed, int64_t iteration,
                        int64_t offset) {
  fill_normal(q, m * r, 0.0f, 1.0f, seed, static_cast<uint64_t>(iteration), offset);
}

PowerSgd::PowerSgd(const ParamLayout& layout, const Partition& partition, Backend& backend,
                   Communicator* comm, const PowerSgdOptions& options, MemoryTracker* tracker)
    : be_(backend),
      comm_(comm),
      opt_(options),
      esz_(backend.compute_elem_size()),
      ctype_(compute_comm_type(backend)) {
  ZD_CHECK(opt_.rank >= 1, "PowerSGD rank {}", opt_.rank);
  ZD_CHECK(partition.world_size() == 1, "PowerSGD runs at stage 0 (a world-1 partition)");
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t at = partition.padded_offset(u) + t.offset;
      all_elems_ += t.numel;
      if (t.shape.size() >= 2 && t.numel > 0) {
        Matrix mat;
        mat.at = at;
        mat.rows = t.shape[0];
        mat.cols = t.numel / mat.rows;
        mat.r = static_cast<int>(std::min<int64_t>({opt_.rank, mat.rows, mat.cols}));
        mat.key = (static_cast<int64_t>(layout.global_unit(u)) << 32) + t.offset;
        const auto compressed = static_cast<double>((mat.rows + mat.cols) * mat.r);
        if (compressed * opt_.min_compression_rate < static_cast<double>(mat.rows * mat.cols)) {
          mat.p = p_elems_;
          mat.q = q_elems_;
          mat.e = e_elems_;
          p_elems_ += mat.rows * mat.r;
          q_elems_ += mat.cols * mat.r;
          e_elems_ += mat.rows * mat.cols;
          largest_ = std::max(largest_, mat.rows * mat.cols);
          mats_.push_back(mat);
          continue;
        }
      }
      plain_.push_back(Plain{at, t.numel, plain_elems_});
      plain_elems_ += t.numel;
    }
  }
  auto alloc = [&](int64_t elems, MemCategory c) {
    return elems == 0 ? Buffer() : be_.allocate(static_cast<size_t>(elems) * esz_, c, tracker);
  };
  p_ = alloc(p_elems_, MemCategory::kBuckets);
  qt_ = alloc(q_elems_, MemCategory::kBuckets);
  q_ = alloc(q_elems_, MemCategory::kBuckets);
  packed_ = alloc(plain_elems_, MemCategory::kBuckets);
  approx_ = alloc(largest_, MemCategory::kBuckets);
  if (opt_.use_error_feedback) {
    e_ = alloc(e_elems_, MemCategory::kGradients);
    if (!e_.empty()) be_.memset_zero(e_.data(), e_.bytes());
  }
  q_host_.resize(static_cast<size_t>(q_elems_));
  p_host_.resize(static_cast<size_t>(std::max(p_elems_, q_elems_)));
}

bool PowerSgd::begin_step() {
  const bool compress = iteration_ >= opt_.start_iter;
  ++iteration_;
  return compress;
}

void PowerSgd::to_host(const void* src, float* dst, int64_t n) const {
  const size_t bytes = static_cast<size_t>(n) * esz_;
  if (esz_ == 4) {
    be_.copy(dst, src, bytes);
    return;
  }
  staging_.resize(bytes);
  be_.copy(staging_.data(), src, bytes);
  const auto* h = reinterpret_cast<const uint16_t*>(staging_.data());
  const bool bf16 = be_.compute_dtype() == DType::kBF16;
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16 ? bf16_bits_to_f32(h[i]) : f16_bits_to_f32(h[i]);
}

void PowerSgd::from_host(const float* src, void* dst, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * esz_;
  if (esz_ == 4) {
    be_.copy(dst, src, bytes);
    be_.round_to_compute(dst, n);  // (16-bit values kept in fp32 storage)
    return;
  }
  staging_.resize(bytes);
  auto* h = reinterpret_cast<uint16_t*>(staging_.data());
  const bool bf16 = be_.compute_dtype() == DType::kBF16;
  for (int64_t i = 0; i < n; ++i) h[i] = bf16 ? f32_to_bf16_bits(src[i]) : f32_to_f16_bits(src[i]);
  be_.copy(dst, staging_.data(), bytes);
}

void PowerSgd::reduce(void* full) {
  const int world = comm_->size();
  // The uncompressed tensors, packed into one all-reduce that runs while the matrices compute.
  for (const Plain& t : plain_)
    be_.copy(el(packed_.data(), t.packed), el(full, t.at), static_cast<size_t>(t.numel) * esz_);
  WorkPtr plain_work;
  if (plain_elems_ > 0)
    plain_work = comm_->all_reduce_async(packed_.data(), plain_elems_, ctype_, ReduceOp::kSum);

  if (!mats_.empty()) {
    // Q: last step's (warm start) or drawn, orthogonalised; sent as Qt (r, m) per matrix.
    const bool draw = !opt_.warm_start || !q_ready_;
    for (const Matrix& m : mats_) {
      float* q = q_host_.data() + m.q;
      if (draw) random_q(q, m.cols, m.r, opt_.random_seed, iteration_, m.key);
      orthogonalize_columns(q, m.cols, m.r, opt_.orthogonalization_epsilon);
      float* qt = p_host_.data() + m.q;
      for (int64_t j = 0; j < m.cols; ++j)
        for (int k = 0; k < m.r; ++k) qt[k * m.cols + j] = q[j * m.r + k];
    }
    q_ready_ = true;
    from_host(p_host_.data(), qt_.data(), q_elems_);
    // P (n, r) = (M + E) Q, summed over ranks, orthogonalised.
    for (const Matrix& m : mats_) {
      void* mat = el(full, m.at);
      if (opt_.use_error_feedback)
        be_.residual_forward(mat, mat, el(e_.data(), m.e), m.rows * m.cols);  // M += E
      be_.matmul_forward(el(p_.data(), m.p), mat, el(qt_.data(), m.q), nullptr, m.rows,
                         static_cast<int>(m.cols), m.r);
    }
    comm_->all_reduce(p_.data(), p_elems_, ctype_, ReduceOp::kSum);
    to_host(p_.data(), p_host_.data(), p_elems_);
    for (const Matrix& m : mats_)
      orthogonalize_columns(p_host_.data() + m.p, m.rows, m.r, opt_.orthogonalization_epsilon);
    from_host(p_host_.data(), p_.data(), p_elems_);
    // Qt (r, m) = P^T M, summed over ranks; Q = Qt^T / world (the warm start of the next step).
    be_.memset_zero(qt_.data(), qt_.bytes());
    for (const Matrix& m : mats_) {
      void* qt = el(qt_.data(), m.q);
      be_.matmul_backward(nullptr, qt, nullptr, el(p_.data(), m.p), el(full, m.at), qt, m.rows,
                          static_cast<int>(m.cols), m.r, false);
    }
    comm_->all_reduce(qt_.data(), q_elems_, ctype_, ReduceOp::kSum);
    to_host(qt_.data(), p_host_.data(), q_elems_);
    const float inv_world = 1.0f / static_cast<float>(world);
    for (const Matrix& m : mats_) {
      const float* qt = p_host_.data() + m.q;
      float* q = q_host_.data() + m.q;
      for (int64_t j = 0; j < m.cols; ++j)
        for (int k = 0; k < m.r; ++k) q[j * m.r + k] = qt[k * m.cols + j] * inv_world;
    }
    from_host(q_host_.data(), q_.data(), q_elems_);
    // A (n, m) = P Q^T, the approximate mean; E = M - A; M = world A (a sum, as the reducer's).
    for (const Matrix& m : mats_) {
      void* mat = el(full, m.at);
      const int64_t n = m.rows * m.cols;
      be_.matmul_forward(approx_.data(), el(p_.data(), m.p), el(q_.data(), m.q), nullptr, m.rows,
                         m.r, static_cast<int>(m.cols));
      if (opt_.use_error_feedback) {
        be_.scale(approx_.data(), -1.0f, n);
        be_.residual_forward(el(e_.data(), m.e), mat, approx_.data(), n);  // E = M - A
        be_.copy(mat, approx_.data(), static_cast<size_t>(n) * esz_);
        be_.scale(mat, -static_cast<float>(world), n);
      } else {
        be_.copy(mat, approx_.data(), static_cast<size_t>(n) * esz_);
        be_.scale(mat, static_cast<float>(world), n);
      }
    }
  }
  if (plain_work) {
    plain_work->wait();
    for (const Plain& t : plain_)
      be_.copy(el(full, t.at), el(packed_.data(), t.packed), static_cast<size_t>(t.numel) * esz_);
  }
}

PowerSgdState PowerSgd::state() const {
  PowerSgdState s;
  s.iteration = iteration_;
  s.q_ready = q_ready_;
  s.q = q_host_;
  if (!e_.empty()) {
    s.error.resize(static_cast<size_t>(e_elems_));
    to_host(e_.data(), s.error.data(), e_elems_);
  }
  return s;
}

void PowerSgd::set_state(const PowerSgdState& s) {
  ZD_CHECK_INPUT(s.q.size() == q_host_.size(),
                 "PowerSGD state: {} Q elements, this model and rank need {}", s.q.size(),
                 q_host_.size());
  ZD_CHECK_INPUT(s.error.size() == (e_.empty() ? 0 : static_cast<size_t>(e_elems_)),
                 "PowerSGD state: {} error elements, this model and use_error_feedback need {}",
                 s.error.size(), e_.empty() ? 0 : e_elems_);
  iteration_ = s.iteration;
  q_ready_ = s.q_ready;
  q_host_ = s.q;
  if (!e_.empty()) from_host(s.error.data(), e_.data(), e_elems_);
}

void PowerSgd::restart_at(int64_t iteration) {
  iteration_ = iteration;
  q_ready_ = false;
  if (!e_.empty()) be_.memset_zero(e_.data(), e_.bytes());
}

}  // namespace zerod
