// The error of a device allocation that does not fit: what was asked for and for what, what the
// device has free of its total, what this rank's tracked buffers already hold, and what to change
// in the job. Exit code 2 (the job's configuration can be changed to fit); the message starts with
// "out of GPU memory" (tools and tests look for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zerod {

// free_bytes / total_bytes < 0: unknown (cudaMemGetInfo failed); held_bytes < 0: unknown.
std::string device_oom_message(int device, size_t bytes, std::string_view what, int64_t free_bytes,
                               int64_t total_bytes, int64_t held_bytes, std::string_view cause);

[[noreturn]] void throw_device_oom(int device, size_t bytes, std::string_view what,
                                   int64_t free_bytes, int64_t total_bytes, int64_t held_bytes,
                                   std::string_view cause);

}  // namespace zerod
