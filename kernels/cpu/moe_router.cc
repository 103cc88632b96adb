#include "kernels/cpu/moe_router.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

namespace {

// Rows of the router per OpenMP task: the router is O(N * E * k) with E and k small, so only
// large token counts are worth a parallel region.
bool parallel_rows(int64_t N, int E) {
  return N * E >= kParallelMinElems;
}

// The k largest of x (E), most probable first, equal values to the lower index; written to
// out (k). O(k * E): E is at most a few hundred.
void top_k_row(int32_t* out, const float* x, int E, int k) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= out[i] == e;
      if (taken) continue;
      if (best < 0 || x[e] > x[best]) best = e;  // strict: the lower index keeps a tie
    }
    out[j] = best;
  }
}

// Drops the assignments beyond `capacity` per expert in the policy's order (expert set to -1).
void drop_over_capacity(int32_t* expert, const float* probs, int64_t N, int E, int k,
                        int64_t capacity, MoeDropPolicy policy) {
  std::vector<int64_t> taken(static_cast<size_t>(E), 0);
  auto visit = [&](int64_t n, int j) {
    int32_t& e = expert[n * k + j];
    if (taken[static_cast<size_t>(e)]++ >= capacity) e = -1;
  };
  switch (policy) {
    case MoeDropPolicy::kPosition:
      for (int64_t n = 0; n < N; ++n)
        for (int j = 0; j < k; ++j) visit(n, j);
      return;
    case MoeDropPolicy::kChoiceRank:
      for (int j = 0; j < k; ++j)
        for (int64_t n = 0; n < N; ++n) visit(n, j);
      return;
    case MoeDropPolicy::kProbs: {
      // Per expert its candidate slots (token order), then the `capacity` most probable kept.
      std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
      for (int64_t s = 0; s < N * k; ++s) slots[static_cast<size_t>(expert[s])].push_back(s);
      for (int e = 0; e < E; ++e) {
        auto& c = slots[static_cast<size_t>(e)];
        if (static_cast<int64_t>(c.size()) <= capacity) continue;
        auto more_probable = [&](int64_t a, int64_t b) {
          const float pa = probs[(a / k) * E + e], pb = probs[(b / k) * E + e];
          return pa != pb ? pa > pb : a < b;  // slots of one expert: a < b iff token a < b
        };
        std::nth_element(c.begin(), c.begin() + capacity, c.end(), more_probable);
        for (auto it = c.begin() + capacity; it != c.end(); ++it) expert[*it] = -1;
      }
      return;
    }
  }
  ZD_THROW("unknown MoE drop policy {}", static_cast<int>(policy));
}

// The renormalisation's denominator: the sum of the token's kept probabilities, clamped below at
// FLT_EPSILON (DeepSpeed's torch.clamp(min=finfo.eps)); `clamped` says the clamp is active (its
// gradient is then 0, as torch's).
double kept_sum(const float* p, const int32_t* ex, int k, bool* clamped) {
  double s = 0.0;
  for (int j = 0; j < k; ++j)
    if (ex[j] >= 0) s += p[ex[j]];
  *clamped = !(s >= FLT_EPSILON);
  return *clamped ? FLT_EPSILON : s;
}

}  // namespace

void validate(const MoeRouterOptions& o) {
  ZD_CHECK_INPUT(o.num_experts >= 1, "moe: num_experts {} must be >= 1", o.num_experts);
  ZD_CHECK_INPUT(o.top_k >= 1 && o.top_k <= o.num_experts,
                 "moe: top_k {} must be in [1, num_experts = {}]", o.top_k, o.num_experts);
  ZD_CHECK_INPUT(!o.drop_tokens || o.capacity_factor > 0.0,
                 "moe: capacity_factor {} must be > 0 when tokens are dropped", o.capacity_factor);
  ZD_CHECK_INPUT(o.min_capacity >= 0, "moe: min_capacity {} must be >= 0", o.min_capacity);
}

