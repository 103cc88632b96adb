#include "engine/control/grpc/control_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "core/error.h"

namespace zerod {

std::pair<std::string, int> split_host_port(const std::string& address, const std::string& flag) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    ZD_THROW_INPUT("{} {}: expected HOST:PORT", flag, address);
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) ZD_THROW_INPUT("{} {}: the port must be 0-65535", flag, address);
  return {host, port};
}

ControlServer::ControlServer(Daemon& daemon, const ControlServerOptions& options)
    : service_(daemon, options.security.token) {
  const auto [host, port] = split_host_port(options.listen, "--listen");
  check_listen_policy(host, options.security);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.listen, server_credentials(options.security), &bound);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port must fail
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(&service_);
  if (!options.security.token.empty() && options.security.tls_cert.empty()) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
    f.push_back(token_interceptor(options.security.token, "/zerod.v1.Control/"));
    builder.experimental().SetInterceptorCreators(std::move(f));
  }
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    ZD_THROW_INPUT("--listen {}: cannot listen there (in use, or not an address of this machine)",
                   options.listen);
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  address_ =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
}

ControlServer::~ControlServer() {
  shutdown();
}

void ControlServer::shutdown() {
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  service_.shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace zerod
