// Runs a command to its end through the shell, bounded by `timeout 120`: its exit code and
// stdout + stderr together. For tests of the command-line tools.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace zerod::testing {

struct RunResult {
  int code = -1;
  std::string output;  // stdout + stderr
};

// `binary args` in `cwd` (args as the shell reads them).
inline RunResult run_in(const std::filesystem::path& cwd, const std::string& binary,
                        const std::string& args) {
  const std::string cmd =
      "cd '" + cwd.string() + "' && timeout 120 " + binary + " " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace zerod::testing
