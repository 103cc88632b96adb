#include "kernels/cpu/grouped_matmul.h"

#include "core/error.h"
#include "kernels/cpu/matmul.h"

namespace zerod::cpu {

void check_group_offsets(const int64_t* offsets, int E) {
  ZD_CHECK(E >= 1, "grouped matmul: {} experts", E);
  ZD_CHECK(offsets[0] == 0, "grouped matmul: offsets[0] = {}, not 0", offsets[0]);
  for (int e = 0; e < E; ++e) {
    ZD_CHECK(offsets[e + 1] >= offsets[e], "grouped matmul: offsets[{}] = {} < offsets[{}] = {}",
             e + 1, offsets[e + 1], e, offsets[e]);
  }
}

// Experts run one after another, each matmul on all threads: an expert's rows are the unit the
// sgemm engine parallelises well (hundreds of rows and more), and the order keeps every result
// independent of the thread count.
void grouped_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                            const int64_t* offsets, int E, int C, int OC, bool bf16_products) {
  check_group_offsets(offsets, E);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows == 0) continue;
    matmul_forward(out + r0 * OC, inp + r0 * C, weight + int64_t{e} * OC * C,
                   bias != nullptr ? bias + int64_t{e} * OC : nullptr, rows, C, OC, bf16_products);
  }
}

void grouped_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const int64_t* offsets, int E,
                             int C, int OC, bool accumulate_dinp, bool bf16_products) {
  check_group_offsets(offsets, E);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows == 0) continue;
    matmul_backward(dinp != nullptr ? dinp + r0 * C : nullptr, dweight + int64_t{e} * OC * C,
                    dbias != nullptr ? dbias + int64_t{e} * OC : nullptr, dout + r0 * OC,
                    inp + r0 * C, weight + int64_t{e} * OC * C, rows, C, OC, accumulate_dinp,
                    bf16_products);
  }
}

}  // namespace zerod::cpu
