#include "core/device_oom.h"

#include <fmt/format.h>

#include "core/error.h"

namespace zerod {

namespace {

std::string gib(int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

}  // namespace

std::string device_oom_message(int device, size_t bytes, std::string_view what, int64_t free_bytes,
                               int64_t total_bytes, int64_t held_bytes, std::string_view cause) {
  std::string msg = fmt::format("out of GPU memory on device {}: {} ({} bytes) for {} do not fit",
                                device, gib(static_cast<int64_t>(bytes)), bytes, what);
  if (free_bytes >= 0 && total_bytes > 0) {
    msg += fmt::format(" (the device has {} free of {}", gib(free_bytes), gib(total_bytes));
    if (held_bytes >= 0)
      msg += fmt::format("; this rank's tracked buffers hold {}", gib(held_bytes));
    msg += ")";
  } else if (held_bytes >= 0) {
    msg += fmt::format(" (this rank's tracked buffers hold {})", gib(held_bytes));
  }
  if (!cause.empty()) msg += fmt::format(" [{}]", cause);
  msg +=
      ". To fit: lower train_micro_batch_size_per_gpu (raising gradient_accumulation_steps keeps "
      "the batch), set model.activation_checkpointing, raise zero_optimization.stage (2 shards "
      "the gradients, 3 the parameters too) with more ranks, or offload "
      "(zero_optimization.offload_optimizer / offload_param, device cpu or nvme); "
      "`zeroctl plan --model JOB.json --world N` estimates each choice";
  return msg;
}

void throw_device_oom(int device, size_t bytes, std::string_view what, int64_t free_bytes,
                      int64_t total_bytes, int64_t held_bytes, std::string_view cause) {
  throw InputError(
      device_oom_message(device, bytes, what, free_bytes, total_bytes, held_bytes, cause));
}

}  // namespace zerod
