// Our Store seen as Gloo's rendezvous store, for connectFullMesh (comm/gloo/). Every wait is
// bounded by one deadline (the communicator's creation timeout), however many keys Gloo asks
// for one after another.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>

#include "comm/store.h"

namespace zerod::gloo_backend {

class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(zerod::Store& store, std::chrono::steady_clock::time_point deadline)
      : store_(store), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  Millis remaining(Millis cap = Millis::max()) const;

  zerod::Store& store_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace zerod::gloo_backend
