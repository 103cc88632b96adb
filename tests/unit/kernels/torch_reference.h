// The JSON a reference script writes (Debian's /usr/bin/python3 with python3-torch): runs
// tests/unit/kernels/<script> with a temporary output path; null when the script fails (no
// python3 or torch: the caller skips).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace zerod::testing {

inline nlohmann::json run_torch_reference(const std::string& script) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() /
                       ("zerod_ref_" + std::to_string(::getpid()) + "_" + script + ".json");
  const std::string cmd =
      "/usr/bin/python3 " ZEROD_SOURCE_DIR "/tests/unit/kernels/" + script + " " + out.string();
  nlohmann::json j;
  if (std::system(cmd.c_str()) == 0) {
    std::ifstream in(out);
    j = nlohmann::json::parse(in);
  }
  fs::remove(out);
  return j;
}

}  // namespace zerod::testing
