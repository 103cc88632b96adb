// The little binary files of the 1-bit optimizers' checkpoint state (zero/onebit.h): appending
// raw values, and reading them back with bounds and an 8-byte magic checked (InputError).
#pragma once

#include <cstring>
#include <string>

#include "core/error.h"

namespace zerod::onebit_bytes {

inline void put(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}

class Reader {
 public:
  // Checks the file starts with magic (8 bytes); `what` names the file in errors.
  Reader(const std::string& bytes, const std::string& what, const char (&magic)[8])
      : bytes_(bytes), what_(what) {
    char m[8];
    take(m, sizeof(m));
    if (std::memcmp(m, magic, sizeof(m)) != 0)
      ZD_THROW_INPUT("{}: not a zerod 1-bit optimizer state file", what_);
  }
  void take(void* p, size_t n) {
    if (at_ + n > bytes_.size()) ZD_THROW_INPUT("{}: truncated ({} bytes)", what_, bytes_.size());
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
  }
  size_t left() const { return bytes_.size() - at_; }

 private:
  const std::string& bytes_;
  const std::string& what_;
  size_t at_ = 0;
};

}  // namespace zerod::onebit_bytes
