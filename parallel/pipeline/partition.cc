// partition.h: uniform split, the balanced parameter split, and the checks of an explicit list.
#include "parallel/pipeline/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace zerod::pipeline {

std::string partition_problem(int layers, int stages, PartitionMethod method,
                              const std::vector<int>& counts) {
  if (stages < 1) return fmt::format("{} pipeline stages: must be at least 1", stages);
  if (stages > layers)
    return fmt::format("{} pipeline stages for {} layers: every stage needs at least one layer",
                       stages, layers);
  if (method != PartitionMethod::kExplicit) return "";
  if (static_cast<int>(counts.size()) != stages)
    return fmt::format("a list of {} layer counts for {} stages (pipeline x virtual_stages)",
                       counts.size(), stages);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 1)
      return fmt::format("stage {} gets {} layers: every stage needs at least one", i, counts[i]);
  }
  const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (sum != layers)
    return fmt::format("the layer counts sum to {}, but the model has {} layers", sum, layers);
  return "";
}

std::vector<int> stage_first_layers(const std::vector<int>& counts) {
  std::vector<int> first(1, 0);
  for (int c : counts) first.push_back(first.back() + c);
  return first;
}

namespace {

std::vector<int> uniform(int layers, int stages) {
  std::vector<int> out(static_cast<size_t>(stages), layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++out[static_cast<size_t>(s)];
  return out;
}

// Two passes of dynamic programming over the cut points, O(S L^2) each (L the layers, hundreds
// at most): the smallest largest-stage load B, then of the splits with every stage <= B the one
// with the smallest sum of squared loads (the rest as even as the largest allows).
std::vector<int> balance_parameters(const PartitionRequest& r) {
  const int L = r.layers, S = r.stages;
  std::vector<int64_t> prefix(static_cast<size_t>(L) + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + r.layer_params[static_cast<size_t>(l)];
  const auto load = [&](int s, int begin, int end) {
    return prefix[end] - prefix[begin] + (s == 0 ? r.first_params : 0) +
           (s == S - 1 ? r.last_params : 0);
  };
  // cost[s][l]: the best cost of layers [0, l) on stages [0, s], each stage >= 1 layer;
  // combine(prev, stage load) -> cost, or kInf when the stage is not allowed.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> cut(static_cast<size_t>(S),
                                    std::vector<int>(static_cast<size_t>(L) + 1, 0));
  const auto solve = [&](const std::function<double(double, int64_t)>& combine) {
    std::vector<std::vector<double>> cost(static_cast<size_t>(S),
                                          std::vector<double>(static_cast<size_t>(L) + 1, kInf));
    for (int l = 1; l <= L; ++l) cost[0][l] = combine(0.0, load(0, 0, l));
    for (int s = 1; s < S; ++s) {
      for (int l = s + 1; l <= L; ++l) {
        for (int k = s; k < l; ++k) {  // stage s holds [k, l)
          const double v = combine(cost[s - 1][k], load(s, k, l));
          if (v < cost[s][l]) {
            cost[s][l] = v;
            cut[s][l] = k;
          }
        }
      }
    }
    return cost[S - 1][L];
  };
  const double largest =
      solve([](double prev, int64_t x) { return std::max(prev, static_cast<double>(x)); });
  solve([&](double prev, int64_t x) {
    const double v = static_cast<double>(x);
    return v > largest ? kInf : prev + v * v;
  });
  std::vector<int> counts(static_cast<size_t>(S));
  for (int s = S - 1, l = L; s >= 0; --s) {
    const int k = s == 0 ? 0 : cut[s][l];
    counts[static_cast<size_t>(s)] = l - k;
    l = k;
  }
  return counts;
}

}  // namespace

std::vector<int> partition_layers(const PartitionRequest& r) {
  const std::string why = partition_problem(r.layers, r.stages, r.method, r.counts);
  if (!why.empty()) ZD_THROW_INPUT("pipeline partition: {}", why);
  switch (r.method) {
    case PartitionMethod::kUniform:
      return uniform(r.layers, r.stages);
    case PartitionMethod::kExplicit:
      return r.counts;
    case PartitionMethod::kParameters:
      ZD_CHECK(static_cast<int>(r.layer_params.size()) == r.layers,
               "{} layer parameter counts for {} layers", r.layer_params.size(), r.layers);
      return balance_parameters(r);
  }
  ZD_THROW("unknown partition method {}", static_cast<int>(r.method));
}

}  // namespace zerod::pipeline
