// Shared helpers of the kernel tests: random data, central finite differences in double,
// error norms, bitwise comparison and an OpenMP thread-count guard.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/rng.h"

namespace zerod::test {

using VecD = std::vector<double>;
using VecF = std::vector<float>;

// n floats ~ N(mean, stddev) from (seed, stream).
inline VecF randn(int64_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  VecF v(static_cast<size_t>(n));
  fill_normal(v.data(), n, mean, stddev, seed, /*stream=*/0);
  return v;
}

// n floats uniform in [lo, hi).
inline VecF randu(int64_t n, uint64_t seed, float lo, float hi) {
  Rng rng(seed, 1);
  VecF v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * static_cast<float>(rng.uniform01());
  return v;
}

inline VecD to_double(const VecF& v) {
  return VecD(v.begin(), v.end());
}

// All of [0, n) when n <= max_count, otherwise max_count distinct indices drawn at random
// (sorted), always including the first and the last.
inline std::vector<size_t> sample_indices(size_t n, size_t max_count, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (n <= max_count) return idx;
  Rng rng(seed, 2);
  for (size_t i = n - 1; i > 0; --i) std::swap(idx[i], idx[rng.uniform(i + 1)]);
  idx.resize(max_count);
  idx.push_back(0);
  idx.push_back(n - 1);
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

// d f / d x[i] for i in idx by central differences (step h), in double.
inline VecD fd_gradient(const std::function<double(const VecD&)>& f, VecD x,
                        const std::vector<size_t>& idx, double h = 1e-5) {
  VecD g(x.size(), 0.0);
  for (size_t i : idx) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

// sum(w * out), the scalar objective whose gradient the backward tests check.
inline double dot(const VecD& w, const VecD& out) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * out[i];
  return s;
}

// max_i |got[i] - want[i]| / max_i |want[i]| over idx (all when idx is empty); the scale is
// floored at 1e-30 so an all-zero reference still yields a finite error.
template <class G>
double rel_err(const G& got, const VecD& want, const std::vector<size_t>& idx = {}) {
  double num = 0.0, den = 1e-30;
  auto visit = [&](size_t i) {
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  };
  if (idx.empty()) {
    for (size_t i = 0; i < want.size(); ++i) visit(i);
  } else {
    for (size_t i : idx) visit(i);
  }
  return num / den;
}

// got - base, element-wise in double (the increment an accumulating (+=) kernel added).
inline VecD minus(const VecF& got, const VecF& base) {
  VecD d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = static_cast<double>(got[i]) - base[i];
  return d;
}

inline bool bitwise_equal(const VecF& a, const VecF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Sets the OpenMP thread count for a scope and restores it afterwards.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// Runs `fn` with 1 and with 2 OpenMP threads and returns both results.
template <class Fn>
auto with_1_and_2_threads(Fn fn) {
  decltype(fn()) one, two;
  {
    OmpThreads t(1);
    one = fn();
  }
  {
    OmpThreads t(2);
    two = fn();
  }
  return std::make_pair(one, two);
}

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace zerod::test
