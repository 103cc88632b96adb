// Rendezvous key-value store (DESIGN.md section 4). Ranks bootstrap their collectives through
// it (Gloo exchanges addresses, NCCL its unique id). MemoryStore serves ranks that are threads
// of one process; the gRPC store (engine/runtime/) serves ranks in other processes through the
// Rendezvous service of the master zerod.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  // Sets key to value (overwrites).
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The value of key, waiting up to timeout for it to be set; throws Error(kPeerLost) naming
  // the key and the timeout when it is not.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Waits until every key is set; throws Error(kPeerLost) naming the missing keys on timeout.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // True when every key is set (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Atomically adds delta to the integer stored at key (0 when unset); returns the new value.
  // The counter is stored as ASCII decimal ("42"), so get() of a counter key reads it as text.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// Helpers shared by the Store implementations.
// "store key 'a' was not set within 2000 ms" / "store keys 'a', 'b' were not set within ...".
std::string store_missing_keys_message(const std::vector<std::string>& missing, Millis timeout);
// The counter value of an add() key; throws Error(kInternal) when it does not hold a decimal.
int64_t store_parse_counter(const std::string& key, const Bytes& value);
Bytes store_format_counter(int64_t value);

// In-process store for ranks that are threads of one process. Thread-safe.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

// Every key of `inner` under "prefix/" (separate namespaces for jobs, communicators, retries).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix) + "/"), inner_(std::move(inner)) {}
  void set(const std::string& key, const Bytes& value) override {
    inner_->set(prefix_ + key, value);
  }
  Bytes get(const std::string& key, Millis timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace zerod
