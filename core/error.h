// Errors are exceptions with context. Every error carries a kind that maps to the process exit
// code at main(): bad input (config, data, flags) exits 2, a lost peer exits 3, a bug or a
// failure of the machine (a disk's I/O error) exits 1.
// Nothing below main() calls exit(); worker threads hand exceptions back to their caller.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace zerod {

enum class ErrorKind : int {
  kInternal = 1,  // a bug or an unexpected system failure
  kBadInput = 2,  // config, data file, flag or request the user can fix
  kPeerLost = 3,  // a peer rank/node died or a collective timed out
  kSystem = 4,    // the machine failed under us (EIO from a disk): exit 1, not reported as a bug
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, const char* file = nullptr, int line = 0);

  ErrorKind kind() const { return kind_; }
  int exit_code() const { return kind_ == ErrorKind::kSystem ? 1 : static_cast<int>(kind_); }
  // "file:line" of the throw site, empty when unknown.
  const std::string& where() const { return where_; }

 private:
  ErrorKind kind_;
  std::string where_;
};

// Bad user input: exit code 2. The message names what was wrong (path, value, allowed).
class InputError : public Error {
 public:
  explicit InputError(std::string message, const char* file = nullptr, int line = 0)
      : Error(ErrorKind::kBadInput, std::move(message), file, line) {}
};

// For main(): prints "PROGRAM: error: ..." (or "internal error (where)") to stderr for the
// exception being handled and returns the exit code (1 for anything not a zerod::Error).
// Call only inside a catch block.
int report_current_exception(const char* program);

}  // namespace zerod

#define ZD_THROW_KIND(kind, ...) \
  throw ::zerod::Error((kind), ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
// Internal invariant failure (exit 1).
#define ZD_THROW(...) ZD_THROW_KIND(::zerod::ErrorKind::kInternal, __VA_ARGS__)
// Bad user input (exit 2).
#define ZD_THROW_INPUT(...) \
  throw ::zerod::InputError(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
#define ZD_CHECK(cond, ...)                                                           \
  do {                                                                                \
    if (!(cond)) ZD_THROW("check failed: " #cond ": {}", ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define ZD_CHECK_INPUT(cond, ...)             \
  do {                                        \
    if (!(cond)) ZD_THROW_INPUT(__VA_ARGS__); \
  } while (0)
