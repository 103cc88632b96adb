// The aio engine: round trips over odd sizes, offsets, block sizes, queue depths, thread
// counts and submit modes; the refusals (missing or unwritable path, a full disk).
#include "offload/aio/aio_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

class Aio : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zerod_aio_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void fill(AlignedBuffer& b, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  for (int64_t i = 0; i < n; ++i) b.data()[i] = static_cast<char>(g());
}

TEST_F(Aio, RoundTripsEveryShapeOfRequest) {
  const int64_t sizes[] = {1, 4096, 4097, (300 << 10) + 17};
  const int64_t offsets[] = {4096, 1 << 20};
  int checked = 0;
  for (const int64_t block : {int64_t{4096}, int64_t{128} << 10, int64_t{1} << 20}) {
    for (const int depth : {1, 32}) {
      for (const int threads : {1, 3}) {
        for (const bool single : {false, true}) {
          AioOptions o;
          o.block_size = block;
          o.queue_depth = depth;
          o.threads = threads;
          o.single_submit = single;
          o.overlap_events = !single;  // both settings of each, in different combinations
          AioEngine e(o);
          const fs::path path = dir_ / "f.bin";
          AioFile f(path.string(), AioFile::Mode::kCreate);
          for (const int64_t size : sizes) {
            for (const int64_t off : offsets) {
              AlignedBuffer out(size), in(size);
              fill(out, size, static_cast<uint32_t>(size + off + block));
              const int64_t w = e.write(f, off, out, size);
              EXPECT_GE(w, size);
              ASSERT_EQ(e.read(f, off, in, size), size);
              ASSERT_EQ(std::memcmp(in.data(), out.data(), static_cast<size_t>(size)), 0)
                  << "size " << size << " offset " << off << " block " << block << " depth "
                  << depth << " threads " << threads << " single_submit " << single;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 2 * 2 * 4 * 2);
}

TEST_F(Aio, ReadsStopAtTheEndOfTheFile) {
  AioEngine e({});
  AioFile f((dir_ / "short.bin").string(), AioFile::Mode::kCreate);
  AlignedBuffer out(10000), in(1 << 20);
  fill(out, 10000, 1);
  e.write(f, 0, out, 10000);
  // With O_DIRECT the file holds whole blocks (12288 bytes); buffered, exactly 10000.
  const int64_t got = e.read(f, 0, in, 1 << 20);
  EXPECT_EQ(got, f.direct() ? 12288 : 10000);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 10000), 0);
  EXPECT_EQ(e.read(f, 1 << 20, in, 4096), 0);  // past the end
}

TEST_F(Aio, BadPathsAndAFullDiskAreClearErrors) {
  try {
    AioFile f((dir_ / "no" / "such" / "dir" / "x.bin").string(), AioFile::Mode::kCreate);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.bin"), std::string::npos) << e.what();
  }
  // Not writable, even by root: /proc.
  EXPECT_THROW(AioFile("/proc/zerod_aio_test.bin", AioFile::Mode::kCreate), InputError);
  // A full disk: /dev/full answers every write with ENOSPC.
  AioEngine e({});
  AioFile full("/dev/full", AioFile::Mode::kReadWrite);
  AlignedBuffer b(8192);
  fill(b, 8192, 2);
  try {
    e.write(full, 4096, b, 8192);
    ADD_FAILURE();
  } catch (const InputError& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("/dev/full"), std::string::npos) << m;
    EXPECT_NE(m.find("offset 4096"), std::string::npos) << m;
    EXPECT_NE(m.find("disk is full"), std::string::npos) << m;
  }
  // Bad options.
  AioOptions o;
  o.block_size = 1000;
  EXPECT_THROW(AioEngine{o}, InputError);
  o = {};
  o.queue_depth = 0;
  EXPECT_THROW(AioEngine{o}, InputError);
}

// Kernel errors on an O_DIRECT file, injected (ZEROD_AIO_FAULT): ENOSPC is bad input (exit 2),
// EIO a failure of the machine (exit 1, not reported as a bug); both name the file and offset
// of the failing request, and the engine works again afterwards.
TEST_F(Aio, InjectedKernelErrorsNameTheFileAndOffset) {
  AioOptions o;
  o.block_size = 4096;
  AioEngine e(o);
  const std::string path = (dir_ / "inject.bin").string();
  AioFile f(path, AioFile::Mode::kCreate);
  AlignedBuffer b(3 * 4096);
  fill(b, 3 * 4096, 5);
  ::setenv("ZEROD_AIO_FAULT", "ENOSPC:write:2:inject.bin", 1);
  e.write(f, 0, b, 4096);  // request 1 passes
  try {
    e.write(f, 8192, b, 3 * 4096);
    ADD_FAILURE() << "no error";
  } catch (const InputError& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find(path + ": write at offset 8192 failed"), std::string::npos) << m;
    EXPECT_NE(m.find("disk is full"), std::string::npos) << m;
  }
  ::setenv("ZEROD_AIO_FAULT", "EIO:read:1", 1);
  try {
    e.read(f, 4096, b, 4096);
    ADD_FAILURE() << "no error";
  } catch (const InputError&) {
    ADD_FAILURE() << "EIO reported as bad input";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kSystem);
    EXPECT_EQ(err.exit_code(), 1);
    EXPECT_NE(std::string(err.what()).find("read at offset 4096 failed: Input/output error"),
              std::string::npos)
        << err.what();
  }
  ::unsetenv("ZEROD_AIO_FAULT");
  EXPECT_EQ(e.read(f, 0, b, 4096), 4096);
}

}  // namespace
}  // namespace zerod
