#include "kernels/cpu/grouped_matmul.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <vector>

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

namespace {

// An expert with fewer than kRowsPerThread rows per thread is too small to split over all
// threads. When there are at least as many such experts as threads, they run side by side, one
// thread each (largest first), after the large ones, which run one after another on all
// threads; otherwise every expert runs on all threads in turn. The sgemm engine uses only the
// calling thread inside a parallel region and gives the same bits for any thread count, so the
// split changes no result. bf16 products (oneDNN) always take the sequential path.
constexpr int64_t kRowsPerThread = 64;

template <class Block>
void for_each_expert(const int64_t* offsets, int E, bool bf16_products, const Block& block) {
  const int threads = omp_get_max_threads();
  std::vector<int> small;
  for (int e = 0; e < E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    if (rows >= kRowsPerThread * threads || bf16_products) {
      block(e);
    } else {
      small.push_back(e);
    }
  }
  if (threads < 2 || static_cast<int>(small.size()) < threads) {
    for (int e : small) block(e);
    return;
  }
  std::stable_sort(small.begin(), small.end(), [&](int a, int b) {
    return offsets[a + 1] - offsets[a] > offsets[b + 1] - offsets[b];
  });
  const int n = static_cast<int>(small.size());
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; ++i) {
    try {
      block(small[static_cast<size_t>(i)]);
    } catch (...) {
#pragma omp critical(zerod_grouped_matmul_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void grouped_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                            const int64_t* offsets, int E, int C, int OC, bool bf16_products,
                            int64_t weight_stride, int64_t bias_stride) {
  check_group_offsets(offsets, E);
  const int64_t ws = weight_stride > 0 ? weight_stride : int64_t{OC} * C;
  const int64_t bs = bias_stride > 0 ? bias_stride : OC;
  for_each_expert(offsets, E, bf16_products, [&](int e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    matmul_forward(out + r0 * OC, inp + r0 * C, weight + e * ws,
                   bias != nullptr ? bias + e * bs : nullptr, rows, C, OC, bf16_products);
  });
}

void grouped_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const int64_t* offsets, int E,
                             int C, int OC, bool accumulate_dinp, bool bf16_products,
                             int64_t weight_stride, int64_t bias_stride) {
  check_group_offsets(offsets, E);
  const int64_t ws = weight_stride > 0 ? weight_stride : int64_t{OC} * C;
  const int64_t bs = bias_stride > 0 ? bias_stride : OC;
  for_each_expert(offsets, E, bf16_products, [&](int e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    matmul_backward(dinp != nullptr ? dinp + r0 * C : nullptr, dweight + e * ws,
                    dbias != nullptr ? dbias + e * bs : nullptr, dout + r0 * OC, inp + r0 * C,
                    weight + e * ws, rows, C, OC, accumulate_dinp, bf16_products);
  });
}

}  // namespace zerod::cpu
