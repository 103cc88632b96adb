#include "core/error.h"

#include <cstdio>
#include <cstring>
#include <exception>

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

int report_current_exception(const char* program) {
  try {
    throw;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInternal) {
      std::fprintf(stderr, "%s: internal error (%s): %s\n", program, e.where().c_str(), e.what());
    } else {
      std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    }
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: internal error: unknown exception\n", program);
  }
  return 1;
}

}  // namespace zerod
