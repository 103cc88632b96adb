// The elastic host lease (engine/runtime/elastic_host_lease.h): written and read back, aged by
// its mtime, refused to a host whose term was overtaken (without overwriting the newer term), and
// unreadable files read as none.
#include "engine/runtime/elastic_host_lease.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace zerod {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ElasticHostLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_lease_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(ElasticHostLeaseTest, WrittenAndReadBackWithItsAge) {
  const std::string path = ElasticHostLease::path_in((dir_ / "ckpt").string());
  EXPECT_FALSE(ElasticHostLease::read(path));                   // none yet
  ElasticHostLease lease(path, 3, "127.0.0.1:2345", 1, "abc");  // makes the directory
  const auto r = ElasticHostLease::read(path);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->term, 3);
  EXPECT_EQ(r->address, "127.0.0.1:2345");
  EXPECT_EQ(r->node_rank, 1);
  EXPECT_EQ(r->instance, "abc");
  EXPECT_LT(r->age_seconds, 1.0);
  fs::last_write_time(path, fs::file_time_type::clock::now() - 10s);
  EXPECT_GT(ElasticHostLease::read(path)->age_seconds, 9.0);
  EXPECT_TRUE(lease.refresh());
  EXPECT_LT(ElasticHostLease::read(path)->age_seconds, 1.0);
}

TEST_F(ElasticHostLeaseTest, AHostWhoseTermWasOvertakenIsRefusedAndLeavesTheNewerTerm) {
  const std::string path = ElasticHostLease::path_in(dir_.string());
  ElasticHostLease old_host(path, 1, "127.0.0.1:2345", 0, "old");
  ElasticHostLease successor(path, 2, "127.0.0.1:2345", 1, "new");
  EXPECT_FALSE(old_host.refresh());
  EXPECT_EQ(ElasticHostLease::read(path)->instance, "new");
  EXPECT_TRUE(successor.refresh());
}

TEST_F(ElasticHostLeaseTest, AnUnreadableLeaseIsNone) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "elastic_host") << "term x address\n";
  EXPECT_FALSE(ElasticHostLease::read((dir_ / "elastic_host").string()));
}

}  // namespace
}  // namespace zerod
