#include "engine/runtime/local_ranks.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/self/self_communicator.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace {

int error_priority(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind() == ErrorKind::kPeerLost ? 1 : 0;  // a lost peer is usually a consequence
  } catch (...) {
    return 0;
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

void run_local_ranks(const LocalRanksOptions& o,
                     const std::function<void(const RankContext&)>& body) {
  ZD_CHECK(o.local_world_size >= 1 && o.first_rank >= 0 &&
               o.first_rank + o.local_world_size <= o.world_size,
           "local ranks [{}, {}) of world {}", o.first_rank, o.first_rank + o.local_world_size,
           o.world_size);
  ZD_CHECK(o.world_size == 1 || o.store != nullptr, "world size {} needs a store", o.world_size);
  std::shared_ptr<PeerMonitor> monitor = o.monitor;
  if (!monitor) monitor = std::make_shared<LocalPeerMonitor>(o.world_size);
  const int threads = o.threads_per_rank > 0 ? o.threads_per_rank
                                             : std::max(1, cpu_info().cores / o.local_world_size);

  std::vector<std::exception_ptr> errors(static_cast<size_t>(o.local_world_size));
  auto rank_main = [&](int local) {
    const int rank = o.first_rank + local;
    log::set_thread_rank(o.world_size > 1 ? rank : -1);
    omp_set_num_threads(threads);
    std::unique_ptr<Communicator> comm;
    try {
      std::shared_ptr<Store> store;
      if (o.world_size > 1) {
        store = std::make_shared<PrefixStore>(o.store_prefix, o.store);
        GlooOptions g;
        g.rank = rank;
        g.size = o.world_size;
        g.store = store;
        g.bind_address = o.bind_address;
        g.timeout = o.timeout;
        g.monitor = monitor;
        g.first_local_rank = o.first_rank;
        g.local_ranks = o.local_world_size;
        comm = make_gloo_communicator(g);
      }
      RankContext ctx;
      ctx.rank = rank;
      ctx.world_size = o.world_size;
      ctx.local_rank = local;
      ctx.local_world_size = o.local_world_size;
      ctx.local_processes = o.local_processes;
      ctx.local_process = o.local_process;
      ctx.comm = comm.get();
      ctx.store = store;
      ctx.timeout = o.timeout;
      ctx.monitor = monitor;
      ctx.bind_address = o.bind_address;
      body(ctx);
    } catch (...) {
      errors[static_cast<size_t>(local)] = std::current_exception();
      monitor->mark_dead(rank, what_of(errors[static_cast<size_t>(local)]));
      comm.reset();  // closes this rank's connections: peers waiting on it fail at once
    }
  };

  if (o.local_world_size == 1) {
    rank_main(0);
  } else {
    std::vector<std::thread> ranks;
    ranks.reserve(static_cast<size_t>(o.local_world_size));
    for (int local = 0; local < o.local_world_size; ++local) ranks.emplace_back(rank_main, local);
    for (auto& t : ranks) t.join();
  }

  std::exception_ptr root;
  for (const auto& e : errors) {
    if (!e) continue;
    if (!root || error_priority(e) < error_priority(root)) root = e;
  }
  if (root) std::rethrow_exception(root);
}

}  // namespace zerod
