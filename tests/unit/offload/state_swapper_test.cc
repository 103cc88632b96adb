// The NVMe state swapper: sub-group round trips through every buffer count and pipeline mode,
// partial ranges, the host-buffer bound, read-ahead order, and I/O errors (an injected EIO, a
// disk too small for the file).
#include "offload/state_swapper.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/process_memory.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

class Swapper : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zerod_swap_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::unsetenv("ZEROD_AIO_FAULT");
    fs::remove_all(dir_);
  }
  std::string file() const { return (dir_ / "opt.swp").string(); }
  fs::path dir_;
};

float value(int state, int64_t i, int round) {
  return static_cast<float>(state * 1000003 + i * 7 + round) * 0.5f;
}

using Mode = StateSwapper::Mode;

TEST_F(Swapper, RoundTripsEveryBufferCountAndPipelineMode) {
  const int64_t elems = 10 * 1024 + 7;  // 11 sub-groups of 1024, the last one of 7
  int checked = 0;
  for (const int buffers : {1, 2, 4}) {
    for (const bool pr : {false, true}) {
      for (const bool pw : {false, true}) {
        SwapOptions o;
        o.group_elems = 1000;  // rounded up to 1024 (one 4 KiB block per state)
        o.buffer_count = buffers;
        o.pipeline_read = pr;
        o.pipeline_write = pw;
        o.aio.block_size = 4096;
        StateSwapper sw(file(), elems, o, nullptr);
        ASSERT_EQ(sw.group_elems(), 1024);
        ASSERT_EQ(sw.num_groups(), 11);
        int64_t seen = 0;
        sw.visit(Mode::kOverwrite, 0, elems,
                 [&](int64_t b, int64_t e, float* m, float* a, float* v) {
                   EXPECT_EQ(b, seen);
                   for (int64_t i = b; i < e; ++i) {
                     m[i - b] = value(0, i, 0);
                     a[i - b] = value(1, i, 0);
                     v[i - b] = value(2, i, 0);
                   }
                   seen = e;
                 });
        ASSERT_EQ(seen, elems);
        // An update over an unaligned middle range leaves the rest alone.
        const int64_t lo = 1500, hi = 7 * 1024 + 3;
        sw.visit(Mode::kUpdate, lo, hi, [&](int64_t b, int64_t e, float* m, float* a, float* v) {
          for (int64_t i = b; i < e; ++i) {
            ASSERT_EQ(m[i - b], value(0, i, 0)) << i;
            m[i - b] += 1;
            a[i - b] += 2;
            v[i - b] += 3;
          }
        });
        // A partial overwrite keeps the neighbours in the same sub-groups.
        sw.visit(Mode::kOverwrite, 5, 9, [&](int64_t b, int64_t e, float* m, float*, float*) {
          for (int64_t i = b; i < e; ++i) m[i - b] = -1;
        });
        int64_t bad = 0;
        sw.visit(Mode::kRead, 0, elems, [&](int64_t b, int64_t e, float* m, float* a, float* v) {
          for (int64_t i = b; i < e; ++i) {
            const bool upd = i >= lo && i < hi;
            const float wm = i >= 5 && i < 9 ? -1.0f : value(0, i, 0) + (upd ? 1.0f : 0.0f);
            bad += m[i - b] != wm;
            bad += a[i - b] != value(1, i, 0) + (upd ? 2.0f : 0.0f);
            bad += v[i - b] != value(2, i, 0) + (upd ? 3.0f : 0.0f);
          }
        });
        EXPECT_EQ(bad, 0) << "buffers " << buffers << " pipeline_read " << pr << " write " << pw;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12);
  EXPECT_FALSE(fs::exists(file())) << "the swap file outlives its swapper";
}

TEST_F(Swapper, HostHoldsOnlyTheBuffersWhileTheFileHoldsTheStates) {
  MemoryTracker tracker;
  SwapOptions o;
  o.group_elems = 64 * 1024;  // 768 KiB per sub-group
  o.buffer_count = 3;
  const int64_t elems = 40 * 64 * 1024;  // 40 sub-groups: 30 MiB of states
  {
    StateSwapper sw(file(), elems, o, &tracker);
    EXPECT_EQ(sw.file_bytes(), 12 * elems);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(file())), 12 * elems);
    EXPECT_EQ(StateSwapper::file_bytes_for(elems, o.group_elems), sw.file_bytes());
    sw.visit(Mode::kOverwrite, 0, elems,
             [](int64_t, int64_t, float* m, float*, float*) { m[0] = 1; });
    sw.visit(Mode::kUpdate, 0, elems,
             [](int64_t, int64_t, float* m, float*, float*) { m[0] += 1; });
    EXPECT_EQ(tracker.peak(MemCategory::kSwap), 3 * 12 * o.group_elems);
    EXPECT_EQ(sw.buffer_bytes(), 3 * 12 * o.group_elems);
    EXPECT_GE(sw.file_bytes(), 13 * tracker.peak(MemCategory::kSwap));
    EXPECT_EQ(sw.stats().read_bytes, sw.file_bytes());  // the overwrite read nothing
    EXPECT_EQ(sw.stats().write_bytes, 2 * sw.file_bytes());
  }
  EXPECT_EQ(tracker.current(MemCategory::kSwap), 0);
}

