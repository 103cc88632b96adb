// The out-of-GPU-memory error (core/device_oom.h): what a user reads when a job does not fit.
#include "core/device_oom.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace zerod {
namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DeviceOom, NamesTheRequestTheDeviceAndTheRemedies) {
  const int64_t gib = int64_t{1} << 30;
  const std::string m = device_oom_message(1, size_t{3} << 29, "activations", gib / 2, 80 * gib,
                                           70 * gib, "out of memory");
  EXPECT_TRUE(m.rfind("out of GPU memory on device 1: ", 0) == 0) << m;
  EXPECT_TRUE(has(m, "1.50 GiB (1610612736 bytes) for activations do not fit")) << m;
  EXPECT_TRUE(has(m, "the device has 0.50 GiB free of 80.00 GiB")) << m;
  EXPECT_TRUE(has(m, "this rank's tracked buffers hold 70.00 GiB")) << m;
  EXPECT_TRUE(has(m, "[out of memory]")) << m;
  for (const char* remedy : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                             "model.activation_checkpointing", "zero_optimization.stage",
                             "offload_optimizer", "offload_param", "zeroctl plan"}) {
    EXPECT_TRUE(has(m, remedy)) << remedy << " missing from: " << m;
  }
}

TEST(DeviceOom, LeavesOutWhatIsNotKnown) {
  const std::string m = device_oom_message(0, 4096, "kernel scratch", -1, -1, -1, "");
  EXPECT_TRUE(has(m, "4096 bytes) for kernel scratch do not fit")) << m;
  EXPECT_FALSE(has(m, "free of")) << m;
  EXPECT_FALSE(has(m, "tracked buffers")) << m;
  EXPECT_FALSE(has(m, "[")) << m;
  const std::string held = device_oom_message(0, 4096, "weights", -1, -1, 1 << 20, "");
  EXPECT_TRUE(has(held, "(this rank's tracked buffers hold 0.00 GiB)")) << held;
}

TEST(DeviceOom, IsAnInputErrorWithExitCodeTwo) {
  try {
    throw_device_oom(0, 1024, "gradients", 0, 1 << 30, 0, "out of memory");
    FAIL() << "no throw";
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_TRUE(has(e.what(), "out of GPU memory on device 0")) << e.what();
  }
}

}  // namespace
}  // namespace zerod
