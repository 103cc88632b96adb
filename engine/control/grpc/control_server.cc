#include "engine/control/grpc/control_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "core/error.h"
#include "engine/runtime/launch.h"

namespace zerod {

ControlServer::ControlServer(Daemon& daemon, const ControlServerOptions& options)
    : service_(daemon, options.security.token) {
  const std::string host = parse_host_port(options.listen, "--listen", /*min_port=*/0).first;
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
  address_ = join_host_port(host, bound);
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
