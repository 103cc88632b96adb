// The daemon's gRPC server: Control (control_service.h), the standard grpc.health.v1.Health
// service (SERVING while the daemon runs, for the server and each service by name) and server
// reflection (v1alpha from libgrpc++_reflection, v1 from reflection_v1.h), behind the security of
// engine/runtime/grpc/auth.h, with bounded message sizes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "engine/control/grpc/control_service.h"
#include "engine/control/grpc/reflection_v1.h"
#include "engine/runtime/grpc/auth.h"

namespace zerod {

struct ControlServerOptions {
  std::string listen;  // unix:PATH, or HOST:PORT (port 0: any free port)
  ServerSecurity security;
  int max_message_bytes = 4 << 20;                         // larger requests get RESOURCE_EXHAUSTED
  int max_watchers = ControlService::kDefaultMaxWatchers;  // open WatchStatus streams at most
};

class ControlServer {
 public:
  // Checks the listen policy (InputError: TCP without a token, unless --insecure-loopback on
  // loopback; a Unix socket another daemon answers on) and binds (a Unix socket: mode 0600).
  // InputError naming the address when it cannot be bound.
  ControlServer(Daemon& daemon, const ControlServerOptions& options);
  ~ControlServer();
  void shutdown();                                         // ends streams and calls (idempotent)
  const std::string& address() const { return address_; }  // HOST:PORT bound, or unix:PATH

 private:
  ControlService service_;
  ReflectionV1Service reflection_v1_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace zerod
