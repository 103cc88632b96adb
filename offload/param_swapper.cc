#include "offload/param_swapper.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace zerod {

int64_t ParamSwapper::file_bytes_for(const std::vector<int64_t>& region_bytes) {
  int64_t total = 0;
  for (int64_t b : region_bytes) total += aio_round_up(b);
  return total;
}

ParamSwapper::ParamSwapper(std::string path, std::vector<int64_t> region_bytes,
                           int64_t buffer_bytes, bool pin_memory, const AioOptions& aio,
                           MemoryTracker* tracker, HostRegistrar registrar)
    : path_(std::move(path)),
      bytes_(std::move(region_bytes)),
      tracker_(tracker),
      registrar_(std::move(registrar)) {
  int64_t most = 0;
  for (int64_t b : bytes_) {
    offset_.push_back(file_bytes_);
    file_bytes_ += aio_round_up(b);
    most = std::max(most, b);
  }
  ZD_CHECK_INPUT(buffer_bytes >= most,
                 "zero_optimization.offload_param.buffer_size: {} bytes per buffer, but the "
                 "largest parameter shard on NVMe takes {} bytes",
                 buffer_bytes, most);
  buffer_bytes_ = aio_round_up(std::max<int64_t>(most, 1));  // (only what the largest shard needs)
  aio_ = std::make_unique<AioEngine>(aio);
  file_ = std::make_unique<AioFile>(path_, AioFile::Mode::kCreate);
  if (file_bytes_ > 0) {
    const int rc = ::posix_fallocate(file_->fd(), 0, file_bytes_);
    if (rc != 0) {
      file_.reset();
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      ZD_THROW_INPUT("{}: cannot allocate {} bytes for the parameters: {}", path_, file_bytes_,
                     rc == ENOSPC ? "the disk is full" : std::strerror(rc));
    }
  }
  bounce_ = AlignedBuffer(buffer_bytes_);
  staging_ = AlignedBuffer(buffer_bytes_);
  if (pin_memory) {
    pinned_ = ::mlock(bounce_.data(), static_cast<size_t>(bounce_.capacity())) == 0 &&
              ::mlock(staging_.data(), static_cast<size_t>(staging_.capacity())) == 0;
    if (!pinned_) spdlog::warn("offload_param.pin_memory: cannot lock the swap buffers in RAM");
  }
  if (registrar_) {
    registrar_.add(bounce_.data(), static_cast<size_t>(bounce_.capacity()));
    registrar_.add(staging_.data(), static_cast<size_t>(staging_.capacity()));
  }
  if (tracker_) tracker_->add(MemCategory::kSwap, 2 * buffer_bytes_);
}

ParamSwapper::~ParamSwapper() {
  if (tracker_) tracker_->sub(MemCategory::kSwap, 2 * buffer_bytes_);
  if (registrar_) {
    registrar_.remove(bounce_.data());
    registrar_.remove(staging_.data());
  }
  if (pinned_) {
    ::munlock(bounce_.data(), static_cast<size_t>(bounce_.capacity()));
    ::munlock(staging_.data(), static_cast<size_t>(staging_.capacity()));
  }
  file_.reset();
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

void ParamSwapper::read(int i, void* dst) {
  const int64_t n = bytes_.at(static_cast<size_t>(i));
  ZD_CHECK(n > 0, "parameter region {} is not on NVMe", i);
  if (staged_ == i) {  // (being rewritten: the staging buffer is the newest copy)
    std::memcpy(dst, staging_.data(), static_cast<size_t>(n));
    return;
  }
  Stopwatch sw;
  aio_->read(*file_, offset_[static_cast<size_t>(i)], bounce_, n);
  io_seconds_ += sw.seconds();
  std::memcpy(dst, bounce_.data(), static_cast<size_t>(n));
}

void* ParamSwapper::stage(int i) {
  ZD_CHECK(bytes_.at(static_cast<size_t>(i)) > 0, "parameter region {} is not on NVMe", i);
  ZD_CHECK(staged_ == -1 || staged_ == i, "region {} staged while region {} is", i, staged_);
  staged_ = i;
  return staging_.data();
}

void ParamSwapper::write_staged(int i) {
  ZD_CHECK(staged_ == i, "write of region {}, but region {} is staged", i, staged_);
  staged_ = -1;
  Stopwatch sw;
  aio_->write(*file_, offset_[static_cast<size_t>(i)], staging_, bytes_[static_cast<size_t>(i)]);
  io_seconds_ += sw.seconds();
}

}  // namespace zerod
