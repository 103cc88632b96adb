#include "core/fault_points.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace zerod {

namespace {

struct Fault {
  std::string point;
  int at = 0;      // the arrival (from 1) that fails
  int errno_ = 0;  // 0: kill
};

struct FaultState {
  std::mutex mu;
  std::vector<Fault> faults;
  std::map<std::string, int, std::less<>> hits;
};

FaultState& state() {
  static FaultState s;
  return s;
}

std::atomic<bool> g_armed{false};
std::once_flag g_env_once;

std::vector<Fault> parse(const std::string& spec, const char* source) {
  std::vector<Fault> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string entry = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (entry.empty() || entry == "count") continue;
    const size_t at = entry.find('@');
    const size_t eq = entry.find('=', at == std::string::npos ? 0 : at);
    const auto bad = [&](const char* why) {
      ZD_THROW_INPUT(
          "{}: entry '{}' {}: the form is POINT@N=ACTION (ACTION: enospc, edquot, "
          "eio, kill)",
          source, entry.substr(0, 80), why);
    };
    if (at == std::string::npos || eq == std::string::npos || at == 0) bad("is malformed");
    Fault f;
    f.point = entry.substr(0, at);
    const std::string n = entry.substr(at + 1, eq - at - 1);
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 1 || v > 1000000) bad("has no arrival count N >= 1");
    f.at = static_cast<int>(v);
    const std::string action = entry.substr(eq + 1);
    if (action == "enospc") {
      f.errno_ = ENOSPC;
    } else if (action == "edquot") {
      f.errno_ = EDQUOT;
    } else if (action == "eio") {
      f.errno_ = EIO;
    } else if (action != "kill") {
      bad("has an unknown action");
    }
    out.push_back(std::move(f));
  }
  return out;
}

void arm(std::vector<Fault> faults, bool counting) {
  FaultState& s = state();
  std::lock_guard lock(s.mu);
  s.faults = std::move(faults);
  s.hits.clear();
  g_armed.store(counting || !s.faults.empty(), std::memory_order_release);
}

void report_hits() {
  FaultState& s = state();
  std::lock_guard lock(s.mu);
  std::string line = "zerod fault points (pid " + std::to_string(::getpid()) + "):";
  for (const auto& [name, n] : s.hits) line += " " + name + "=" + std::to_string(n);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void read_environment() {
  std::call_once(g_env_once, [] {
    const char* env = std::getenv("ZEROD_FAULTS");
    if (env == nullptr || *env == '\0') return;
    arm(parse(env, "ZEROD_FAULTS"), true);
    // With "count" in it, the process says at exit how often it reached each point (a test
    // picks the arrival to fail from that).
    const std::string spec = env;
    if (("," + spec + ",").find(",count,") != std::string::npos) std::atexit(report_hits);
  });
}

}  // namespace

int fault_point(std::string_view name) {
  read_environment();
  if (!g_armed.load(std::memory_order_acquire)) return 0;
  FaultState& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.hits.find(name);
  if (it == s.hits.end()) it = s.hits.emplace(std::string(name), 0).first;
  const int n = ++it->second;
  for (const Fault& f : s.faults) {
    if (f.point != name || f.at != n) continue;
    if (f.errno_ == 0) std::raise(SIGKILL);
    return f.errno_;
  }
  return 0;
}

void set_faults(const std::string& spec) {
  read_environment();  // the environment's spec is read first, so it cannot override this later
  arm(parse(spec, "fault spec"), !spec.empty());
}

int fault_hits(std::string_view name) {
  FaultState& s = state();
  std::lock_guard lock(s.mu);
  const auto it = s.hits.find(name);
  return it == s.hits.end() ? 0 : it->second;
}

}  // namespace zerod
