// The bodies of optim_simd.h's spans over a vector type V (V512 in optim_simd_avx512.cc, V256 in
// optim_simd_avx2.cc, each including this file inside its ISA's target region: the templates are
// instantiated only there, with one V each). V has: kWidth, type `T`, set1, load, store, add,
// mul, div, sqrt, fmadd(a, b, c) = a * b + c rounded once, sign(x) = 1, -1 or 0 (0 for 0 and
// NaN, as lion_element). Not a public header.
#pragma once

#include <cstdint>

#include "kernels/cpu/lamb.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/optim_simd.h"

namespace zerod::cpu::optim_simd {
namespace {  // instantiated in one translation unit per ISA

template <class V, SgdVariant kVariant>
int64_t sgd(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k) {
  using T = typename V::T;
  const T scale = V::set1(k.grad_scale), wd = V::set1(k.weight_decay), neg_lr = V::set1(k.neg_lr);
  const T mom = V::set1(k.momentum), omd = V::set1(k.one_minus_dampening);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    T p = V::load(master + i);
    T g = V::fmadd(wd, p, V::mul(V::load(grad + i), scale));
    if constexpr (kVariant != SgdVariant::kPlain) {
      const T b = k.first ? g : V::fmadd(omd, g, V::mul(V::load(m + i), mom));
      V::store(m + i, b);
      g = kVariant == SgdVariant::kNesterov ? V::fmadd(mom, b, g) : b;
    }
    p = V::fmadd(neg_lr, g, p);
    V::store(master + i, p);
  }
  return i;
}

template <class V>
int64_t sgd_any(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k,
                SgdVariant variant) {
  switch (variant) {
    case SgdVariant::kPlain:
      return sgd<V, SgdVariant::kPlain>(master, m, grad, n, k);
    case SgdVariant::kMomentum:
      return sgd<V, SgdVariant::kMomentum>(master, m, grad, n, k);
    case SgdVariant::kNesterov:
      return sgd<V, SgdVariant::kNesterov>(master, m, grad, n, k);
  }
  return 0;
}

template <class V>
int64_t adagrad(float* master, float* v, const float* grad, int64_t n, const OptimConstants& k) {
  using T = typename V::T;
  const T scale = V::set1(k.grad_scale), wd = V::set1(k.weight_decay);
  const T neg_clr = V::set1(k.neg_clr), eps = V::set1(k.eps), init = V::set1(k.initial_value);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const T p = V::load(master + i);
    const T g = V::fmadd(wd, p, V::mul(V::load(grad + i), scale));
    const T sum = V::fmadd(g, g, k.first ? init : V::load(v + i));
    V::store(v + i, sum);
    const T denom = V::add(V::sqrt(sum), eps);
    V::store(master + i, V::add(p, V::div(V::mul(neg_clr, g), denom)));
  }
  return i;
}

template <class V>
int64_t lion(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k) {
  using T = typename V::T;
  const T scale = V::set1(k.grad_scale), decay = V::set1(k.decay), neg_lr = V::set1(k.neg_lr);
  const T b1 = V::set1(k.beta1), omb1 = V::set1(k.one_minus_beta1);
  const T b2 = V::set1(k.beta2), omb2 = V::set1(k.one_minus_beta2);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const T g = V::mul(V::load(grad + i), scale);
    const T mm = V::load(m + i);
    const T p = V::mul(V::load(master + i), decay);
    const T c = V::fmadd(omb1, g, V::mul(mm, b1));
    V::store(master + i, V::fmadd(neg_lr, V::sign(c), p));
    V::store(m + i, V::fmadd(omb2, g, V::mul(mm, b2)));
  }
  return i;
}

// lamb_direction: m / denom + wd * p (separate roundings).
template <class V>
typename V::T lamb_u(typename V::T p, typename V::T m, typename V::T v, const LambConstants& k) {
  const typename V::T eps = V::set1(k.eps);
  const typename V::T denom = k.eps_inside_sqrt ? V::sqrt(V::add(v, eps)) : V::add(V::sqrt(v), eps);
  return V::add(V::div(m, denom), V::mul(V::set1(k.weight_decay), p));
}

template <class V>
int64_t lamb_moments(const float* master, float* m, float* v, const float* grad, float* u,
                     int64_t n, const LambConstants& k) {
  using T = typename V::T;
  const T scale = V::set1(k.grad_scale);
  const T b1 = V::set1(k.beta1), omb1 = V::set1(k.one_minus_beta1);
  const T b2 = V::set1(k.beta2), omb2 = V::set1(k.one_minus_beta2);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const T g = V::mul(V::load(grad + i), scale);
    const T mm = V::add(V::mul(b1, V::load(m + i)), V::mul(omb1, g));
    const T vv = V::add(V::mul(b2, V::load(v + i)), V::mul(V::mul(omb2, g), g));
    V::store(m + i, mm);
    V::store(v + i, vv);
    V::store(u + i, lamb_u<V>(V::load(master + i), mm, vv, k));
  }
  return i;
}

template <class V>
int64_t lamb_apply(float* master, const float* m, const float* v, int64_t n, float scaled,
                   const LambConstants& k) {
  using T = typename V::T;
  const T s = V::set1(scaled);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const T p = V::load(master + i);
    V::store(master + i, V::sub(p, V::mul(s, lamb_u<V>(p, V::load(m + i), V::load(v + i), k))));
  }
  return i;
}

template <class V>
constexpr Spans spans() {
  return Spans{&sgd_any<V>, &adagrad<V>, &lion<V>, &lamb_moments<V>, &lamb_apply<V>};
}

}  // namespace
}  // namespace zerod::cpu::optim_simd
