// forward and dinp: one warp per row, 8 rows per 256-thread block. Where every row is a whole
// number of 16-byte packs (C a multiple of 8 for bf16/fp16, of 4 for fp32, tensors 16-byte
// aligned) and a lane holds at most 16 packs of it, the row is read once into registers as packs
// (lane l holds packs l, l + 32, ...) and every pass (mean, centred variance, the output; the two
// backward dot products, then dinp) runs from there: one read of each input and one write per
// element. Otherwise lanes stride the channels element by element and reread the row.
// dweight/dbias: grid (ceil(C/128), chunks) of 128 threads, one thread per channel summing a
// chunk of rows into a partial; then the partials of each channel are added in an order fixed by
// the chunk count (combine_columns, device_util.cuh), in parallel over chunks and channels. Rows of
// at most 3 packs a lane (C <= 768 in bf16/fp16, 384 in fp32) take one fused kernel for dinp and
// the partials instead (layernorm_backward_fused_kernel), unless switched off.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/env.h"
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

// ---- the packed path: the row in registers ---------------------------------------------------

// Packs of a row per lane in the packed path: 1, 2, 4, 8 or 16 (0: the row does not fit).
int packs_per_lane(int C, int pack) {
  const int packs = C / pack;
  const int per_lane = (packs + 31) / 32;
  for (int v = 1; v <= 16; v *= 2) {
    if (per_lane <= v) return v;
  }
  return 0;
}

// x[i] = the floats of pack `lane + 32 i` of a row (zero where the pack is past the row's end).
template <class T, int VEC>
__device__ __forceinline__ void load_row(float (&x)[VEC][Pack16<T>::kN], const T* __restrict__ row,
                                         int packs, int lane) {
  using P = Pack16<T>;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      const P v = reinterpret_cast<const P*>(row)[p];
#pragma unroll
      for (int k = 0; k < P::kN; ++k) x[i][k] = to_f32(v.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < P::kN; ++k) x[i][k] = 0.0f;
    }
  }
}

// mean, rstd of a row held as load_row's packs (padding zeros excluded from the variance), and
// out = (x - mean) rstd w + b, with the statistics to mean[row] / rstd[row] (lane 0).
template <class T, int VEC>
__device__ __forceinline__ void layernorm_packed_finish(
    T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
    const float (&x)[VEC][Pack16<T>::kN], float sum, const T* __restrict__ weight,
    const T* __restrict__ bias, int64_t row, int C, int lane) {
  using P = Pack16<T>;
  const int packs = C / P::kN;
  const float inv_c = 1.0f / static_cast<float>(C);
  const float m = warp_sum(sum) * inv_c;
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    if (lane + 32 * i < packs) {
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        const float d = x[i][k] - m;
        sq += d * d;
      }
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(sq) * inv_c + kEps);
  P* o = reinterpret_cast<P*>(out + row * C);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      const P w = reinterpret_cast<const P*>(weight)[p];
      const P b = reinterpret_cast<const P*>(bias)[p];
      P y;
#pragma unroll
      for (int k = 0; k < P::kN; ++k)
        y.v[k] = from_f32<T>((x[i][k] - m) * s * to_f32(w.v[k]) + to_f32(b.v[k]));
      o[p] = y;
    }
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <class T, int VEC>
__global__ void layernorm_forward_packed_kernel(T* __restrict__ out, float* __restrict__ mean,
                                                float* __restrict__ rstd, const T* __restrict__ inp,
                                                const T* __restrict__ weight,
                                                const T* __restrict__ bias, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  float x[VEC][Pack16<T>::kN];
  load_row<T, VEC>(x, inp + row * C, C / Pack16<T>::kN, lane);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
#pragma unroll
    for (int k = 0; k < Pack16<T>::kN; ++k) sum += x[i][k];
  }
  layernorm_packed_finish<T, VEC>(out, mean, rstd, x, sum, weight, bias, row, C, lane);
}

