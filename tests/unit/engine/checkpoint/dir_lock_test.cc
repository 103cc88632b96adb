// The checkpoint directory lock: one holder at a time (in this process or another), the holder
// named in the refusal, and a lock whose process died (kill -9) taken over at once.
#include "engine/checkpoint/dir_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "core/error.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

class DirLock : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zerod_dirlock_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return (dir_ / "ckpt").string(); }
  fs::path dir_;
};

std::string refusal(const std::string& dir) {
  try {
    CheckpointDirLock second(dir, "train.checkpoint_dir", "b.json");
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "a second lock of " << dir << " was granted";
  return {};
}

TEST_F(DirLock, OneHolderAtATimeNamedInTheRefusal) {
  {
    CheckpointDirLock first(dir(), "train.checkpoint_dir", "a.json");
    EXPECT_TRUE(fs::is_directory(dir()));  // created when missing
    const std::string msg = refusal(dir());
    EXPECT_NE(msg.find("train.checkpoint_dir: " + dir() + " is in use by another zerod job"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find("job a.json"), std::string::npos) << msg;
  }
  // Released with its holder, and the directory it made, still empty, is gone again.
  EXPECT_FALSE(fs::exists(dir()));
  fs::create_directories(dir());
  {
    CheckpointDirLock again(dir(), "train.checkpoint_dir", "c.json");
    EXPECT_FALSE(again.created());
    std::ofstream(fs::path(dir()) / "global_step1") << "x";
  }
  // A directory it did not make, or one with checkpoints, stays.
  EXPECT_TRUE(fs::exists(fs::path(dir()) / "global_step1"));
}

TEST_F(DirLock, ALockHeldByAnotherProcessIsRefusedAndTakenOverOnceItIsKilled) {
  fs::create_directories(dir());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      CheckpointDirLock held(dir(), "train.checkpoint_dir", "child.json");
      const char c = 'x';
      if (::write(ready[1], &c, 1) != 1) ::_exit(1);
      ::pause();  // until killed
    } catch (...) {
    }
    ::_exit(1);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string msg = refusal(dir());
  EXPECT_NE(msg.find("pid " + std::to_string(child)), std::string::npos) << msg;
  EXPECT_NE(msg.find("job child.json"), std::string::npos) << msg;
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // The dead holder's lock file remains; its lock does not.
  EXPECT_TRUE(fs::exists(fs::path(dir()) / ".zerod.lock"));
  EXPECT_NO_THROW(CheckpointDirLock mine(dir(), "train.checkpoint_dir", "after.json"));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(DirLock, AnUncreatableDirectoryIsBadInput) {
  std::ofstream(dir_.string()) << "a file";
  EXPECT_THROW(CheckpointDirLock l((dir_ / "sub").string(), "train.checkpoint_dir", "x"),
               InputError);
  fs::remove(dir_);
}

}  // namespace
}  // namespace zerod