TEST_F(Swapper, ResidentMemoryStaysWithinTheBuffersWhileTheStatesPassThrough) {
  // 132 MiB of states on disk pass three times through 3 buffers of 1.5 MiB; the process's
  // resident memory grows by the buffers plus a stated margin of 8 MiB (the I/O threads' stacks
  // and allocator slack), nowhere near the states' size. (O_DIRECT bypasses the page cache,
  // which RSS would not count anyway.)
  SwapOptions o;
  o.group_elems = 128 * 1024;  // 1.5 MiB per sub-group
  o.buffer_count = 3;
  o.pipeline_read = o.pipeline_write = true;
  const int64_t elems = int64_t{11} << 20;  // 11M elements x 12 bytes = 132 MiB
  const int64_t before = resident_bytes();
  ASSERT_GT(before, 0);
  StateSwapper sw(file(), elems, o, nullptr);
  sw.visit(Mode::kOverwrite, 0, sw.elems(), [](int64_t b, int64_t e, float* m, float* a, float* v) {
    for (int64_t i = 0; i < e - b; ++i) m[i] = a[i] = v[i] = static_cast<float>(b + i);
  });
  double sum = 0;
  sw.visit(Mode::kUpdate, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float*) {
    for (int64_t i = 0; i < e - b; ++i) m[i] += 1;
    sum += m[0];
  });
  int64_t bad = 0;
  sw.visit(Mode::kRead, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float* v) {
    for (int64_t i = 0; i < e - b; ++i)
      bad += m[i] != static_cast<float>(b + i) + 1 || v[i] != static_cast<float>(b + i);
  });
  EXPECT_EQ(bad, 0);
  const int64_t grown = resident_bytes() - before;
  EXPECT_GE(sw.file_bytes(), int64_t{120} << 20);
  EXPECT_LE(grown, sw.buffer_bytes() + (int64_t{8} << 20))
      << "resident memory grew by " << grown << " bytes for " << sw.file_bytes()
      << " bytes of states";
  EXPECT_GT(sum, 0);
}

TEST_F(Swapper, PipelineReadStartsTheNextSubGroupBeforeThisOneIsProcessed) {
  for (const bool pr : {false, true}) {
    SwapOptions o;
    o.group_elems = 1024;
    o.buffer_count = 3;
    o.pipeline_read = pr;
    o.pipeline_write = true;
    StateSwapper sw(file(), 5 * 1024, o, nullptr);
    const int64_t stride = 12 * 1024;
    std::vector<int64_t> started;  // reads started when sub-group g is processed
    sw.visit(Mode::kUpdate, 0, sw.elems(), [&](int64_t, int64_t, float*, float*, float*) {
      started.push_back(sw.stats().read_bytes / stride);
    });
    ASSERT_EQ(started.size(), 5u);
    for (int64_t g = 0; g < 5; ++g) {
      EXPECT_EQ(started[static_cast<size_t>(g)], pr ? std::min<int64_t>(g + 2, 5) : g + 1)
          << "pipeline_read " << pr << " sub-group " << g;
    }
  }
}

