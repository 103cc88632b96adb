// The live progress line (core/log.h): drawn only on a terminal (a pseudo-terminal here, never a
// pipe), redrawn in place, erased before every log line and drawn again after it.
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <string>

#include "core/log.h"

namespace zerod {
namespace {

// What is waiting to be read on `fd` (non-blocking after a short wait).
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  for (int i = 0; i < 50; ++i) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(fd, &set);
    timeval tv{0, 20000};
    if (::select(fd + 1, &set, nullptr, nullptr, &tv) <= 0) break;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST(ProgressLine, DrawnInPlaceOnATerminalAndAroundLogLines) {
  log::init();
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  log::set_progress_fd_for_test(slave);
  EXPECT_TRUE(log::progress_enabled());
  log::set_progress("step 1/10");
  log::set_progress("step 2/10");
  EXPECT_EQ(drain(master), "\r\033[Kstep 1/10\r\033[Kstep 2/10");
  spdlog::info("a log line");  // (to stdout) erases the progress line first, then redraws it
  EXPECT_EQ(drain(master), "\r\033[Kstep 2/10");
  log::clear_progress();
  EXPECT_EQ(drain(master), "\r\033[K");
  spdlog::info("another line");  // nothing shown: nothing to erase or redraw
  EXPECT_EQ(drain(master), "");
  log::set_progress_fd_for_test(-1);
  ::close(slave);
  ::close(master);
}

TEST(ProgressLine, NeverDrawnIntoAPipeOrFile) {
  log::init();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  log::set_progress_fd_for_test(fds[1]);
  EXPECT_FALSE(log::progress_enabled());
  log::set_progress("step 1/10");
  spdlog::info("a log line");
  log::clear_progress();
  ::close(fds[1]);
  EXPECT_EQ(drain(fds[0]), "");
  log::set_progress_fd_for_test(-1);
  ::close(fds[0]);
}

}  // namespace
}  // namespace zerod
