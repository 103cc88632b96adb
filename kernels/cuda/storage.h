// The storage type of compute-dtype tensors as the CUDA launchers see it. core/dtype.h needs
// C++20 (std::bit_cast) and .cu files compile as C++17, so the launchers take this twin of
// zerod::DType (same values; cuda_backend.cc checks that at compile time).
#pragma once

#include <cstdint>

namespace zerod::cuda {

enum class Storage : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

}  // namespace zerod::cuda
