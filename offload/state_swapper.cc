#include "offload/state_swapper.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace zerod {

namespace {
constexpr int64_t kFloatsPerBlock = kAioAlign / static_cast<int64_t>(sizeof(float));

int64_t round_group(int64_t group_elems, int64_t elems) {
  const int64_t g = std::max<int64_t>(1, std::min(group_elems, std::max<int64_t>(elems, 1)));
  return (g + kFloatsPerBlock - 1) / kFloatsPerBlock * kFloatsPerBlock;
}

std::once_flag g_mlock_warned;
}  // namespace

struct StateSwapper::Slot {
  AlignedBuffer buf;
  std::future<void> io;  // the last request on this buffer
};

int64_t StateSwapper::group_elems_for(int64_t elems, int64_t group_elems) {
  return round_group(group_elems, elems);
}

int64_t StateSwapper::file_bytes_for(int64_t elems, int64_t group_elems) {
  if (elems <= 0) return 0;
  const int64_t g = round_group(group_elems, elems);
  return (elems + g - 1) / g * 3 * g * static_cast<int64_t>(sizeof(float));
}

int64_t StateSwapper::buffer_bytes_for(int64_t elems, const SwapOptions& options) {
  if (elems <= 0) return 0;
  const int64_t g = round_group(options.group_elems, elems);
  const int64_t groups = (elems + g - 1) / g;
  return std::min<int64_t>(options.buffer_count, groups) * 3 * g *
         static_cast<int64_t>(sizeof(float));
}

StateSwapper::StateSwapper(std::string path, int64_t elems, const SwapOptions& options,
                           MemoryTracker* tracker)
    : path_(std::move(path)),
      elems_(elems),
      group_elems_(round_group(options.group_elems, elems)),
      stride_(3 * group_elems_ * static_cast<int64_t>(sizeof(float))),
      num_groups_(static_cast<int>(elems <= 0 ? 0 : (elems + group_elems_ - 1) / group_elems_)),
      opt_(options),
      tracker_(tracker) {
  ZD_CHECK(elems >= 0, "swap file of {} elements", elems);
  ZD_CHECK_INPUT(opt_.buffer_count >= 1, "offload_optimizer.buffer_count {}: must be at least 1",
                 opt_.buffer_count);
  aio_ = std::make_unique<AioEngine>(opt_.aio);
  file_ = std::make_unique<AioFile>(path_, AioFile::Mode::kCreate);
  if (file_bytes() > 0) {
    // Every block is allocated now: a disk that fills up later cannot fail a step.
    const int rc = ::posix_fallocate(file_->fd(), 0, file_bytes());
    if (rc != 0) {
      file_.reset();
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      if (rc == ENOSPC || rc == EDQUOT)
        ZD_THROW_INPUT("{}: cannot allocate {} bytes for the optimizer states: the disk is full",
                       path_, file_bytes());
      ZD_THROW_INPUT("{}: cannot allocate {} bytes: {}", path_, file_bytes(), std::strerror(rc));
    }
  }
}

StateSwapper::~StateSwapper() {
  for (auto& s : slots_) {
    if (s->io.valid()) s->io.wait();
    if (opt_.registrar) opt_.registrar.remove(s->buf.data());
    if (opt_.pin_memory) ::munlock(s->buf.data(), static_cast<size_t>(s->buf.capacity()));
    if (tracker_) tracker_->sub(MemCategory::kSwap, s->buf.capacity());
  }
  file_.reset();
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

int64_t StateSwapper::buffer_bytes() const {
  return buffer_bytes_for(elems_, opt_);
}

void StateSwapper::ensure_slots() {
  if (!slots_.empty()) return;
  const int n = std::min(opt_.buffer_count, num_groups_);
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<Slot>();
    s->buf = AlignedBuffer(stride_);
    if (opt_.pin_memory && ::mlock(s->buf.data(), static_cast<size_t>(s->buf.capacity())) != 0) {
      const int err = errno;
      std::call_once(g_mlock_warned, [&] {
        spdlog::warn("pin_memory: cannot lock the swap buffers in RAM ({}); they stay pageable",
                     std::strerror(err));
      });
    }
    if (opt_.registrar) opt_.registrar.add(s->buf.data(), static_cast<size_t>(s->buf.capacity()));
    if (tracker_) tracker_->add(MemCategory::kSwap, s->buf.capacity());
    slots_.push_back(std::move(s));
  }
}

