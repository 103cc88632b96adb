// forward and dinp: one warp per row, 8 rows per 256-thread block, two passes over the row (the
// sum of squares / the dot product, then the outputs), lanes striding the channels.
// dweight: grid (ceil(C/128), chunks) of 128 threads, one thread per channel summing a chunk of
// rows into a partial; then one thread per channel adds the partials in chunk order (as
// layernorm.cu).
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace zerod::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kChannelThreads = 128;
constexpr int64_t kMinChunkRows = 16;  // (row_chunks)

template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight,
                                       int64_t N, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = to_f32(x[c]);
    sq += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int c = lane; c < C; c += 32) o[c] = from_f32<T>(to_f32(x[c]) * s * to_f32(weight[c]));
  if (lane == 0) rstd[row] = s;
}

template <class T>
__global__ void rmsnorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                    const float* rstd, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* g = dout + row * C;
  const float s = rstd[row];
  float dnn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = to_f32(x[c]) * s;
    dnn_sum += to_f32(weight[c]) * to_f32(g[c]) * norm;
  }
  const float dnn_mean = warp_sum(dnn_sum) / static_cast<float>(C);
  T* di = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float norm = to_f32(x[c]) * s;
    const float dn = to_f32(weight[c]) * to_f32(g[c]);
    di[c] = from_f32<T>(to_f32(di[c]) + s * (dn - norm * dnn_mean));
  }
}

// partial (chunks, C): [k][c] = sum over the chunk's rows of dout * inp * rstd.
template <class T>
__global__ void rmsnorm_partials_kernel(float* partial, const T* dout, const T* inp,
                                        const float* rstd, int64_t N, int C,
                                        int64_t rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    aw += to_f32(dout[r * C + c]) * (to_f32(inp[r * C + c]) * rstd[r]);
  }
  partial[k * C + c] = aw;
}

template <class T>
__global__ void rmsnorm_combine_kernel(T* dweight, const float* partial, int64_t chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) aw += partial[k * C + c];
  dweight[c] = from_f32<T>(to_f32(dweight[c]) + aw);
}

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void rmsnorm_forward(Storage dt, void* out, float* rstd, const void* inp, const void* weight,
                     int64_t N, int C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_forward_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(inp), static_cast<const T*>(weight), N, C,
        eps);
  });
  check(cudaGetLastError(), "rmsnorm_forward kernel launch");
}

size_t rmsnorm_backward_scratch_bytes(int64_t N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return static_cast<size_t>(row_chunks(N, kMinChunkRows).count) * static_cast<size_t>(C) *
         sizeof(float);
}

void rmsnorm_backward(Storage dt, void* dinp, void* dweight, const void* dout, const void* inp,
                      const void* weight, const float* rstd, int64_t N, int C, float* scratch,
                      cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const RowChunks rc = row_chunks(N, kMinChunkRows);
  const unsigned channel_blocks =
      static_cast<unsigned>((C + kChannelThreads - 1) / kChannelThreads);
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_dinp_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
        static_cast<const T*>(weight), rstd, N, C);
    check(cudaGetLastError(), "rmsnorm_backward dinp kernel launch");
    rmsnorm_partials_kernel<T>
        <<<dim3(channel_blocks, static_cast<unsigned>(rc.count)), kChannelThreads, 0, stream>>>(
            scratch, static_cast<const T*>(dout), static_cast<const T*>(inp), rstd, N, C, rc.rows);
    check(cudaGetLastError(), "rmsnorm_backward partials kernel launch");
    rmsnorm_combine_kernel<T><<<channel_blocks, kChannelThreads, 0, stream>>>(
        static_cast<T*>(dweight), scratch, rc.count, C);
    check(cudaGetLastError(), "rmsnorm_backward combine kernel launch");
  });
}

}  // namespace zerod::cuda
