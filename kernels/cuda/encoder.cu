// forward: grid-stride over B*T*C, 256 threads (without wpe: the token rows only). backward:
// dwpe (when there is one) one thread per (t, c) looping over b (grid-stride over T*C); dwte:
// iota + cub::DeviceRadixSort::SortPairs on (token, row), then grid (B*T sorted rows,
// ceil(C/128)) of 128 threads where only the first row of each token's run works, walking the
// run in order. Negative tokens (not in this vocabulary shard) are sorted like any key (cub
// orders signed keys correctly, and only the grouping of equal keys matters here) and their runs
// are skipped, so no dwte row outside [0, Vp) is touched.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/encoder.h"

namespace zerod::cuda {

namespace {

constexpr int kDwteThreads = 128;
constexpr size_t kAlign = 256;

size_t align_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

size_t sort_temp_bytes(int64_t rows) {
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(
            nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
            static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows),
        "cub::DeviceRadixSort::SortPairs (temp size)");
  return bytes;
}

template <class T>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       const int32_t* doc_start, int T_, int C, int64_t total) {
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t row = i / C;
    const int c = static_cast<int>(i - row * C);
    const int64_t t = row % T_ - (doc_start != nullptr ? doc_start[row] : 0);
    // A token < 0 has no row in this vocabulary shard: its wte term is 0 (out = wpe[t], or 0).
    const int32_t token = tokens[row];
    const float e = token >= 0 ? to_f32(wte[static_cast<int64_t>(token) * C + c]) : 0.0f;
    // Without position embedding the token row is copied as is (no rounding: e is exact).
    out[i] = wpe != nullptr ? from_f32<T>(e + to_f32(wpe[t * C + c])) : from_f32<T>(e);
  }
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c].
template <class T>
__global__ void encoder_dwpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
  const int64_t total = static_cast<int64_t>(T_) * C;
  const int64_t batch_stride = total;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    float acc = to_f32(dwpe[i]);
    for (int b = 0; b < B; ++b) acc += to_f32(dout[b * batch_stride + i]);
    dwpe[i] = from_f32<T>(acc);
  }
}

// Document masking: dwpe[p, c] += dout[b, t, c] over the rows (b, t) with t - doc_start[b,t] = p,
// b then t in order. Within a batch row the candidates are t = s + p for each document start s:
// from a candidate start s (t = s + p, d = doc_start[t]) d == s is a match (the next start is
// after t); d > s skips the starts in [s, d), whose documents end before t (so before their own
// position p); d < s means t's document began before s, so no start lies in [s, t].
template <class T>
__global__ void encoder_dwpe_doc_kernel(T* dwpe, const T* dout, const int32_t* doc_start, int B,
                                        int T_, int C) {
  const int64_t total = static_cast<int64_t>(T_) * C;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int p = static_cast<int>(i / C);
    const int c = static_cast<int>(i - static_cast<int64_t>(p) * C);
    float acc = to_f32(dwpe[i]);
    for (int b = 0; b < B; ++b) {
      const int32_t* ds = doc_start + static_cast<int64_t>(b) * T_;
      int s = 0;
      while (s + p < T_) {
        const int t = s + p;
        const int d = ds[t];
        if (d == s) {
          acc += to_f32(dout[(static_cast<int64_t>(b) * T_ + t) * C + c]);
          s = t + 1;
        } else if (d > s) {
          s = d;
        } else {
          s = t + 1;
        }
      }
    }
    dwpe[i] = from_f32<T>(acc);
  }
}

__global__ void iota_kernel(int32_t* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] = static_cast<int32_t>(i);
}

