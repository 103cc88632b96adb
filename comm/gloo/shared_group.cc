#include "comm/gloo/shared_group.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace zerod::gloo_backend {

namespace {

// This process, distinct from every other one on any machine: host, pid and 64 random bits.
const std::string& process_token() {
  static const std::string token = [] {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    std::random_device rd;
    const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
    return fmt::format("{}/{}/{:016x}", host, ::getpid(), r);
  }();
  return token;
}

// The groups of this process being joined, by id: rank 0 registers its group with the number of
// ranks still to join, each joiner takes it and the last one removes the entry. The table holds
// the group until then, so a rank 0 that fails right after creating it (its job refused, its
// thread gone) does not take the group away from ranks that have yet to join.
struct Pending {
  std::shared_ptr<SharedGroup> group;
  int joiners = 0;
};
std::mutex& table_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, Pending>& table() {
  static std::map<std::string, Pending> t;
  return t;
}

std::string as_string(const Bytes& b) {
  return std::string(b.begin(), b.end());
}
Bytes as_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

}  // namespace

SharedGroup::SharedGroup(int size) : size_(size), slots_(new Slot[static_cast<size_t>(size)]) {}

void SharedGroup::enter(int rank, int64_t seq) {
  slots_[rank].active.store(seq, std::memory_order_seq_cst);
}

void SharedGroup::leave(int rank) {
  Slot& s = slots_[rank];
  s.active.store(-1, std::memory_order_seq_cst);
  // A reader that marked itself before seeing -1 finishes its copy; one that marks itself after
  // sees -1 and backs off (begin_read). Copies take milliseconds; the bound is a safety net.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.readers.load(std::memory_order_seq_cst) > 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      spdlog::error("gloo shared memory: rank {} left a collective while {} peer(s) still read it",
                    rank, s.readers.load());
      return;
    }
    std::this_thread::yield();
  }
}

bool SharedGroup::begin_read(int owner, int64_t seq) {
  Slot& s = slots_[owner];
  s.readers.fetch_add(1, std::memory_order_seq_cst);
  if (s.active.load(std::memory_order_seq_cst) == seq) return true;
  s.readers.fetch_sub(1, std::memory_order_seq_cst);
  return false;
}

void SharedGroup::end_read(int owner) {
  slots_[owner].readers.fetch_sub(1, std::memory_order_seq_cst);
}

std::shared_ptr<SharedGroup> join_shared_group(Store& store, int rank, int size,
                                               std::chrono::milliseconds timeout) {
  if (size <= 1) return nullptr;
  const std::string& mine = process_token();
  store.set("zerod_process_" + std::to_string(rank), as_bytes(mine));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (as_string(store.get("zerod_process_" + std::to_string(r), timeout)) != mine) return nullptr;
  }
  // Every rank is a thread of this process.
  if (rank == 0) {
    static std::atomic<uint64_t> counter{0};
    const std::string id = fmt::format("{}#{}", mine, counter.fetch_add(1));
    auto group = std::make_shared<SharedGroup>(size);
    {
      std::lock_guard<std::mutex> lock(table_mu());
      table()[id] = Pending{group, size - 1};
    }
    store.set("zerod_shared_group", as_bytes(id));
    return group;
  }
  const std::string id = as_string(store.get("zerod_shared_group", timeout));
  std::lock_guard<std::mutex> lock(table_mu());
  auto it = table().find(id);
  ZD_CHECK(it != table().end(), "rank {}: no shared-memory group '{}' in this process", rank, id);
  std::shared_ptr<SharedGroup> group = it->second.group;
  if (--it->second.joiners == 0) table().erase(it);
  return group;
}

}  // namespace zerod::gloo_backend
