// MemoryStore, PrefixStore and FileStore: set/get/wait/check/add semantics, timeouts that name
// the missing keys, key escaping, and add() racing from many threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "comm/file_store.h"
#include "comm/store.h"
#include "core/error.h"

namespace zerod {
namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

Bytes bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string text(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/zerod-store-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The same checks for every Store implementation.
class StoreSemantics : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_shared<MemoryStore>();
    } else if (GetParam() == "prefix") {
      inner_ = std::make_shared<MemoryStore>();
      store_ = std::make_shared<PrefixStore>("job7", inner_);
    } else {
      store_ = std::make_shared<FileStore>(dir_.path() + "/nested/dir");
    }
  }
  TempDir dir_;
  std::shared_ptr<MemoryStore> inner_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreSemantics, SetGetOverwriteCheck) {
  Store& s = *store_;
  EXPECT_FALSE(s.check({"a"}));
  s.set("a", bytes("one"));
  EXPECT_EQ(text(s.get("a", Ms(0))), "one");
  s.set("a", bytes("two"));
  EXPECT_EQ(text(s.get("a", Ms(0))), "two");
  s.set("empty", {});
  EXPECT_TRUE(s.get("empty", Ms(0)).empty());
  EXPECT_TRUE(s.check({"a", "empty"}));
  EXPECT_FALSE(s.check({"a", "b"}));
  Bytes binary = {0, 255, 10, 0, 7};
  s.set("bin", binary);
  EXPECT_EQ(s.get("bin", Ms(0)), binary);
}

TEST_P(StoreSemantics, KeysWithSlashesAndOddBytes) {
  Store& s = *store_;
  s.set("gloo/comm0/rank_1", bytes("x"));
  s.set("gloo%2Fcomm0%2Frank_1", bytes("y"));  // must not collide with the escaped form
  s.set(".hidden", bytes("h"));
  s.set("sp ace/..", bytes("z"));
  EXPECT_EQ(text(s.get("gloo/comm0/rank_1", Ms(0))), "x");
  EXPECT_EQ(text(s.get("gloo%2Fcomm0%2Frank_1", Ms(0))), "y");
  EXPECT_EQ(text(s.get(".hidden", Ms(0))), "h");
  EXPECT_EQ(text(s.get("sp ace/..", Ms(0))), "z");
  EXPECT_FALSE(s.check({"gloo"}));
}

TEST_P(StoreSemantics, GetWaitsForALaterSet) {
  Store& s = *store_;
  std::thread setter([&] {
    std::this_thread::sleep_for(Ms(50));
    s.set("late", bytes("here"));
  });
  const auto t0 = Clock::now();
  EXPECT_EQ(text(s.get("late", Ms(5000))), "here");
  EXPECT_GE(Clock::now() - t0, Ms(40));
  setter.join();
}

TEST_P(StoreSemantics, WaitWaitsForEveryKey) {
  Store& s = *store_;
  s.set("k0", {});
  std::thread setter([&] {
    std::this_thread::sleep_for(Ms(30));
    s.set("k1", {});
    std::this_thread::sleep_for(Ms(30));
    s.set("k2", {});
  });
  const auto t0 = Clock::now();
  s.wait({"k0", "k1", "k2"}, Ms(5000));
  EXPECT_GE(Clock::now() - t0, Ms(50));
  EXPECT_TRUE(s.check({"k0", "k1", "k2"}));
  setter.join();
}

TEST_P(StoreSemantics, TimeoutsNameTheMissingKeys) {
  Store& s = *store_;
  const std::string p = GetParam() == "prefix" ? "job7/" : "";  // errors name the full key
  s.set("present", {});
  const auto t0 = Clock::now();
  try {
    s.get("absent", Ms(100));
    ADD_FAILURE() << "get of an absent key returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    const std::string m = e.what();
    EXPECT_NE(m.find("'" + p + "absent'"), std::string::npos) << m;
    EXPECT_NE(m.find("100 ms"), std::string::npos) << m;
  }
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, Ms(95));
  EXPECT_LT(waited, Ms(1000));
  try {
    s.wait({"present", "m1", "m2"}, Ms(50));
    ADD_FAILURE() << "wait for absent keys returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    const std::string m = e.what();
    EXPECT_NE(m.find("'" + p + "m1', '" + p + "m2'"), std::string::npos) << m;
    EXPECT_EQ(m.find("present'"), std::string::npos) << m;
  }
}

TEST_P(StoreSemantics, AddCountsAtomically) {
  Store& s = *store_;
  EXPECT_EQ(s.add("counter", 5), 5);
  EXPECT_EQ(s.add("counter", -2), 3);
  EXPECT_EQ(text(s.get("counter", Ms(0))), "3");
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) s.add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s.add("counter", 0), 3 + kThreads * kAdds);
  s.set("text", bytes("not a number"));
  EXPECT_THROW(s.add("text", 1), Error);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreSemantics, ::testing::Values("memory", "prefix", "file"));

TEST(PrefixStore, KeysLiveUnderThePrefixOfTheInnerStore) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore a("job1", inner), b("job2", inner);
  a.set("k", bytes("1"));
  b.set("k", bytes("2"));
  EXPECT_EQ(text(inner->get("job1/k", Ms(0))), "1");
  EXPECT_EQ(text(inner->get("job2/k", Ms(0))), "2");
  EXPECT_EQ(text(a.get("k", Ms(0))), "1");
  EXPECT_TRUE(a.check({"k"}));
  EXPECT_FALSE(a.check({"job1/k"}));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(text(inner->get("job1/n", Ms(0))), "2");
  PrefixStore nested("comm3", std::make_shared<PrefixStore>("job1", inner));
  nested.set("x", {});
  EXPECT_TRUE(inner->check({"job1/comm3/x"}));
}

TEST(FileStore, EscapesKeysIntoPlainFileNames) {
  EXPECT_EQ(FileStore::file_name("rank_1"), "rank_1");
  EXPECT_EQ(FileStore::file_name("a/b"), "a%2Fb");
  EXPECT_EQ(FileStore::file_name("100%"), "100%25");
  EXPECT_EQ(FileStore::file_name(".x.y"), "%2Ex.y");
  EXPECT_EQ(FileStore::file_name(".."), "%2E.");
  EXPECT_THROW(FileStore::file_name(""), Error);
}

TEST(FileStore, TwoStoresOverOneDirectorySeeEachOther) {
  TempDir dir;
  FileStore a(dir.path()), b(dir.path());
  a.set("gloo/0", bytes("addr"));
  EXPECT_EQ(text(b.get("gloo/0", Ms(0))), "addr");
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/gloo%2F0"));
  EXPECT_EQ(b.add("n", 1), 1);
  EXPECT_EQ(a.add("n", 1), 2);
  // Only the lock file and the keys: no temporary files are left behind.
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const auto name = entry.path().filename().string();
    EXPECT_TRUE(name == ".lock" || name == "gloo%2F0" || name == "n") << name;
  }
}

TEST(FileStore, UnusableDirectoryIsAnError) {
  TempDir dir;
  const std::string file = dir.path() + "/file";
  FileStore(dir.path()).set("file", {});  // a regular file where a directory should go
  EXPECT_THROW(FileStore(file + "/sub"), Error);
}

}  // namespace
}  // namespace zerod