// Block (i, cb): if sorted row i starts a run of equal tokens, channels [cb*128, cb*128+128) of
// that token's dwte row += the dout rows of the run, in position order. A run of a token < 0 (no
// row in this vocabulary shard) is skipped: it has no wte gradient.
template <class T>
__global__ void encoder_dwte_kernel(T* dwte, const T* dout, const int32_t* sorted_tokens,
                                    const int32_t* sorted_rows, int64_t rows, int C) {
  const int64_t i = blockIdx.x;
  const int32_t token = sorted_tokens[i];
  if (token < 0 || (i > 0 && sorted_tokens[i - 1] == token)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  T* d = dwte + static_cast<int64_t>(token) * C + c;
  float acc = to_f32(*d);
  for (int64_t j = i; j < rows && sorted_tokens[j] == token; ++j) {
    acc += to_f32(dout[static_cast<int64_t>(sorted_rows[j]) * C + c]);
  }
  *d = from_f32<T>(acc);
}

}  // namespace

void encoder_forward(Storage dt, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                     int B, int T, int C, cudaStream_t stream, const int32_t* doc_start) {
  const int64_t total = static_cast<int64_t>(B) * T * C;
  if (total <= 0) return;
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    encoder_forward_kernel<E><<<grid_stride_blocks(total), kElementwiseThreads, 0, stream>>>(
        static_cast<E*>(out), tokens, static_cast<const E*>(wte), static_cast<const E*>(wpe),
        doc_start, T, C, total);
  });
  check(cudaGetLastError(), "encoder_forward kernel launch");
}

size_t encoder_backward_scratch_bytes(int64_t rows) {
  if (rows <= 0) return 0;
  const size_t ints = align_up(static_cast<size_t>(rows) * sizeof(int32_t));
  return 3 * ints + align_up(sort_temp_bytes(rows));
}

void encoder_backward(Storage dt, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                      int B, int T, int C, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                      const int32_t* doc_start) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (rows <= 0 || C <= 0) return;
  // Scratch: sorted tokens, row indices, sorted row indices, the sort's temporary storage.
  // (Checked before anything is queued: a failure leaves both gradients untouched.)
  const size_t ints = align_up(static_cast<size_t>(rows) * sizeof(int32_t));
  size_t temp_bytes = sort_temp_bytes(rows);
  if (scratch_bytes < 3 * ints + temp_bytes) {
    check(cudaErrorInvalidValue, "encoder_backward: scratch too small");
  }
  if (dwpe != nullptr) {  // (null: a model without position embedding)
    dispatch(dt, [&](auto tag) {
      using E = typename decltype(tag)::type;
      const int64_t n = static_cast<int64_t>(T) * C;
      if (doc_start != nullptr) {
        encoder_dwpe_doc_kernel<E><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
            static_cast<E*>(dwpe), static_cast<const E*>(dout), doc_start, B, T, C);
      } else {
        encoder_dwpe_kernel<E><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
            static_cast<E*>(dwpe), static_cast<const E*>(dout), B, T, C);
      }
    });
    check(cudaGetLastError(), "encoder_backward dwpe kernel launch");
  }
  auto* base = static_cast<char*>(scratch);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base);
  auto* row_ids = reinterpret_cast<int32_t*>(base + ints);
  auto* sorted_rows = reinterpret_cast<int32_t*>(base + 2 * ints);
  void* temp = base + 3 * ints;
  iota_kernel<<<grid_stride_blocks(rows), kElementwiseThreads, 0, stream>>>(row_ids, rows);
  check(cudaGetLastError(), "encoder_backward iota kernel launch");
  check(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens, row_ids,
                                        sorted_rows, rows, 0, 32, stream),
        "encoder_backward: cub::DeviceRadixSort::SortPairs");
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((C + kDwteThreads - 1) / kDwteThreads));
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    encoder_dwte_kernel<E><<<grid, kDwteThreads, 0, stream>>>(
        static_cast<E*>(dwte), static_cast<const E*>(dout), sorted_tokens, sorted_rows, rows, C);
  });
  check(cudaGetLastError(), "encoder_backward dwte kernel launch");
}

}  // namespace zerod::cuda
