#include "comm/gloo/store_adapter.h"

#include <algorithm>

namespace zerod::gloo_backend {

Millis StoreAdapter::remaining(Millis cap) const {
  auto left = std::chrono::duration_cast<Millis>(deadline_ - std::chrono::steady_clock::now());
  return std::clamp(left, Millis(0), cap);
}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  Bytes v = store_.get(key, remaining());
  return std::vector<char>(v.begin(), v.end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) {
  store_.wait(keys, remaining());
}

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& timeout) {
  store_.wait(keys, remaining(timeout));
}

}  // namespace zerod::gloo_backend
