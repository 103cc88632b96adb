// add_bias: grid-stride over N*OC, 256 threads. bias_backward: grid (ceil(OC/128), chunks) of
// 128 threads, one thread per column summing a chunk of rows, then the chunk partials of each
// column added in an order fixed by the chunk count (combine_columns, device_util.cuh).
#include "kernels/cuda/bias.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kColumnThreads = 128;
constexpr int64_t kMinChunkRows = 32;  // (row_chunks)

template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t total, int OC, bool overwrite) {
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const float b = to_f32(bias[i % OC]);
    out[i] = from_f32<T>(overwrite ? b : to_f32(out[i]) + b);
  }
}

template <class T>
__global__ void column_partials_kernel(float* partial, const T* dout, int64_t N, int OC,
                                       int64_t rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f32(dout[r * OC + c]);
  partial[k * OC + c] = acc;
}

// dbias[c] += column c of the (chunks, OC) partials: blocks of (32, kCombineRows) threads
// (combine_columns).
template <class T>
__global__ void column_combine_kernel(T* dbias, const float* partial, int64_t chunks, int OC) {
  __shared__ float sums[kCombineRows][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const float total = combine_columns(partial, chunks, OC, c, sums);
  if (threadIdx.y == 0 && c < OC) dbias[c] = from_f32<T>(to_f32(dbias[c]) + total);
}

}  // namespace

void add_bias(Storage dt, void* out, const void* bias, int64_t N, int OC, bool overwrite,
              cudaStream_t stream) {
  const int64_t total = N * OC;
  if (total <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_bias_kernel<T><<<grid_stride_blocks(total), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(bias), total, OC, overwrite);
  });
  check(cudaGetLastError(), "add_bias kernel launch");
}

size_t bias_backward_scratch_bytes(int64_t N, int OC) {
  if (N <= 0 || OC <= 0) return 0;
  return static_cast<size_t>(row_chunks(N, kMinChunkRows).count) * static_cast<size_t>(OC) *
         sizeof(float);
}

void bias_backward(Storage dt, void* dbias, const void* dout, int64_t N, int OC, float* scratch,
                   cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  const RowChunks rc = row_chunks(N, kMinChunkRows);
  const int64_t rows_per_chunk = rc.rows, chunks = rc.count;
  const unsigned blocks = static_cast<unsigned>((OC + kColumnThreads - 1) / kColumnThreads);
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_partials_kernel<T>
        <<<dim3(blocks, static_cast<unsigned>(chunks)), kColumnThreads, 0, stream>>>(
            scratch, static_cast<const T*>(dout), N, OC, rows_per_chunk);
    check(cudaGetLastError(), "bias_backward partials kernel launch");
    column_combine_kernel<T>
        <<<static_cast<unsigned>((OC + 31) / 32), dim3(32, kCombineRows), 0, stream>>>(
            static_cast<T*>(dbias), scratch, chunks, OC);
    check(cudaGetLastError(), "bias_backward combine kernel launch");
  });
}

}  // namespace zerod::cuda