void StateSwapper::drain() {
  try {
    for (auto& s : slots_) {
      if (!s->io.valid()) continue;
      Stopwatch sw;
      s->io.get();
      stats_.wait_seconds += sw.seconds();
    }
  } catch (...) {
    for (auto& s : slots_) {
      if (s->io.valid()) s->io.wait();
      s->io = {};
    }
    throw;
  }
}

void StateSwapper::prefetch() {
  if (!opt_.pipeline_read || num_groups_ == 0 || prefetched_ > 0) return;
  ensure_slots();
  drain();  // the last visit's write-behind (a failed write is reported here)
  prefetched_ = std::min(static_cast<int>(slots_.size()), num_groups_);
  for (int g = 0; g < prefetched_; ++g) {
    Slot& s = *slots_[static_cast<size_t>(g)];
    stats_.read_bytes += stride_;
    s.io = std::async(std::launch::async, [this, &s, g] {
      aio_->read(*file_, static_cast<int64_t>(g) * stride_, s.buf, stride_);
    });
  }
}

void StateSwapper::visit(Mode mode, int64_t begin, int64_t end, const Visitor& fn) {
  ZD_CHECK(0 <= begin && begin <= end && end <= elems_, "visit [{}, {}) of {} elements", begin, end,
           elems_);
  if (begin == end) return;
  ensure_slots();
  const int g0 = static_cast<int>(begin / group_elems_);
  const int g1 = static_cast<int>((end - 1) / group_elems_) + 1;
  const int ns = static_cast<int>(slots_.size());
  const bool writes = mode != Mode::kRead;
  auto group_begin = [&](int g) { return static_cast<int64_t>(g) * group_elems_; };
  auto group_end = [&](int g) { return std::min(group_begin(g + 1), elems_); };
  auto slot = [&](int g) -> Slot& { return *slots_[static_cast<size_t>((g - g0) % ns)]; };
  auto wait = [&](Slot& s) {
    if (!s.io.valid()) return;
    Stopwatch sw;
    s.io.get();
    stats_.wait_seconds += sw.seconds();
  };
  auto start_read = [&](int g) {
    Slot& s = slot(g);
    wait(s);  // the write of the sub-group it held
    const bool whole = begin <= group_begin(g) && group_end(g) <= end;
    if (mode == Mode::kOverwrite && whole) return;
    stats_.read_bytes += stride_;
    s.io = std::async(std::launch::async, [this, &s, g] {
      aio_->read(*file_, static_cast<int64_t>(g) * stride_, s.buf, stride_);
    });
  };
  const bool prefetch = opt_.pipeline_read && ns >= 2;
  const bool write_behind = opt_.pipeline_write && ns >= 2;
  int next_read = g0;  // reads of [g0, next_read) have been started
  // Sub-groups read ahead by prefetch() (into slot g % ns) serve a visit that reads from the
  // first sub-group; any other visit lets them finish and reads for itself.
  const int ahead = prefetched_;
  prefetched_ = 0;
  try {
    if (ahead > 0 && g0 == 0 && mode != Mode::kOverwrite) {
      next_read = std::min(ahead, g1);
    } else {
      drain();  // a prefetch, or the last visit's write-behind
    }
    for (int g = g0; g < g1; ++g) {
      if (next_read == g) start_read(next_read++);
      Slot& s = slot(g);
      wait(s);
      if (prefetch && next_read == g + 1 && next_read < g1) start_read(next_read++);
      const int64_t lo = std::max(begin, group_begin(g)), hi = std::min(end, group_end(g));
      auto* base = reinterpret_cast<float*>(s.buf.data());
      const int64_t off = lo - group_begin(g);
      fn(lo, hi, base + off, base + group_elems_ + off, base + 2 * group_elems_ + off);
      if (!writes) continue;
      stats_.write_bytes += stride_;
      auto write = [this, &s, g] {
        aio_->write(*file_, static_cast<int64_t>(g) * stride_, s.buf, stride_);
      };
      if (write_behind) {
        s.io = std::async(std::launch::async, write);
      } else {
        Stopwatch sw;
        write();
        stats_.wait_seconds += sw.seconds();
      }
    }
    // With pipeline_write the last writes go on after the visit returns (the next visit or
    // prefetch waits for them and reports their errors); reads are all done by now.
    if (!write_behind || !writes) drain();
  } catch (...) {
    for (auto& s : slots_) {
      if (s->io.valid()) s->io.wait();
      s->io = {};
    }
    throw;
  }
}

}  // namespace zerod
