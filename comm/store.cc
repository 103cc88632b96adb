#include "comm/store.h"

#include <charconv>

#include "core/error.h"

namespace zerod {

namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + k + "'";
  }
  return out;
}

}  // namespace

std::string store_missing_keys_message(const std::vector<std::string>& missing, Millis timeout) {
  return fmt::format("store key{} {} {} not set within {} ms", missing.size() == 1 ? "" : "s",
                     join_keys(missing), missing.size() == 1 ? "was" : "were", timeout.count());
}

int64_t store_parse_counter(const std::string& key, const Bytes& value) {
  int64_t v = 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, v);
  ZD_CHECK(ec == std::errc() && ptr == end && !value.empty(),
           "store key '{}' holds '{}', not a decimal counter (add() keeps counters as ASCII "
           "decimal)",
           key, std::string(begin, end));
  return v;
}

Bytes store_format_counter(int64_t value) {
  std::string s = std::to_string(value);
  return Bytes(s.begin(), s.end());
}

// ---------------------------------------------------------------------------------------------
// MemoryStore
// ---------------------------------------------------------------------------------------------

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool found = cv_.wait_for(lock, timeout, [&] { return data_.find(key) != data_.end(); });
  if (!found) {
    ZD_THROW_KIND(ErrorKind::kPeerLost, "{}", store_missing_keys_message({key}, timeout));
  }
  return data_.at(key);
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys) {
      if (data_.find(k) == data_.end()) out.push_back(k);
    }
    return out;
  };
  if (!cv_.wait_for(lock, timeout, [&] { return missing().empty(); })) {
    ZD_THROW_KIND(ErrorKind::kPeerLost, "{}", store_missing_keys_message(missing(), timeout));
  }
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) value = store_parse_counter(key, it->second);
    value += delta;
    data_[key] = store_format_counter(value);
  }
  cv_.notify_all();
  return value;
}

// ---------------------------------------------------------------------------------------------
// PrefixStore
// ---------------------------------------------------------------------------------------------

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  inner_->wait(prefixed(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return inner_->check(prefixed(keys));
}

}  // namespace zerod
