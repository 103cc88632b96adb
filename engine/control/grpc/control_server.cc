#include "engine/control/grpc/control_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <sys/stat.h>

#include "core/error.h"
#include "engine/runtime/grpc/endpoint.h"
#include "engine/runtime/launch.h"

namespace zerod {

namespace {

// The services the server answers, by name (health and reflection list them).
const std::vector<std::string>& service_names() {
  static const std::vector<std::string> names = {
      v1::Control::service_full_name(), "grpc.health.v1.Health",
      "grpc.reflection.v1alpha.ServerReflection",
      grpc::reflection::v1::ServerReflection::service_full_name()};
  return names;
}

}  // namespace

ControlServer::ControlServer(Daemon& daemon, const ControlServerOptions& options)
    : service_(daemon, options.security.token, options.max_watchers),
      reflection_v1_(service_names(), options.security.token) {
  const bool unix_socket = is_unix_address(options.listen);
  const std::string host =
      unix_socket ? "" : parse_host_port(options.listen, "--listen", /*min_port=*/0).first;
  check_listen_policy(options.listen, host, options.security);
  // gRPC replaces whatever socket is at the path: refuse when a daemon answers there.
  if (unix_socket) check_unix_socket_free(unix_socket_path(options.listen), "--listen");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.listen, server_credentials(options.security), &bound);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port must fail
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(&service_);
  builder.RegisterService(&reflection_v1_);
  if (!options.security.token.empty() && options.security.tls_cert.empty()) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
    f.push_back(token_interceptor(options.security.token, "/zerod.v1.Control/"));
    builder.experimental().SetInterceptorCreators(std::move(f));
  }
  server_ = builder.BuildAndStart();
  if (!server_ || (!unix_socket && bound == 0)) {
    server_.reset();
    ZD_THROW_INPUT("--listen {}: cannot listen there ({})", options.listen,
                   unix_socket ? "the directory does not exist or is not writable"
                               : "in use, or not an address of this machine");
  }
  if (unix_socket) {
    // Only this user may connect (the default socket's directory is 0700 too).
    ::chmod(unix_socket_path(options.listen).c_str(), 0600);
    address_ = options.listen;
  } else {
    address_ = join_host_port(host, bound);
  }
  // The server as a whole ("") and each service by name: Check("zerod.v1.Control") is what a
  // probe of this service asks (grpc_health_probe -service zerod.v1.Control).
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(true);
  for (const std::string& service : service_names()) health->SetServingStatus(service, true);
}

ControlServer::~ControlServer() {
  shutdown();
}

void ControlServer::shutdown() {
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);  // every name set above
  service_.shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace zerod