TEST_F(Swapper, PrefetchReadsTheFirstSubGroupsAheadAndOtherVisitsStillSeeTheFile) {
  SwapOptions o;
  o.group_elems = 1024;
  o.buffer_count = 3;
  o.pipeline_read = o.pipeline_write = true;
  StateSwapper sw(file(), 7 * 1024 + 5, o, nullptr);
  const int64_t stride = 12 * 1024;
  auto fill_with = [&](float base) {
    sw.visit(Mode::kOverwrite, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float*) {
      for (int64_t i = b; i < e; ++i) m[i - b] = base + static_cast<float>(i);
    });
  };
  auto check = [&](float base) {
    int64_t bad = 0;
    sw.visit(Mode::kRead, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float*) {
      for (int64_t i = b; i < e; ++i) bad += m[i - b] != base + static_cast<float>(i);
    });
    return bad;
  };
  fill_with(0);
  // A prefetch starts three reads (one per buffer) before the update visits its first piece.
  sw.prefetch();
  const int64_t before = sw.stats().read_bytes;
  std::vector<int64_t> started;
  sw.visit(Mode::kUpdate, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float*) {
    started.push_back((sw.stats().read_bytes - before) / stride);
    for (int64_t i = b; i < e; ++i) m[i - b] += 1;
  });
  ASSERT_EQ(started.size(), 8u);
  EXPECT_EQ(started[0], 0);  // (the first three were read by the prefetch)
  EXPECT_EQ(sw.stats().read_bytes - before, 5 * stride);  // 8 sub-groups, 3 prefetched
  EXPECT_EQ(check(1), 0);
  // A prefetch followed by an overwrite: the overwrite wins, and a later read sees it.
  sw.prefetch();
  fill_with(100);
  EXPECT_EQ(check(100), 0);
  // A prefetch followed by a partial read that starts elsewhere, then by the update.
  sw.prefetch();
  sw.visit(Mode::kRead, 3000, 5000, [](int64_t, int64_t, float*, float*, float*) {});
  sw.prefetch();
  sw.visit(Mode::kUpdate, 0, sw.elems(), [&](int64_t b, int64_t e, float* m, float*, float*) {
    for (int64_t i = b; i < e; ++i) m[i - b] += 1;
  });
  EXPECT_EQ(check(101), 0);
  // A pending prefetch is not repeated, and the swapper ends with it in flight.
  sw.prefetch();
  const int64_t reads = sw.stats().read_bytes;
  sw.prefetch();
  EXPECT_EQ(sw.stats().read_bytes, reads);
}

TEST_F(Swapper, AnIoErrorNamesTheFileAndOffsetAndDrainsTheRequestsInFlight) {
  SwapOptions o;
  o.group_elems = 1024;
  o.buffer_count = 4;
  o.pipeline_read = o.pipeline_write = true;
  StateSwapper sw(file(), 8 * 1024, o, nullptr);
  sw.visit(Mode::kOverwrite, 0, sw.elems(), [](int64_t, int64_t, float*, float*, float*) {});
  ::setenv("ZEROD_AIO_FAULT", "EIO:read:3:opt.swp", 1);
  int visited = 0;
  try {
    sw.visit(Mode::kUpdate, 0, sw.elems(),
             [&](int64_t, int64_t, float*, float*, float*) { ++visited; });
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file()), std::string::npos) << what;
    EXPECT_NE(what.find("read at offset " + std::to_string(2 * 12 * 1024)), std::string::npos)
        << what;
    EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
  }
  EXPECT_EQ(visited, 2);
  ::unsetenv("ZEROD_AIO_FAULT");
  // The swapper is usable again once the fault is gone.
  int after = 0;
  sw.visit(Mode::kRead, 0, sw.elems(), [&](int64_t, int64_t, float*, float*, float*) { ++after; });
  EXPECT_EQ(after, 8);
}

TEST_F(Swapper, AFailedWriteBehindIsReportedByTheNextVisit) {
  SwapOptions o;
  o.group_elems = 1024;
  o.buffer_count = 2;
  o.pipeline_read = o.pipeline_write = true;
  StateSwapper sw(file(), 2 * 1024, o, nullptr);  // two sub-groups, a buffer each
  sw.visit(Mode::kOverwrite, 0, sw.elems(), [](int64_t, int64_t, float*, float*, float*) {});
  sw.visit(Mode::kRead, 0, 1, [](int64_t, int64_t, float*, float*, float*) {});  // (drains it)
  // The update's two writes are both still in flight when it returns; the second one to start
  // fails ...
  ::setenv("ZEROD_AIO_FAULT", "EIO:write:2:opt.swp", 1);
  sw.visit(Mode::kUpdate, 0, sw.elems(), [](int64_t, int64_t, float*, float*, float*) {});
  // ... and the next visit (a checkpoint's read, say) reports it before reading anything.
  int visited = 0;
  try {
    sw.visit(Mode::kRead, 0, 1024, [&](int64_t, int64_t, float*, float*, float*) { ++visited; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file() + ": write at offset "), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(visited, 0);
  ::unsetenv("ZEROD_AIO_FAULT");
}

TEST_F(Swapper, ABadFaultSpecIsRefused) {
  ::setenv("ZEROD_AIO_FAULT", "EWHAT:read:1", 1);
  SwapOptions o;
  StateSwapper sw(file(), 1024, o, nullptr);
  EXPECT_THROW(sw.visit(Mode::kRead, 0, 1024, [](int64_t, int64_t, float*, float*, float*) {}),
               InputError);
}

TEST_F(Swapper, ADiskTooSmallForTheFileIsAnInputError) {
  const fs::path mnt = dir_ / "small";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount(p.c_str()); }
  } unmount{mnt};
  SwapOptions o;
  o.group_elems = 1 << 16;
  const std::string path = (mnt / "opt.swp").string();
  try {
    StateSwapper sw(path, 1 << 18, o, nullptr);  // 3 MiB
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("disk is full"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace zerod