// res = a + b (rounded to T and stored; the rounded values are normalised). res may be a or b:
// each pack is read before it is written, by the same lane.
template <class T, int VEC>
__global__ void residual_layernorm_forward_packed_kernel(
    T* res, T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, const T* a,
    const T* b, const T* __restrict__ weight, const T* __restrict__ bias, int64_t N, int C) {
  using P = Pack16<T>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const int packs = C / P::kN;
  const P* pa = reinterpret_cast<const P*>(a + row * C);
  const P* pb = reinterpret_cast<const P*>(b + row * C);
  P* pr = reinterpret_cast<P*>(res + row * C);
  float x[VEC][P::kN];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      const P va = pa[p];
      const P vb = pb[p];
      P r;
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        r.v[k] = from_f32<T>(to_f32(va.v[k]) + to_f32(vb.v[k]));
        x[i][k] = to_f32(r.v[k]);
        sum += x[i][k];
      }
      pr[p] = r;
    } else {
#pragma unroll
      for (int k = 0; k < P::kN; ++k) x[i][k] = 0.0f;
    }
  }
  layernorm_packed_finish<T, VEC>(out, mean, rstd, x, sum, weight, bias, row, C, lane);
}

// dinp += rstd (dn - mean(dn) - norm mean(dn norm)), dn = w dout, norm = (x - mean) rstd, for
// one row (one warp). The row's dout is in registers before dinp is written (dinp may be dout).
// With kGrads, also aw += norm dout and ab += dout over the lane's columns (the weight and bias
// gradients' partial sums).
template <class T, int VEC, bool kGrads>
__device__ __forceinline__ void layernorm_dinp_row(T* dinp, const T* dout,
                                                   const T* __restrict__ inp,
                                                   const T* __restrict__ weight, float m, float s,
                                                   int64_t row, int C, int lane,
                                                   float (&aw)[VEC][Pack16<T>::kN],
                                                   float (&ab)[VEC][Pack16<T>::kN]) {
  using P = Pack16<T>;
  const int packs = C / P::kN;
  float norm[VEC][P::kN], dn[VEC][P::kN];
  load_row<T, VEC>(norm, inp + row * C, packs, lane);
  load_row<T, VEC>(dn, dout + row * C, packs, lane);
  float dn_sum = 0.0f, dnn_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      const P w = reinterpret_cast<const P*>(weight)[p];
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        norm[i][k] = (norm[i][k] - m) * s;
        if constexpr (kGrads) {
          aw[i][k] += norm[i][k] * dn[i][k];
          ab[i][k] += dn[i][k];
        }
        dn[i][k] *= to_f32(w.v[k]);
        dn_sum += dn[i][k];
        dnn_sum += dn[i][k] * norm[i][k];
      }
    }
  }
  const float inv_c = 1.0f / static_cast<float>(C);
  const float dn_mean = warp_sum(dn_sum) * inv_c;
  const float dnn_mean = warp_sum(dnn_sum) * inv_c;
  P* di = reinterpret_cast<P*>(dinp + row * C);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      P v = di[p];
#pragma unroll
      for (int k = 0; k < P::kN; ++k)
        v.v[k] = from_f32<T>(to_f32(v.v[k]) + s * (dn[i][k] - dn_mean - norm[i][k] * dnn_mean));
      di[p] = v;
    }
  }
}

template <class T, int VEC>
__global__ void layernorm_dinp_packed_kernel(T* dinp, const T* dout, const T* __restrict__ inp,
                                             const T* __restrict__ weight,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, int64_t N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  float unused[VEC][Pack16<T>::kN];
  layernorm_dinp_row<T, VEC, false>(dinp, dout, inp, weight, mean[row], rstd[row], row, C, lane,
                                    unused, unused);
}

// layernorm_dinp_packed_kernel's dinp (the same row function) and, in the same pass over dout
// and inp, the weight and bias gradient partials: block b's warps walk rows b kRowsPerBlock + warp,
// b kRowsPerBlock + warp + gridDim.x kRowsPerBlock, ...; each lane sums norm dout and dout over
// its columns in registers; then the block's warps are added in order through shared memory
// ((kRowsPerBlock, 2C) floats) into partial[b] = [sum norm dout (C) | sum dout (C)]. One read of
// dout and inp for all three gradients. Lanes of at most kFusedVec packs (the accumulators stay
// in registers: C <= 768 in bf16/fp16, 384 in fp32).
constexpr int kFusedVec = 3;           // (4 spills at 2 blocks of 256 threads per SM)
constexpr int64_t kFusedBlocks = 264;  // the most blocks (partial rows): two per SM of an H100

