// bf16_gemm where zerod is built without oneDNN (see kernels/cpu/bf16_gemm.h): never available.
#include "kernels/cpu/bf16_gemm.h"
#include "core/error.h"

namespace zerod::cpu {

std::string bf16_gemm_unavailable() {
  return "zerod was built without oneDNN (libdnnl-dev)";
}

void bf16_gemm(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
               float, float*, int64_t, const float*) {
  ZD_THROW("bf16_gemm: {}", bf16_gemm_unavailable());
}

Bf16Operand to_bf16(std::vector<uint16_t>&, const float*, int64_t, int64_t, int64_t) {
  ZD_THROW("to_bf16: {}", bf16_gemm_unavailable());
}

void bf16_gemm(bool, bool, int64_t, int64_t, int64_t, Bf16Operand, Bf16Operand, float, float*,
               int64_t, const float*) {
  ZD_THROW("bf16_gemm: {}", bf16_gemm_unavailable());
}

}  // namespace zerod::cpu
