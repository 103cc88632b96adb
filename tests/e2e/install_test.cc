// `cmake --install build --prefix P` puts the commands in P/bin and the example jobs in
// P/share/zerod/configs, and the installed zerod checks an installed config.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "process_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::Process;
using namespace std::chrono_literals;

TEST(Install, PutsTheCommandsAndExampleConfigsUnderThePrefix) {
  const fs::path dir = fs::temp_directory_path() / ("zerod_install_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir / "work");
  const fs::path prefix = dir / "prefix";
  {
    Process install(
        {ZEROD_CMAKE_COMMAND, "--install", ZEROD_BINARY_DIR, "--prefix", prefix.string()},
        dir.string(), (dir / "install.log").string());
    ASSERT_EQ(install.wait_for(120s), 0) << install.output();
  }
  for (const char* bin : {"zerod", "zeroctl", "zerod-shards", "zerod-plot"}) {
    const fs::path p = prefix / "bin" / bin;
    EXPECT_EQ(::access(p.c_str(), X_OK), 0) << p << " is missing or not executable";
  }
  // Every example job, and nothing else.
  std::set<std::string> want, got;
  for (const auto& e : fs::directory_iterator(fs::path(ZEROD_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".json") want.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(prefix / "share/zerod/configs", ec))
    got.insert(e.path().filename().string());
  EXPECT_EQ(got, want);
  EXPECT_FALSE(fs::exists(prefix / "bin/zerod_train_bench"))
      << "the benchmarks are the bench component only";

  // The installed zerod works away from the build tree (from another directory), and every
  // installed example job passes its check (--config-only: they name data, GPUs and NVMe paths
  // of other machines).
  ASSERT_TRUE(fs::exists(prefix / "share/zerod/configs/tiny.json"));
  for (const std::string& name : want) {
    const fs::path config = prefix / "share/zerod/configs" / name;
    Process check({(prefix / "bin/zerod").string(), "check", "--config-only", config.string()},
                  (dir / "work").string(), (dir / "check.log").string());
    ASSERT_EQ(check.wait_for(60s), 0) << config << "\n" << check.output();
    EXPECT_NE(check.output().find("\"train_batch_size\""), std::string::npos) << check.output();
  }
  {
    Process help({(prefix / "bin/zeroctl").string(), "--help"}, (dir / "work").string(),
                 (dir / "zeroctl.log").string());
    EXPECT_EQ(help.wait_for(60s), 0) << help.output();
  }
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace zerod