int64_t moe_capacity(int64_t N, const MoeRouterOptions& o) {
  validate(o);
  // torch: (python float N / E) * fp32 tensor (capacity_factor * k) -> fp32 product, ceil.
  const float tokens_per_expert = static_cast<float>(static_cast<double>(N) / o.num_experts);
  const float factor = static_cast<float>(o.capacity_factor * o.top_k);
  const float product = tokens_per_expert * factor;
  const auto capacity = static_cast<int64_t>(std::ceil(product));
  return std::max(capacity, o.min_capacity);
}

namespace {

// The aux loss's factor beyond E / T^2 (DeepSpeed's topkgating divides by k).
double aux_scale(const MoeRouterOptions& o) {
  return o.aux_loss == MoeAuxLoss::kDeepSpeed && o.top_k > 2 ? 1.0 / o.top_k : 1.0;
}

}  // namespace

double moe_load_balancing_loss(const int64_t* aux_counts, const double* prob_sum, int64_t T,
                               const MoeRouterOptions& o) {
  if (T == 0) return 0.0;
  const int E = o.num_experts;
  double s = 0.0;
  for (int e = 0; e < E; ++e) s += static_cast<double>(aux_counts[e]) * prob_sum[e];
  return aux_scale(o) * static_cast<double>(E) * s /
         (static_cast<double>(T) * static_cast<double>(T));
}

MoeRouterStats moe_router_forward(float* probs, float* lse, int32_t* expert, float* weight,
                                  int64_t* aux_counts, int64_t* kept, double* prob_sum,
                                  const float* logits, int64_t N, const MoeRouterOptions& o) {
  validate(o);
  ZD_CHECK(N >= 0, "moe_router_forward: N {} < 0", N);
  const int E = o.num_experts, k = o.top_k;

  // Softmax, logsumexp and the top-k of each row.
#pragma omp parallel for schedule(static) if (parallel_rows(N, E))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * E;
    float* p = probs + n * E;
    // In double, rounded once: E exps per token are nothing next to the experts' matmuls.
    double* q = reinterpret_cast<double*>(thread_scratch(2 * static_cast<size_t>(E)));
    float m = x[0];
    for (int e = 1; e < E; ++e) m = std::max(m, x[e]);
    double s = 0.0;
    for (int e = 0; e < E; ++e) {
      q[e] = std::exp(static_cast<double>(x[e]) - m);
      s += q[e];
    }
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(q[e] / s);
    lse[n] = static_cast<float>(m + std::log(s));
    top_k_row(expert + n * k, x, E, k);
  }

  MoeRouterStats st;
  // The aux loss's counts: DeepSpeed's top-2 counts first choices only.
  const int counted = o.aux_loss == MoeAuxLoss::kDeepSpeed && k == 2 ? 1 : k;
  std::fill(aux_counts, aux_counts + E, int64_t{0});
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < counted; ++j) ++aux_counts[expert[n * k + j]];
  // Per-expert probability sums and the z-loss, in double, in token order (thread-count
  // independent; O(N * E), small next to the experts' matmuls).
  std::vector<double> psum(static_cast<size_t>(E), 0.0);
  double z = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) psum[static_cast<size_t>(e)] += probs[n * E + e];
    z += static_cast<double>(lse[n]) * lse[n];
  }
  if (prob_sum != nullptr) std::copy(psum.begin(), psum.end(), prob_sum);
  st.aux_loss = moe_load_balancing_loss(aux_counts, psum.data(), N, o);
  st.z_loss = N > 0 ? z / static_cast<double>(N) : 0.0;

  if (o.drop_tokens) {
    st.capacity = moe_capacity(N, o);
    drop_over_capacity(expert, probs, N, E, k, st.capacity, o.drop_policy);
  }

  std::fill(kept, kept + E, int64_t{0});
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* ex = expert + n * k;
    const float* p = probs + n * E;
    bool clamped = false;
    const double denom = o.renormalize ? kept_sum(p, ex, k, &clamped) : 1.0;
    for (int j = 0; j < k; ++j) {
      if (ex[j] < 0) {
        weight[n * k + j] = 0.0f;
        ++st.dropped;
        continue;
      }
      ++kept[ex[j]];
      weight[n * k + j] = o.renormalize ? static_cast<float>(p[ex[j]] / denom) : p[ex[j]];
    }
  }
  return st;
}

