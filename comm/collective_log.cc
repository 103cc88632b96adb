#include "comm/collective_log.h"

#include <fmt/format.h>

#include <algorithm>

namespace zerod {

namespace {
std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} KB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}
}  // namespace

CollectiveLog::CollectiveLog(int world_size, size_t capacity)
    : world_(world_size), capacity_(capacity), t0_(std::chrono::steady_clock::now()) {}

double CollectiveLog::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

CollectiveRecord* CollectiveLog::find(int64_t seq) {
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it)
    if (it->seq == seq) return &*it;
  return nullptr;
}

void CollectiveLog::issued(int64_t seq, const std::string& op, const std::string& detail,
                           int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord r;
  r.seq = seq;
  r.op = op;
  r.detail = detail;
  r.bytes = bytes;
  r.issued = now();
  recent_.push_back(std::move(r));
  while (recent_.size() > capacity_) recent_.pop_front();
}

void CollectiveLog::started(int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (CollectiveRecord* r = find(seq)) r->started = now();
}

void CollectiveLog::ended(int64_t seq, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord* r = find(seq);
  if (r == nullptr) return;
  r->ended = now();
  r->failed = !ok;
  if (!ok) return;
  CollectiveTotals& t = totals_[r->op];
  t.calls += 1;
  t.bytes += r->bytes;
  t.seconds += r->ended - (r->started >= 0 ? r->started : r->issued);
}

std::vector<CollectiveRecord> CollectiveLog::recent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {recent_.begin(), recent_.end()};
}

std::map<std::string, CollectiveTotals> CollectiveLog::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

double CollectiveLog::bus_factor(const std::string& op) const {
  const double n = world_;
  if (world_ <= 1) return 1.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n;
  return 1.0;
}

double CollectiveLog::sent_bytes(const std::string& op, double bytes) const {
  if (op == "recv") return 0.0;
  return bytes * bus_factor(op);
}

std::string CollectiveLog::describe_recent(size_t n) const {
  const std::vector<CollectiveRecord> all = recent();
  std::string out;
  const size_t from = all.size() > n ? all.size() - n : 0;
  for (size_t i = from; i < all.size(); ++i) {
    const CollectiveRecord& r = all[i];
    std::string state;
    if (r.ended >= 0) {
      state = fmt::format("{} at {:.3f} s ({:.3f} ms)", r.failed ? "failed" : "finished", r.ended,
                          1e3 * (r.ended - (r.started >= 0 ? r.started : r.issued)));
    } else if (r.started >= 0) {
      state = fmt::format("started at {:.3f} s, not finished", r.started);
    } else {
      state = "queued, not started";
    }
    // Point-to-point messages carry no sequence number (their ids are negative).
    const std::string name = r.seq > 0 ? fmt::format("#{} {}", r.seq, r.op) : r.op;
    out += fmt::format("\n  {} ({}, {}): issued at {:.3f} s, {}", name, r.detail,
                       human_bytes(static_cast<double>(r.bytes)), r.issued, state);
  }
  return out;
}

std::string CollectiveLog::describe_totals(const std::vector<std::string>& only,
                                           int64_t steps) const {
  std::string out;
  for (const auto& [op, t] : totals()) {
    if (!only.empty() && std::find(only.begin(), only.end(), op) == only.end()) continue;
    const double algbw = t.seconds > 0 ? static_cast<double>(t.bytes) / t.seconds : 0;
    out += fmt::format(
        "\n  {:<15} {:>7} calls {:>10} ({} B) {:>9.3f} s  algbw {:>8.1f} MB/s  busbw {:>8.1f} MB/s",
        op, t.calls, human_bytes(static_cast<double>(t.bytes)), t.bytes, t.seconds, algbw / 1e6,
        algbw * bus_factor(op) / 1e6);
    // Per step: the totals spread over the steps (start-up collectives included, so the first
    // steps of a short run read a little high).
    if (steps > 0) {
      const double per_step = static_cast<double>(t.bytes) / static_cast<double>(steps);
      out += fmt::format("  {:>10}/step, sent {}/step", human_bytes(per_step),
                         human_bytes(sent_bytes(op, per_step)));
    }
  }
  return out;
}

}  // namespace zerod
