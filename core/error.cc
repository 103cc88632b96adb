#include "core/error.h"

#include <cstring>

namespace zerod {

namespace {
std::string make_where(const char* file, int line) {
  if (file == nullptr) return {};
  const char* base = std::strrchr(file, '/');
  return fmt::format("{}:{}", base ? base + 1 : file, line);
}
}  // namespace

Error::Error(ErrorKind kind, std::string message, const char* file, int line)
    : std::runtime_error(std::move(message)), kind_(kind), where_(make_where(file, line)) {}

}  // namespace zerod
