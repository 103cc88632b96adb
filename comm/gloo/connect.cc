#include "comm/gloo/connect.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "comm/gloo/link.h"
#include "comm/gloo/store_adapter.h"
#include "comm/rank_names.h"
#include "core/error.h"

namespace zerod::gloo_backend {

namespace {

// Gloo writes to its sockets with writev(2), which raises SIGPIPE when the peer has gone; left
// at its default, that signal kills this process instead of failing the collective with an
// error. Ignore it, unless the program installed its own handler.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace

std::shared_ptr<gloo::rendezvous::Context> connect_full_mesh(const GlooOptions& o) {
  ignore_sigpipe();
  ZD_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank {} of a world of {} ranks", o.rank,
           o.size);
  ZD_CHECK(o.store != nullptr, "the Gloo communicator needs a store");
  ZD_CHECK(o.timeout.count() > 0, "timeout must be positive, got {} ms", o.timeout.count());
  ZD_CHECK(o.global_ranks.empty() || o.global_ranks.size() == static_cast<size_t>(o.size),
           "group '{}' of {} ranks has {} global ranks", o.group_name, o.size,
           o.global_ranks.size());
  const RankNames names{o.group_name, o.global_ranks};

  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr(o.bind_address.c_str());
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    ZD_THROW_INPUT("{}: cannot listen on bind address '{}': {}", names.rank(o.rank), o.bind_address,
                   tidy_gloo_message(e.what()));
  }

  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  context->setTimeout(o.timeout);
  const auto start = Clock::now();
  StoreAdapter store(*o.store, start + o.timeout);
  try {
    context->connectFullMesh(store, device);
    return context;
  } catch (const std::exception& e) {
    std::vector<int> missing;
    std::vector<std::string> keys;
    for (int r = 0; r < o.size; ++r) {
      const std::string key = "rank_" + std::to_string(r);
      try {
        if (r != o.rank && !o.store->check({key})) {
          missing.push_back(names.global(r));
          keys.push_back("'" + key + "'");
        }
      } catch (const std::exception&) {
        // The store itself failed; the message below carries the original error.
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    const auto what =
        names.is_world() ? fmt::format(
                               "creating the Gloo communicator (rank {} of {}) failed after "
                               "{:.0f} ms (timeout {} ms)",
                               o.rank, o.size, ms, o.timeout.count())
                         : fmt::format(
                               "creating the Gloo communicator of {} on rank {} failed after "
                               "{:.0f} ms (timeout {} ms)",
                               names.describe_group(), names.global(o.rank), ms, o.timeout.count());
    if (!missing.empty()) {
      const char* s = missing.size() == 1 ? "" : "s";
      ZD_THROW_KIND(ErrorKind::kPeerLost, "{}: rank{} {} never joined (store key{} {} not set); {}",
                    what, s, fmt::join(missing, ", "), s, fmt::join(keys, ", "),
                    tidy_gloo_message(e.what()));
    }
    ZD_THROW_KIND(ErrorKind::kPeerLost, "{}: every rank joined, but connecting to them failed: {}",
                  what, tidy_gloo_message(e.what()));
  }
}

}  // namespace zerod::gloo_backend
