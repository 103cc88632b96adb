#include "zero/buffer_pool.h"

namespace zerod {

Buffer BufferPool::take(size_t bytes, bool zero) {
  in_use_ += bytes;
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].bytes() != bytes) continue;
    Buffer b = std::move(free_[i]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    if (zero) be_.memset_zero(b.data(), bytes);
    return b;
  }
  return be_.allocate(bytes, category_, tracker_);  // allocate() zero-fills
}

void BufferPool::give(Buffer buffer) {
  if (buffer.empty()) return;
  in_use_ -= buffer.bytes();
  free_.push_back(std::move(buffer));
}

}  // namespace zerod
