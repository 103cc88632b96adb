// A Store (comm/store.h) over the Rendezvous service's key-value store: how ranks in other
// processes bootstrap their collectives. Every key lives under `prefix` (the session id), so
// a re-run against the same master never reads a previous run's keys. Waiting happens on the
// server (Get/Wait carry the timeout); the client's own deadline is that plus a margin.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/store.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class GrpcStore : public Store {
 public:
  // `master` ("HOST:PORT") names the server in errors; `rpc_timeout` bounds Set/Check/Add.
  GrpcStore(std::shared_ptr<v1::Rendezvous::Stub> stub, std::string prefix, std::string master,
            std::chrono::milliseconds rpc_timeout);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<v1::Rendezvous::Stub> stub_;
  std::string prefix_;
  std::string master_;
  std::chrono::milliseconds rpc_timeout_;
};

}  // namespace zerod