template <class T, int VEC>
__global__ void __launch_bounds__(kRowThreads, 2)
    layernorm_backward_fused_kernel(T* dinp, float* __restrict__ partial, const T* dout,
                                    const T* __restrict__ inp, const T* __restrict__ weight,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    int64_t N, int C) {
  using P = Pack16<T>;
  extern __shared__ float red[];  // (kRowsPerBlock, 2C)
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int packs = C / P::kN;
  float aw[VEC][P::kN], ab[VEC][P::kN];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
#pragma unroll
    for (int k = 0; k < P::kN; ++k) aw[i][k] = ab[i][k] = 0.0f;
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    layernorm_dinp_row<T, VEC, true>(dinp, dout, inp, weight, mean[row], rstd[row], row, C, lane,
                                     aw, ab);
  }
  float* mine = red + static_cast<int64_t>(warp) * 2 * C;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        mine[p * P::kN + k] = aw[i][k];
        mine[C + p * P::kN + k] = ab[i][k];
      }
    }
  }
  __syncthreads();
  float* out = partial + static_cast<int64_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowsPerBlock; ++w) total += red[w * 2 * C + c];
    out[c] = total;
  }
}

std::atomic<bool>& fused_grads_flag() {
  static std::atomic<bool> on{env_switch("ZEROD_LAYERNORM_FUSED_GRADS", true)};
  return on;
}

int64_t fused_blocks(int64_t N) {
  const int64_t b = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  return b < kFusedBlocks ? b : kFusedBlocks;
}

// Calls fn(std::integral_constant<int, VEC>) for the packed path's VEC (packs_per_lane > 0).
template <class Fn>
void dispatch_vec(int vec, Fn&& fn) {
  switch (vec) {
    case 1:
      fn(std::integral_constant<int, 1>{});
      return;
    case 2:
      fn(std::integral_constant<int, 2>{});
      return;
    case 4:
      fn(std::integral_constant<int, 4>{});
      return;
    case 8:
      fn(std::integral_constant<int, 8>{});
      return;
    default:
      fn(std::integral_constant<int, 16>{});
      return;
  }
}

