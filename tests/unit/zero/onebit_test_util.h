// Shared by the 1-bit optimizer tests (onebit_lamb_test.cc, zeroone_adam_test.cc): a small GPT-2
// whose padded vocabulary rows are masked, and running a Python reference on a JSON problem.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/layout.h"

namespace zerod::test {

inline ModelSpec onebit_small_spec() {
  ModelSpec s;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_embd = 20;
  s.vocab_size = 50;  // padded: rows past 50 are not live
  s.seq_len = 7;
  return s;
}

// Runs `/usr/bin/python3 SOURCE/script IN OUT` on `in` and returns OUT's JSON (a test failure
// when the script fails). script: relative to the source tree.
inline nlohmann::json run_python_reference(const std::string& script, const nlohmann::json& in) {
  namespace fs = std::filesystem;
  const std::string base =
      (fs::temp_directory_path() / ("zerod_ref_" + std::to_string(::getpid()))).string();
  std::ofstream(base + ".in.json") << in.dump();
  const std::string cmd = std::string("/usr/bin/python3 ") + ZEROD_SOURCE_DIR + "/" + script + " " +
                          base + ".in.json " + base + ".out.json";
  EXPECT_EQ(std::system(cmd.c_str()), 0)
      << script << " failed: it needs /usr/bin/python3 with torch and numpy";
  nlohmann::json out;
  {
    std::ifstream f(base + ".out.json");
    if (f) out = nlohmann::json::parse(f);
  }
  fs::remove(base + ".in.json");
  fs::remove(base + ".out.json");
  return out;
}

}  // namespace zerod::test
