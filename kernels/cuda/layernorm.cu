// forward and dinp: one warp per row, 8 rows per 256-thread block, two passes over the row
// (mean, then centred variance / the two backward dot products), lanes striding the channels.
// dweight/dbias: grid (ceil(C/128), chunks) of 128 threads, one thread per channel summing a
// chunk of rows into a partial; then one thread per channel adds the partials in chunk order.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/layernorm.h"

namespace zerod::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowThreads = 256;
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kChannelThreads = 128;
constexpr int64_t kMinChunkRows = 16;  // (row_chunks)

// The rest of a layernorm row once its lane's partial `sum` of x is known (one warp per row):
// mean, centred variance, out, and (lane 0) the statistics. x is read again by each lane.
template <class T>
__device__ __forceinline__ void layernorm_row(T* out, float* mean, float* rstd, const T* x,
                                              const T* weight, const T* bias, float sum,
                                              int64_t row, int C, int lane) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const float m = warp_sum(sum) * inv_c;
  float sq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = to_f32(x[c]) - m;
    sq += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) * inv_c + kEps);
  T* o = out + row * C;
  for (int c = lane; c < C; c += 32) {
    o[c] = from_f32<T>((to_f32(x[c]) - m) * s * to_f32(weight[c]) + to_f32(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += to_f32(x[c]);
  layernorm_row(out, mean, rstd, x, weight, bias, sum, row, C, lane);
}

// As layernorm_forward_kernel on res = a + b (stored, then normalised): each lane rereads the
// res elements it wrote itself.
template <class T>
__global__ void residual_layernorm_forward_kernel(T* res, T* out, float* mean, float* rstd,
                                                  const T* a, const T* b, const T* weight,
                                                  const T* bias, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xa = a + row * C;
  const T* xb = b + row * C;
  T* x = res + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const T v = from_f32<T>(to_f32(xa[c]) + to_f32(xb[c]));
    x[c] = v;
    sum += to_f32(v);
  }
  layernorm_row(out, mean, rstd, static_cast<const T*>(x), weight, bias, sum, row, C, lane);
}

template <class T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                      const float* mean, const float* rstd, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  const T* x = inp + row * C;
  const T* g = dout + row * C;
  const float m = mean[row];
  const float s = rstd[row];
  float dn_sum = 0.0f, dnn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (to_f32(x[c]) - m) * s;
    const float dn = to_f32(weight[c]) * to_f32(g[c]);
    dn_sum += dn;
    dnn_sum += dn * norm;
  }
  const float dn_mean = warp_sum(dn_sum) * inv_c;
  const float dnn_mean = warp_sum(dnn_sum) * inv_c;
  T* di = dinp + row * C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (to_f32(x[c]) - m) * s;
    const float dn = to_f32(weight[c]) * to_f32(g[c]);
    di[c] = from_f32<T>(to_f32(di[c]) + s * (dn - dn_mean - norm * dnn_mean));
  }
}

// partial (chunks, 2, C): [k][0][c] = sum over the chunk's rows of norm * dout, [k][1][c] = of
// dout.
template <class T>
__global__ void layernorm_partials_kernel(float* partial, const T* dout, const T* inp,
                                          const float* mean, const float* rstd, int64_t N, int C,
                                          int64_t rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.0f, ab = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = to_f32(dout[r * C + c]);
    const float norm = (to_f32(inp[r * C + c]) - mean[r]) * rstd[r];
    aw += norm * g;
    ab += g;
  }
  partial[k * 2 * C + c] = aw;
  partial[k * 2 * C + C + c] = ab;
}

template <class T>
__global__ void layernorm_combine_kernel(T* dweight, T* dbias, const float* partial, int64_t chunks,
                                         int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = 0.0f, ab = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    aw += partial[k * 2 * C + c];
    ab += partial[k * 2 * C + C + c];
  }
  dweight[c] = from_f32<T>(to_f32(dweight[c]) + aw);
  dbias[c] = from_f32<T>(to_f32(dbias[c]) + ab);
}

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void layernorm_forward(Storage dt, void* out, float* mean, float* rstd, const void* inp,
                       const void* weight, const void* bias, int64_t N, int C,
                       cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    layernorm_forward_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp), static_cast<const T*>(weight),
        static_cast<const T*>(bias), N, C);
  });
  check(cudaGetLastError(), "layernorm_forward kernel launch");
}

void residual_layernorm_forward(Storage dt, void* res, void* out, float* mean, float* rstd,
                                const void* a, const void* b, const void* weight, const void* bias,
                                int64_t N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    residual_layernorm_forward_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(res), static_cast<T*>(out), mean, rstd, static_cast<const T*>(a),
        static_cast<const T*>(b), static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
  });
  check(cudaGetLastError(), "residual_layernorm_forward kernel launch");
}

size_t layernorm_backward_scratch_bytes(int64_t N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return static_cast<size_t>(row_chunks(N, kMinChunkRows).count) * 2 * static_cast<size_t>(C) *
         sizeof(float);
}

void layernorm_backward(Storage dt, void* dinp, void* dweight, void* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int64_t N, int C, float* scratch, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const RowChunks rc = row_chunks(N, kMinChunkRows);
  const int64_t rows_per_chunk = rc.rows, chunks = rc.count;
  const unsigned channel_blocks =
      static_cast<unsigned>((C + kChannelThreads - 1) / kChannelThreads);
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    layernorm_dinp_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
        static_cast<const T*>(weight), mean, rstd, N, C);
    check(cudaGetLastError(), "layernorm_backward dinp kernel launch");
    layernorm_partials_kernel<T>
        <<<dim3(channel_blocks, static_cast<unsigned>(chunks)), kChannelThreads, 0, stream>>>(
            scratch, static_cast<const T*>(dout), static_cast<const T*>(inp), mean, rstd, N, C,
            rows_per_chunk);
    check(cudaGetLastError(), "layernorm_backward partials kernel launch");
    layernorm_combine_kernel<T><<<channel_blocks, kChannelThreads, 0, stream>>>(
        static_cast<T*>(dweight), static_cast<T*>(dbias), scratch, chunks, C);
    check(cudaGetLastError(), "layernorm_backward combine kernel launch");
  });
}

}  // namespace zerod::cuda