// The VEC of the packed path for these tensors, or 0 (the element-wise kernels).
template <class T>
int packed_vec(int C, const void* a, const void* b = nullptr, const void* c = nullptr,
               const void* d = nullptr, const void* e = nullptr) {
  constexpr int kPack = Pack16<T>::kN;
  if (C % kPack != 0) return 0;
  for (const void* p : {a, b, c, d, e}) {
    if (p != nullptr && !aligned16(p)) return 0;
  }
  return packs_per_lane(C, kPack);
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

// dweight[c] += column c of the partials, dbias[c] += column C + c: blocks of (32, kCombineRows)
// threads over the 2C columns of the (chunks, 2C) partials (combine_columns).
template <class T>
__global__ void layernorm_combine_kernel(T* dweight, T* dbias, const float* partial, int64_t chunks,
                                         int C) {
  __shared__ float sums[kCombineRows][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const float total = combine_columns(partial, chunks, 2 * C, col, sums);
  if (threadIdx.y != 0 || col >= 2 * C) return;
  if (col < C) {
    dweight[col] = from_f32<T>(to_f32(dweight[col]) + total);
  } else {
    dbias[col - C] = from_f32<T>(to_f32(dbias[col - C]) + total);
  }
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
    const int vec = packed_vec<T>(C, out, inp, weight, bias);
    if (vec > 0) {
      dispatch_vec(vec, [&](auto v) {
        layernorm_forward_packed_kernel<T, decltype(v)::value>
            <<<row_blocks(N), kRowThreads, 0, stream>>>(
                static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
      });
      return;
    }
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
    const int vec = packed_vec<T>(C, res, out, a, b, weight);
    if (vec > 0 && aligned16(bias)) {
      dispatch_vec(vec, [&](auto v) {
        residual_layernorm_forward_packed_kernel<T, decltype(v)::value>
            <<<row_blocks(N), kRowThreads, 0, stream>>>(
                static_cast<T*>(res), static_cast<T*>(out), mean, rstd, static_cast<const T*>(a),
                static_cast<const T*>(b), static_cast<const T*>(weight),
                static_cast<const T*>(bias), N, C);
      });
      return;
    }
    residual_layernorm_forward_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(res), static_cast<T*>(out), mean, rstd, static_cast<const T*>(a),
        static_cast<const T*>(b), static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
  });
  check(cudaGetLastError(), "residual_layernorm_forward kernel launch");
}

void set_layernorm_fused_gradients(bool on) {
  fused_grads_flag().store(on, std::memory_order_relaxed);
}

bool layernorm_fused_gradients() {
  return fused_grads_flag().load(std::memory_order_relaxed);
}

size_t layernorm_backward_scratch_bytes(int64_t N, int C) {
  if (N <= 0 || C <= 0) return 0;
  const int64_t rows = std::max(row_chunks(N, kMinChunkRows).count, fused_blocks(N));
  return static_cast<size_t>(rows) * 2 * static_cast<size_t>(C) * sizeof(float);
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
    const int vec = packed_vec<T>(C, dinp, dout, inp, weight);
    // The exact packs a lane holds (the other kernels round VEC up to a power of two).
    const int lane_packs = (C / Pack16<T>::kN + 31) / 32;
    if (vec > 0 && lane_packs <= kFusedVec && layernorm_fused_gradients()) {
      const int64_t blocks = fused_blocks(N);
      const size_t shared = static_cast<size_t>(kRowsPerBlock) * 2 * C * sizeof(float);
      auto launch = [&](auto v) {
        auto kernel = layernorm_backward_fused_kernel<T, decltype(v)::value>;
        allow_dynamic_shared(kernel, shared, "layernorm_backward: cudaFuncSetAttribute");
        kernel<<<static_cast<unsigned>(blocks), kRowThreads, shared, stream>>>(
            static_cast<T*>(dinp), scratch, static_cast<const T*>(dout), static_cast<const T*>(inp),
            static_cast<const T*>(weight), mean, rstd, N, C);
      };
      if (lane_packs == 1) launch(std::integral_constant<int, 1>{});
      if (lane_packs == 2) launch(std::integral_constant<int, 2>{});
      if (lane_packs == 3) launch(std::integral_constant<int, 3>{});
      check(cudaGetLastError(), "layernorm_backward fused kernel launch");
      layernorm_combine_kernel<T>
          <<<static_cast<unsigned>((2 * C + 31) / 32), dim3(32, kCombineRows), 0, stream>>>(
              static_cast<T*>(dweight), static_cast<T*>(dbias), scratch, blocks, C);
      check(cudaGetLastError(), "layernorm_backward combine kernel launch");
      return;
    }
    if (vec > 0) {
      dispatch_vec(vec, [&](auto v) {
        layernorm_dinp_packed_kernel<T, decltype(v)::value>
            <<<row_blocks(N), kRowThreads, 0, stream>>>(
                static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
                static_cast<const T*>(weight), mean, rstd, N, C);
      });
    } else {
      layernorm_dinp_kernel<T><<<row_blocks(N), kRowThreads, 0, stream>>>(
          static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
          static_cast<const T*>(weight), mean, rstd, N, C);
    }
    check(cudaGetLastError(), "layernorm_backward dinp kernel launch");
    layernorm_partials_kernel<T>
        <<<dim3(channel_blocks, static_cast<unsigned>(chunks)), kChannelThreads, 0, stream>>>(
            scratch, static_cast<const T*>(dout), static_cast<const T*>(inp), mean, rstd, N, C,
            rows_per_chunk);
    check(cudaGetLastError(), "layernorm_backward partials kernel launch");
    layernorm_combine_kernel<T>
        <<<static_cast<unsigned>((2 * C + 31) / 32), dim3(32, kCombineRows), 0, stream>>>(
            static_cast<T*>(dweight), static_cast<T*>(dbias), scratch, chunks, C);
    check(cudaGetLastError(), "layernorm_backward combine kernel launch");
  });
}

}  // namespace zerod::cuda
