// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection, what grpcurl and current gRPC
// tools ask first), answered from the descriptors compiled into this process
// (google::protobuf::DescriptorPool::generated_pool()). The system's libgrpc++_reflection
// (gRPC 1.51, Debian 12) serves only grpc.reflection.v1alpha, which the daemon serves too.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace zerod {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // services: the names list_services answers; token: every call must carry it (empty: none).
  ReflectionV1Service(std::vector<std::string> services, std::string token)
      : services_(std::move(services)), token_(std::move(token)) {}

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  std::vector<std::string> services_;
  std::string token_;
};

}  // namespace zerod