void moe_router_backward(float* dlogits, const float* dweight, const float* probs, const float* lse,
                         const int32_t* expert, int64_t N, const MoeRouterOptions& o,
                         const MoeRouterLossGrad& loss) {
  validate(o);
  const int E = o.num_experts, k = o.top_k;
  ZD_CHECK(loss.aux_coef == 0.0f || loss.aux_counts != nullptr,
           "moe_router_backward: an aux loss coefficient {} needs the counts", loss.aux_coef);
  ZD_CHECK(loss.aux_tokens >= N || loss.aux_coef == 0.0f,
           "moe_router_backward: the aux loss over {} rows cannot hold this layer's {}",
           loss.aux_tokens, N);
  // d aux / d probs[n, e] = scale * E * counts[e] / T^2, the same for every token (aux = 0 at
  // T = 0).
  std::vector<double> daux(static_cast<size_t>(E), 0.0);
  if (loss.aux_coef != 0.0f && loss.aux_tokens > 0) {
    const double T = static_cast<double>(loss.aux_tokens);
    for (int e = 0; e < E; ++e)
      daux[static_cast<size_t>(e)] = loss.aux_coef * aux_scale(o) * static_cast<double>(E) *
                                     static_cast<double>(loss.aux_counts[e]) / (T * T);
  }
  const int64_t zt = loss.z_tokens > 0 ? loss.z_tokens : N;
  ZD_CHECK(zt >= N, "moe_router_backward: the z-loss over {} rows cannot hold this layer's {}", zt,
           N);
  const double dz_scale = zt > 0 ? 2.0 * loss.z_coef / static_cast<double>(zt) : 0.0;

  // Per row in double (E values: the cancellation in the softmax backward then costs nothing).
#pragma omp parallel for schedule(static) if (parallel_rows(N, E))
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    const int32_t* ex = expert + n * k;
    double* g = reinterpret_cast<double*>(thread_scratch(2 * static_cast<size_t>(E)));
    // g holds d objective / d probs first.
    for (int e = 0; e < E; ++e) g[e] = daux[static_cast<size_t>(e)];
    if (dweight != nullptr) {
      const float* dw = dweight + n * k;
      if (o.renormalize) {
        // w_j = p_j / S over the kept slots: dp_j = (dw_j - sum_i dw_i w_i) / S (no S term when
        // the clamp holds S at FLT_EPSILON).
        bool clamped = false;
        const double S = kept_sum(p, ex, k, &clamped);
        double dot = 0.0;
        if (!clamped)
          for (int j = 0; j < k; ++j)
            if (ex[j] >= 0) dot += static_cast<double>(dw[j]) * (p[ex[j]] / S);
        for (int j = 0; j < k; ++j)
          if (ex[j] >= 0) g[ex[j]] += (dw[j] - dot) / S;
      } else {
        for (int j = 0; j < k; ++j)
          if (ex[j] >= 0) g[ex[j]] += dw[j];
      }
    }
    // Softmax backward, then the z-loss's 2 * lse / N * p.
    double gp = 0.0;
    for (int e = 0; e < E; ++e) gp += g[e] * p[e];
    const double dz = dz_scale * lse[n];
    float* out = dlogits + n * E;
    for (int e = 0; e < E; ++e) out[e] = static_cast<float>(p[e] * (g[e] - gp + dz));
  }
}

}  // namespace zerod::cpu
