#include "engine/runtime/grpc/rendezvous_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <random>

#include "core/error.h"
#include "engine/runtime/grpc/auth.h"
#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/launch.h"
#include "engine/runtime/net.h"

namespace zerod {
namespace {

// Unique per rendezvous: 64 random bits and the start time.
std::string new_session_id() {
  std::random_device rd;
  const uint64_t bits = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", bits);
}

std::string in_use_message(const std::string& address) {
  return fmt::format(
      "{} is already in use: another zerod (or another program) listens there; stop it or "
      "choose another --master port",
      address);
}

}  // namespace

std::unique_ptr<RendezvousServer> RendezvousServer::start(const RendezvousServerOptions& options) {
  return start_impl(options, /*may_fail=*/false);
}

std::unique_ptr<RendezvousServer> RendezvousServer::try_start(
    const RendezvousServerOptions& options) {
  return start_impl(options, /*may_fail=*/true);
}

std::unique_ptr<RendezvousServer> RendezvousServer::start_impl(
    const RendezvousServerOptions& options, bool may_fail) {
  const std::string address = join_host_port(options.host, options.port);
  // gRPC only says "could not bind"; probe first to say why.
  switch (probe_tcp_bind(options.host, options.port)) {
    case BindResult::kFree:
      break;
    case BindResult::kInUse:
      if (may_fail) return nullptr;
      ZD_THROW_INPUT("{}", in_use_message(address));
    case BindResult::kNotLocal:
      if (may_fail) return nullptr;
      ZD_THROW_INPUT(
          "cannot host the rendezvous at {}: {} is not an address of this machine (node 0 must "
          "run on the --master host)",
          address, options.host);
  }

  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->address_ = address;
  s->service_ = std::make_unique<RendezvousService>(address, new_session_id());
  grpc::ServerBuilder builder;
  int bound_port = 0;
  // TLS (and gRPC's token check) when this process serves TLS (set_rendezvous_tls); in
  // plaintext the service checks the token in its handlers.
  builder.AddListeningPort(address, server_credentials(rendezvous_server_security()), &bound_port);
  builder.RegisterService(s->service_.get());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port must fail
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  if (options.configure_builder) options.configure_builder(builder);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || bound_port == 0) {  // lost a race for the port since the probe
    s->server_.reset();
    if (may_fail) return nullptr;
    ZD_THROW_INPUT("{}", in_use_message(address));
  }
  s->timer_ = std::thread([raw = s.get(), tick = options.tick] { raw->timer_loop(tick); });
  spdlog::debug("rendezvous: serving at {} (session {})", address, s->session_id());
  return s;
}

RendezvousServer::~RendezvousServer() {
  stop();
}

void RendezvousServer::timer_loop(std::chrono::milliseconds tick) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, tick, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    service_->tick();
    lock.lock();
  }
}

void RendezvousServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !timer_.joinable() && !server_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  if (server_) {
    service_->shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }
}

bool RendezvousServer::wait_all_nodes_done(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!service_->all_nodes_done()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;  // nobody can leave any more
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace zerod
