// The JSON a reference script writes (Debian's /usr/bin/python3 with python3-torch): runs
// tests/unit/kernels/<script> with a temporary output path; null when the script fails (no
// python3 or torch: the caller skips).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// Every element of got within 1e-6 relative (+1e-12) of want's.
template <class T>
void expect_close_to_reference(const std::vector<T>& got, const nlohmann::json& want,
                               const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>(), g = got[i];
    const double err = std::fabs(g - w);
    if (err > 1e-6 * std::fabs(w) + 1e-12) ++bad;
    if (w != 0) worst = std::max(worst, err / std::fabs(w));
  }
  EXPECT_EQ(bad, 0) << what << ": elements beyond 1e-6 relative (worst " << worst << ")";
}

}  // namespace zerod::testing
