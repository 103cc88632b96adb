#include "engine/control/grpc/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>

#include "engine/runtime/grpc/auth.h"

namespace zerod {

namespace {

namespace v1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// `file` and every file it depends on, each once per stream (`sent`), as serialized
// FileDescriptorProtos.
void add_file(const FileDescriptor* file, std::set<std::string>& sent,
              v1::FileDescriptorResponse* out) {
  if (!sent.insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) add_file(file->dependency(i), sent, out);
}

void not_found(v1::ServerReflectionResponse* resp, const std::string& what) {
  v1::ErrorResponse* e = resp->mutable_error_response();
  e->set_error_code(static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  e->set_error_message(what);
}

}  // namespace

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::ServerReflectionResponse, v1::ServerReflectionRequest>* stream) {
  if (grpc::Status st = check_token(*ctx, token_); !st.ok()) return st;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<std::string> sent;  // files already sent on this stream
  v1::ServerReflectionRequest req;
  while (stream->Read(&req)) {
    v1::ServerReflectionResponse resp;
    resp.set_valid_host(req.host());
    *resp.mutable_original_request() = req;
    switch (req.message_request_case()) {
      case v1::ServerReflectionRequest::kListServices:
        for (const std::string& s : services_)
          resp.mutable_list_services_response()->add_service()->set_name(s);
        break;
      case v1::ServerReflectionRequest::kFileByFilename:
        if (const FileDescriptor* f = pool->FindFileByName(req.file_by_filename())) {
          add_file(f, sent, resp.mutable_file_descriptor_response());
        } else {
          not_found(&resp, "file not found");
        }
        break;
      case v1::ServerReflectionRequest::kFileContainingSymbol:
        if (const FileDescriptor* f =
                pool->FindFileContainingSymbol(req.file_containing_symbol())) {
          add_file(f, sent, resp.mutable_file_descriptor_response());
        } else {
          not_found(&resp, "symbol not found");
        }
        break;
      case v1::ServerReflectionRequest::kFileContainingExtension: {
        const auto& x = req.file_containing_extension();
        const auto* type = pool->FindMessageTypeByName(x.containing_type());
        const auto* ext = type ? pool->FindExtensionByNumber(type, x.extension_number()) : nullptr;
        if (ext != nullptr) {
          add_file(ext->file(), sent, resp.mutable_file_descriptor_response());
        } else {
          not_found(&resp, "extension not found");
        }
        break;
      }
      case v1::ServerReflectionRequest::kAllExtensionNumbersOfType:
        if (const auto* type = pool->FindMessageTypeByName(req.all_extension_numbers_of_type())) {
          std::vector<const google::protobuf::FieldDescriptor*> exts;
          pool->FindAllExtensions(type, &exts);
          v1::ExtensionNumberResponse* r = resp.mutable_all_extension_numbers_response();
          r->set_base_type_name(type->full_name());
          for (const auto* e : exts) r->add_extension_number(e->number());
        } else {
          not_found(&resp, "type not found");
        }
        break;
      case v1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET: {
        v1::ErrorResponse* e = resp.mutable_error_response();
        e->set_error_code(static_cast<int32_t>(grpc::StatusCode::UNIMPLEMENTED));
        e->set_error_message("the request names no known message_request");
        break;
      }
    }
    if (!stream->Write(resp)) break;
  }
  return grpc::Status::OK;
}

}  // namespace zerod
