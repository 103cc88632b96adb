#include "engine/metrics/moe_metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "comm/communicator.h"
#include "core/error.h"

namespace zerod {

double MoeLayerMetrics::max_over_mean() const {
  if (tokens.empty()) return 0.0;
  int64_t sum = 0, most = 0;
  for (int64_t t : tokens) {
    sum += t;
    most = std::max(most, t);
  }
  return sum > 0 ? static_cast<double>(most) * static_cast<double>(tokens.size()) /
                       static_cast<double>(sum)
                 : 0.0;
}

int64_t MoeMetrics::dropped() const {
  int64_t n = 0;
  for (const MoeLayerMetrics& l : layers) n += l.dropped;
  return n;
}

int64_t MoeMetrics::assignments() const {
  int64_t n = 0;
  for (const MoeLayerMetrics& l : layers) n += l.assignments;
  return n;
}

void MoeMetricsAccumulator::add(const MoeStepStats& s) {
  if (micro_ == 0) {
    sum_.layers.resize(s.layers.size());
    for (size_t i = 0; i < s.layers.size(); ++i) {
      sum_.layers[i].layer = s.layers[i];
      sum_.layers[i].tokens.assign(s.kept.at(i).size(), 0);
    }
  }
  ZD_CHECK(s.layers.size() == sum_.layers.size(), "MoE layers changed within a step: {} then {}",
           sum_.layers.size(), s.layers.size());
  for (size_t i = 0; i < s.layers.size(); ++i) {
    MoeLayerMetrics& l = sum_.layers[i];
    for (size_t e = 0; e < l.tokens.size(); ++e) l.tokens[e] += s.kept[i][e];
    l.assignments += int64_t{s.tokens} * top_k_;
    l.dropped += s.dropped[i];
    l.aux_loss += s.layer_aux.at(i);
    l.z_loss += s.layer_z.at(i);
  }
  sum_.aux_loss += s.aux_loss;
  sum_.z_loss += s.z_loss;
  sum_.objective += s.objective;
  ++micro_;
}

MoeMetrics MoeMetricsAccumulator::reduce(Communicator* comm, int world_size, int replicas) const {
  // Counts (exact in doubles) and loss sums in one all-reduce.
  std::vector<double> v;
  for (const MoeLayerMetrics& l : sum_.layers) {
    for (int64_t t : l.tokens) v.push_back(static_cast<double>(t));
    v.insert(v.end(), {static_cast<double>(l.assignments), static_cast<double>(l.dropped),
                       l.aux_loss, l.z_loss});
  }
  v.insert(v.end(), {sum_.aux_loss, sum_.z_loss, sum_.objective});
  if (comm != nullptr)
    comm->all_reduce(v.data(), static_cast<int64_t>(v.size()), CommType::kF64, ReduceOp::kSum);
  const double n = static_cast<double>(std::max(micro_, 1)) * std::max(world_size, 1);
  const int64_t r = std::max(replicas, 1);
  MoeMetrics m = sum_;
  size_t i = 0;
  for (MoeLayerMetrics& l : m.layers) {
    for (int64_t& t : l.tokens) t = static_cast<int64_t>(v[i++]) / r;
    l.assignments = static_cast<int64_t>(v[i++]) / r;
    l.dropped = static_cast<int64_t>(v[i++]) / r;
    l.aux_loss = v[i++] / n;
    l.z_loss = v[i++] / n;
  }
  m.aux_loss = v[i++] / n;
  m.z_loss = v[i++] / n;
  m.objective = v[i++] / n;
  return m;
}

std::string moe_log_fields(const MoeMetrics& m) {
  double load = 0;
  for (const MoeLayerMetrics& l : m.layers) load = std::max(load, l.max_over_mean());
  const int64_t a = m.assignments();
  const double drop = a > 0 ? static_cast<double>(m.dropped()) / static_cast<double>(a) : 0.0;
  return fmt::format(" | moe aux {:.4g} z {:.4g} drop {:.1f}% load {:.2f}", m.aux_loss, m.z_loss,
                     drop * 100, load);
}

std::vector<std::pair<std::string, float>> moe_scalars(const MoeMetrics& m) {
  std::vector<std::pair<std::string, float>> s;
  const int64_t a = m.assignments();
  s.emplace_back("moe/aux_loss", static_cast<float>(m.aux_loss));
  s.emplace_back("moe/z_loss", static_cast<float>(m.z_loss));
  s.emplace_back(
      "moe/dropped_fraction",
      a > 0 ? static_cast<float>(static_cast<double>(m.dropped()) / static_cast<double>(a)) : 0.0f);
  for (const MoeLayerMetrics& l : m.layers) {
    const std::string p = fmt::format("moe/layer{}/", l.layer);
    s.emplace_back(p + "aux_loss", static_cast<float>(l.aux_loss));
    s.emplace_back(p + "z_loss", static_cast<float>(l.z_loss));
    s.emplace_back(p + "dropped_fraction", static_cast<float>(l.dropped_fraction()));
    s.emplace_back(p + "max_over_mean", static_cast<float>(l.max_over_mean()));
    for (size_t e = 0; e < l.tokens.size(); ++e)
      s.emplace_back(fmt::format("{}expert{}_tokens", p, e), static_cast<float>(l.tokens[e]));
  }
  return s;
}

std::string moe_csv_header(int experts) {
  std::string h = "step,layer,aux_loss,z_loss,dropped_fraction";
  for (int e = 0; e < experts; ++e) h += fmt::format(",tokens_{}", e);
  return h + "\n";
}

std::vector<std::string> moe_csv_rows(int64_t step, const MoeMetrics& m) {
  std::vector<std::string> rows;
  std::vector<int64_t> all;
  for (const MoeLayerMetrics& l : m.layers) {
    std::string r = fmt::format("{},{},{:.9g},{:.9g},{:.9g}", step, l.layer, l.aux_loss, l.z_loss,
                                l.dropped_fraction());
    all.resize(l.tokens.size(), 0);
    for (size_t e = 0; e < l.tokens.size(); ++e) {
      r += fmt::format(",{}", l.tokens[e]);
      all[e] += l.tokens[e];
    }
    rows.push_back(std::move(r));
  }
  const int64_t a = m.assignments();
  std::string r =
      fmt::format("{},all,{:.9g},{:.9g},{:.9g}", step, m.aux_loss, m.z_loss,
                  a > 0 ? static_cast<double>(m.dropped()) / static_cast<double>(a) : 0.0);
  for (int64_t t : all) r += fmt::format(",{}", t);
  rows.push_back(std::move(r));
  return rows;
}

}  // namespace zerod
