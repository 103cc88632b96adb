// add_bias: grid-stride over N*OC, 256 threads. bias_backward: grid (ceil(OC/128), chunks) of
// 128 threads, one thread per column summing a chunk of rows, then the chunk partials of each
// column added in an order fixed by the chunk count (combine_columns, device_util.cuh). The
// vector variant (ZEROD_BIAS_GRAD_VECTOR=1): blocks of 32 x 4 threads over 256 columns (16-byte
// loads of 16 / sizeof(T) columns per thread) and a chunk of at least 128 rows, the 4 row lanes
// of a block adding their rows in turn and then their sums in lane order; the same combine.
#include <atomic>

#include "core/env.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kColumnThreads = 128;
constexpr int64_t kMinChunkRows = 32;  // (row_chunks)
// The vector variant: 32 column threads x kRowLanes row lanes per block, each column thread
// 16 bytes of a row; chunks of at least kVectorChunkRows rows (fewer chunks than the other's).
constexpr int kRowLanes = 4;
constexpr int64_t kVectorChunkRows = 128;

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

// partial[k, c .. c + VEC) for chunk k: thread (x, y) of block (bx, k) sums columns
// c = (bx 32 + x) VEC .. + VEC over rows r0 + y, r0 + y + kRowLanes, ... of the chunk, then lane
// y = 0 adds the kRowLanes sums in lane order (deterministic). OC % VEC == 0 and dout 16-byte
// aligned (the caller checks).
template <class T, int VEC>
__global__ void column_partials_vector_kernel(float* partial, const T* dout, int64_t N, int OC,
                                              int64_t rows_per_chunk) {
  __shared__ float sums[kRowLanes][32 * VEC + 1];
  const int c = (blockIdx.x * 32 + threadIdx.x) * VEC;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
  if (c < OC) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const uint4 raw = *reinterpret_cast<const uint4*>(dout + r * OC + c);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += to_f32(v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) sums[threadIdx.y][threadIdx.x * VEC + j] = acc[j];
  __syncthreads();
  if (threadIdx.y != 0 || c >= OC) return;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < kRowLanes; ++y) total += sums[y][threadIdx.x * VEC + j];
    partial[static_cast<int64_t>(blockIdx.y) * OC + c + j] = total;
  }
}

std::atomic<bool>& vector_flag() {
  static std::atomic<bool> on{env_switch("ZEROD_BIAS_GRAD_VECTOR", false)};
  return on;
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

void set_bias_grad_vector(bool on) {
  vector_flag().store(on);
}
bool bias_grad_vector() {
  return vector_flag().load();
}

void bias_backward(Storage dt, void* dbias, const void* dout, int64_t N, int OC, float* scratch,
                   cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = static_cast<int>(16 / sizeof(T));
    const bool vector =
        vector_flag().load() && OC % kVec == 0 && reinterpret_cast<uintptr_t>(dout) % 16 == 0;
    int64_t chunks = 0;
    if (vector) {
      const RowChunks rc = row_chunks(N, kVectorChunkRows);
      chunks = rc.count;
      const unsigned blocks = static_cast<unsigned>((OC / kVec + 31) / 32);
      column_partials_vector_kernel<T, kVec>
          <<<dim3(blocks, static_cast<unsigned>(chunks)), dim3(32, kRowLanes), 0, stream>>>(
              scratch, static_cast<const T*>(dout), N, OC, rc.rows);
    } else {
      const RowChunks rc = row_chunks(N, kMinChunkRows);
      chunks = rc.count;
      const unsigned blocks = static_cast<unsigned>((OC + kColumnThreads - 1) / kColumnThreads);
      column_partials_kernel<T>
          <<<dim3(blocks, static_cast<unsigned>(chunks)), kColumnThreads, 0, stream>>>(
              scratch, static_cast<const T*>(dout), N, OC, rc.rows);
    }
    check(cudaGetLastError(), "bias_backward partials kernel launch");
    column_combine_kernel<T>
        <<<static_cast<unsigned>((OC + 31) / 32), dim3(32, kCombineRows), 0, stream>>>(
            static_cast<T*>(dbias), scratch, chunks, OC);
    check(cudaGetLastError(), "bias_backward combine kernel launch");
  });
}

}  // namespace zerod::cuda
