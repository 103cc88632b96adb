#include "engine/runtime/grpc/grpc_store.h"

#include <fmt/format.h>

#include "core/error.h"
#include "engine/runtime/grpc/channel.h"

namespace zerod {
namespace {

// The server answers a Get/Wait at its deadline; give the answer this long to arrive.
constexpr std::chrono::milliseconds kReplyMargin{5000};

std::string quoted_list(const std::vector<std::string>& keys, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max_shown; ++i)
    out += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  if (keys.size() > max_shown) out += fmt::format(" and {} more", keys.size() - max_shown);
  return out;
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<v1::Rendezvous::Stub> stub, std::string prefix,
                     std::string master, std::chrono::milliseconds rpc_timeout)
    : stub_(std::move(stub)),
      prefix_(std::move(prefix)),
      master_(std::move(master)),
      rpc_timeout_(rpc_timeout) {}

void GrpcStore::set(const std::string& key, const Bytes& value) {
  v1::SetRequest req;
  req.set_key(full(key));
  req.set_value(std::string(value.begin(), value.end()));
  v1::SetResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, rpc_timeout_);
  const grpc::Status st = stub_->Set(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("store set '{}'", key), master_);
}

Bytes GrpcStore::get(const std::string& key, Millis timeout) {
  v1::GetRequest req;
  req.set_key(full(key));
  req.set_timeout_ms(timeout.count());
  v1::GetResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, timeout + kReplyMargin);
  const grpc::Status st = stub_->Get(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("store get '{}'", key), master_);
  if (!resp.found())
    ZD_THROW_KIND(ErrorKind::kPeerLost,
                  "rendezvous store at {}: key '{}' was not set within {} ms (the rank that "
                  "sets it has not got there)",
                  master_, key, timeout.count());
  return Bytes(resp.value().begin(), resp.value().end());
}

void GrpcStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  v1::WaitRequest req;
  for (const auto& k : keys) req.add_keys(full(k));
  req.set_timeout_ms(timeout.count());
  v1::WaitResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, timeout + kReplyMargin);
  const grpc::Status st = stub_->Wait(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("store wait for {}", quoted_list(keys, 8)), master_);
  if (resp.missing_size() == 0) return;
  std::vector<std::string> missing;
  for (const auto& k : resp.missing())
    missing.push_back(k.rfind(prefix_, 0) == 0 ? k.substr(prefix_.size()) : k);
  ZD_THROW_KIND(ErrorKind::kPeerLost,
                "rendezvous store at {}: {} of {} keys not set within {} ms: {}", master_,
                missing.size(), keys.size(), timeout.count(), quoted_list(missing, 16));
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  v1::CheckRequest req;
  for (const auto& k : keys) req.add_keys(full(k));
  v1::CheckResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, rpc_timeout_);
  const grpc::Status st = stub_->Check(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("store check {}", quoted_list(keys, 8)), master_);
  return resp.ready();
}

int64_t GrpcStore::add(const std::string& key, int64_t delta) {
  v1::AddRequest req;
  req.set_key(full(key));
  req.set_delta(delta);
  v1::AddResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, rpc_timeout_);
  const grpc::Status st = stub_->Add(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("store add '{}'", key), master_);
  return resp.value();
}

}  // namespace zerod
