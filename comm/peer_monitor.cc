#include "comm/peer_monitor.h"

#include <fmt/format.h>

#include "core/error.h"

namespace zerod {

namespace {

RankProgress& at(std::vector<RankProgress>& ranks, int rank) {
  ZD_CHECK(rank >= 0 && static_cast<size_t>(rank) < ranks.size(),
           "rank {} outside the monitored world of {} ranks", rank, ranks.size());
  return ranks[static_cast<size_t>(rank)];
}

}  // namespace

void LocalPeerMonitor::on_start(int rank, int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  at(ranks_, rank).started = seq;
}

void LocalPeerMonitor::on_complete(int rank, int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  at(ranks_, rank).completed = seq;
}

void LocalPeerMonitor::mark_dead(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = at(ranks_, rank);
  if (!r.alive) return;  // keep the first reason: it is the cause, later ones are consequences
  r.alive = false;
  r.reason = reason;
}

std::vector<RankProgress> LocalPeerMonitor::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

std::string describe_missing_ranks(const std::vector<RankProgress>& ranks, int64_t seq, int self,
                                   const std::vector<int>& names) {
  std::string out;
  auto append = [&](const std::string& part) {
    if (!out.empty()) out += "; ";
    out += part;
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (static_cast<int>(r) == self) continue;
    const int name = r < names.size() ? names[r] : static_cast<int>(r);
    const auto& p = ranks[r];
    if (!p.alive) {
      append(fmt::format("rank {} is dead ({})", name,
                         p.reason.empty() ? "no reason given" : p.reason));
    } else if (!p.known) {
      append(fmt::format("rank {} runs in another process: its progress is not known here", name));
    } else if (p.started < seq) {
      if (p.started == 0) {
        append(
            fmt::format("rank {} had not started any collective and did not join #{}", name, seq));
      } else if (p.completed >= p.started) {
        append(fmt::format("rank {} finished collective #{} but did not join #{}", name,
                           p.completed, seq));
      } else {
        append(fmt::format("rank {} is still in collective #{} (finished #{}) and did not join #{}",
                           name, p.started, p.completed, seq));
      }
    }
  }
  return out;
}

}  // namespace zerod
