// Shared helpers of the CUDA backend tests: the CPU reference and the CUDA backend of one compute
// dtype side by side, device copies of host vectors, NaN-poisoned outputs, and the error metric.
//
// Metric: max_i |got[i] - want[i]| / max_i |want[i]| (the max-norm relative error of the whole
// tensor), with the CPU backend's result as `want`; any non-finite value in `got` where `want`
// is finite fails. Limits: 1e-5 for fp32, 1e-2 for bf16/fp16 (one 16-bit rounding of outputs
// that the CPU reference keeps in fp32). Inputs are rounded to the compute dtype first, so both
// backends see identical values.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/memory.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/cuda_backend.h"

namespace zerod::test {

using VecF = std::vector<float>;
using VecI = std::vector<int32_t>;

inline constexpr DType kAllDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

inline double tolerance(DType dt) {
  return dt == DType::kF32 ? 1e-5 : 1e-2;
}

// n floats ~ N(mean, stddev) from `seed`.
inline VecF randn(int64_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  VecF v(static_cast<size_t>(n));
  fill_normal(v.data(), n, mean, stddev, seed, /*stream=*/0);
  return v;
}

// n ints uniform in [lo, hi).
inline VecI randi(int64_t n, uint64_t seed, int lo, int hi) {
  Rng rng(seed, 3);
  VecI v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + static_cast<int>(rng.uniform(static_cast<uint64_t>(hi - lo)));
  return v;
}

// The CPU reference and the CUDA backend of one compute dtype.
struct Backends {
  explicit Backends(DType dt) : dtype(dt), cpu(make_cpu_backend(dt)), gpu(make_cuda_backend(dt)) {}

  // x rounded to the compute dtype: the values both backends then hold exactly.
  VecF round(VecF x) const {
    cpu->round_to_compute(x.data(), static_cast<int64_t>(x.size()));
    return x;
  }

  // Device tensors of the CUDA backend holding x (compute dtype / fp32 / int32).
  Buffer compute(const VecF& x) {
    Buffer b =
        gpu->allocate(x.size() * gpu->compute_elem_size(), MemCategory::kActivations, nullptr);
    gpu->cast_to_compute(b.data(), x.data(), static_cast<int64_t>(x.size()));
    return b;
  }
  Buffer f32(const VecF& x) {
    Buffer b = gpu->allocate(x.size() * sizeof(float), MemCategory::kActivations, nullptr);
    gpu->copy(b.data(), x.data(), x.size() * sizeof(float));
    return b;
  }
  Buffer i32(const VecI& x) {
    Buffer b = gpu->allocate(x.size() * sizeof(int32_t), MemCategory::kActivations, nullptr);
    gpu->copy(b.data(), x.data(), x.size() * sizeof(int32_t));
    return b;
  }

  // Device tensors filled with 0xFF bytes (NaN in fp32, bf16 and fp16): an element a kernel
  // forgets to write stays NaN.
  Buffer poisoned(size_t bytes) {
    Buffer b = gpu->allocate(bytes, MemCategory::kActivations, nullptr);
    gpu->synchronize();  // the allocation's zeroing runs on the backend's stream
    cuda::check(cudaMemset(b.data(), 0xFF, bytes), "cudaMemset");
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return b;
  }
  Buffer poisoned_compute(int64_t n) {
    return poisoned(static_cast<size_t>(n) * gpu->compute_elem_size());
  }
  Buffer poisoned_f32(int64_t n) { return poisoned(static_cast<size_t>(n) * sizeof(float)); }

  // Host copies (fp32) of device tensors; wait for the backend's queued work first.
  VecF read_compute(const Buffer& b, int64_t n) {
    VecF out(static_cast<size_t>(n));
    gpu->cast_from_compute(out.data(), b.data(), n);
    gpu->synchronize();
    return out;
  }
  VecF read_f32(const Buffer& b, int64_t n) {
    VecF out(static_cast<size_t>(n));
    gpu->copy(out.data(), b.data(), static_cast<size_t>(n) * sizeof(float));
    gpu->synchronize();
    return out;
  }

  DType dtype;
  std::unique_ptr<Backend> cpu, gpu;
};

// See the metric at the top of this file.
inline ::testing::AssertionResult close(const VecF& got, const VecF& want, double tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  double num = 0.0, den = 1e-30;
  size_t worst = 0, bad = 0, first_bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(want[i]) && !std::isfinite(got[i])) {
      if (bad++ == 0) first_bad = i;
      continue;
    }
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (d > num) {
      num = d;
      worst = i;
    }
    den = std::max(den, std::fabs(static_cast<double>(want[i])));
  }
  if (bad > 0) {
    return ::testing::AssertionFailure()
           << bad << " non-finite values, the first at " << first_bad << " (got " << got[first_bad]
           << ", want " << want[first_bad] << ")";
  }
  const double err = num / den;
  if (err > tol) {
    return ::testing::AssertionFailure()
           << "max-relative error " << err << " > " << tol << ", worst at " << worst << ": got "
           << got[worst] << ", want " << want[worst];
  }
  return ::testing::AssertionSuccess() << "max-relative error " << err;
}

}  // namespace zerod::test
