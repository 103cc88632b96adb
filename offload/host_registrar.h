// How the swappers tell the device about their host buffers: a GPU backend page-locks them
// (cudaHostRegister), so its copies to and from them are DMA (the pinned bounce buffers of NVMe
// offload). Empty on the CPU: nothing to register.
#pragma once

#include <cstddef>
#include <functional>

namespace zerod {

struct HostRegistrar {
  std::function<void(void* p, size_t bytes)> add;  // after the buffer is allocated
  std::function<void(void* p)> remove;             // before it is freed
  explicit operator bool() const { return static_cast<bool>(add); }
};

}  // namespace zerod
