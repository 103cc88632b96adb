// The snapshot section (zerod's in-memory snapshots of an elastic job, docs/elastic.md): its
// keys, defaults and errors naming the JSON path and value.
#include <gtest/gtest.h>

#include "engine/config/sections.h"

namespace zerod {
namespace {

using nlohmann::json;

std::vector<std::string> read_section(const json& section, SnapshotConfig& out) {
  const json root = {{"snapshot", section}};
  config::Problems problems;
  config::ObjectReader top(root, "", problems);
  JobConfig cfg;
  config::read_snapshot(top, cfg);
  top.finish();
  out = cfg.snapshot;
  return problems.errors;
}

std::string all(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += e + "\n";
  return s;
}

TEST(SnapshotSection, ReadsItsKeysAndDefaultsToTmpfs) {
  SnapshotConfig s;
  EXPECT_TRUE(read_section({{"enabled", true}, {"interval", 2}}, s).empty());
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.interval, 2);
  EXPECT_EQ(s.dir, "/dev/shm");
  EXPECT_TRUE(read_section({{"enabled", true}, {"interval", 5}, {"dir", "/run/zd"}}, s).empty());
  EXPECT_EQ(s.dir, "/run/zd");
}

TEST(SnapshotSection, RefusesBadValuesNamingThePath) {
  SnapshotConfig s;
  std::string e = all(read_section({{"enabled", true}}, s));
  EXPECT_NE(e.find("snapshot.interval"), std::string::npos) << e;
  EXPECT_NE(e.find("required when snapshot.enabled"), std::string::npos) << e;
  e = all(read_section({{"enabled", true}, {"interval", 0}}, s));
  EXPECT_NE(e.find("snapshot.interval"), std::string::npos) << e;
  e = all(read_section({{"enabled", true}, {"interval", 2}, {"dir", ""}}, s));
  EXPECT_NE(e.find("snapshot.dir"), std::string::npos) << e;
  e = all(read_section({{"enabled", true}, {"interval", 2}, {"intervall", 3}}, s));
  EXPECT_NE(e.find("snapshot.intervall"), std::string::npos) << e;
}

}  // namespace
}  // namespace zerod
