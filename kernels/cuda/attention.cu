// Launch shapes (256 threads = 8 warps per block, tiles of 32 queries x 32 keys, K/V/Q/dO tiles
// converted to fp32 in dynamic shared memory, K and V rows padded to an odd stride so that a
// lane per key reads without bank conflicts):
// - forward: grid (ceil(T/32) query tiles, NH, B), heaviest (last) query tiles first. Each warp
//   owns 4 query rows; per key tile a lane computes one key's score, the warp keeps an online
//   softmax (running max m, sum l) and the output row in registers (lane = channels lane+32e).
// - backward D: one warp per (b, h, t) row, 8 per block.
// - backward dQ: grid as the forward; per key tile a lane computes P_ij and dS_ij for one key,
//   then the warp accumulates dQ_i += dS_ij K_j with a lane per channel.
// - backward dK/dV: grid (ceil(T/32) key tiles, NH, B); the block walks the query tiles at and
//   after its keys; a thread computes P and dS for (query row, key = lane) into shared memory,
//   then each warp accumulates 4 key rows of dK and dV with a lane per channel.
#include <math_constants.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kTile = 32;  // queries per query tile and keys per key tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

struct Shape {
  int T, C, NH, hs;
  float scale;
};

// Row stride of the K and V tiles in shared memory: odd, so that lane j reading row j hits
// bank (j * stride + d) % 32, all distinct.
__host__ __device__ inline int padded(int hs) {
  return hs | 1;
}

// dst (kTile, ld) fp32 = rows [t0, t0 + kTile) of a (T, hs) view with row stride `stride`;
// rows at or after T are zero. Called by the whole block.
template <class T>
__device__ void load_tile(float* dst, int ld, const T* src, int64_t stride, int t0, int T_,
                          int hs) {
  for (int idx = threadIdx.x; idx < kTile * hs; idx += blockDim.x) {
    const int r = idx / hs;
    const int d = idx - r * hs;
    const int t = t0 + r;
    dst[r * ld + d] = t < T_ ? to_f32(src[static_cast<int64_t>(t) * stride + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// acc[e] (channel lane + 32 e) += sum over rows jj < count of coef_jj * rows[jj * ld + channel],
// where coef_jj is lane jj's `coef` (broadcast over the warp). One warp; count <= 32.
template <int DPL>
__device__ __forceinline__ void warp_accumulate_rows(float (&acc)[DPL], float coef,
                                                     const float* rows, int ld, int count, int hs,
                                                     int lane) {
  for (int jj = 0; jj < count; ++jj) {
    const float cj = __shfl_sync(kFullMask, coef, jj);
    const float* row = rows + jj * ld;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) acc[e] += cj * row[d];
    }
  }
}

// dst[d] = acc[e] * scale for the lane's channels d = lane + 32 e < hs.
template <class T, int DPL>
__device__ __forceinline__ void store_row(T* dst, const float (&acc)[DPL], float scale, int hs,
                                          int lane) {
#pragma unroll
  for (int e = 0; e < DPL; ++e) {
    const int d = lane + 32 * e;
    if (d < hs) dst[d] = from_f32<T>(acc[e] * scale);
  }
}

// ---- forward ---------------------------------------------------------------------------------

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv, Shape sh) {
  extern __shared__ float smem[];
  const int hs = sh.hs;
  const int ldk = padded(hs);
  float* q_s = smem;               // (kTile, hs)
  float* k_s = q_s + kTile * hs;   // (kTile, ldk)
  float* v_s = k_s + kTile * ldk;  // (kTile, ldk)
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t C3 = 3 * static_cast<int64_t>(sh.C);
  const T* base = qkv + static_cast<int64_t>(b) * sh.T * C3 + static_cast<int64_t>(h) * hs;

  load_tile(q_s, hs, base, C3, q0, sh.T, hs);
  float o[kRowsPerWarp][DPL];
  float m[kRowsPerWarp];
  float l[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -CUDART_INF_F;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[rr][e] = 0.0f;
  }

  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // the previous key tile is consumed (and q_s is loaded, the first time)
    load_tile(k_s, ldk, base + sh.C, C3, k0, sh.T, hs);
    load_tile(v_s, ldk, base + 2 * static_cast<int64_t>(sh.C), C3, k0, sh.T, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = q0 + r;
      if (i >= sh.T) continue;  // uniform over the warp
      const int j = k0 + lane;
      float s = -CUDART_INF_F;
      if (j <= i) s = dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale;
      // Key 0 is visible to every query, so m is finite from the first tile on.
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float p = j <= i ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[rr] - m_new);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[rr][e] *= alpha;
      warp_accumulate_rows(o[rr], p, v_s, ldk, min(kTile, i - k0 + 1), hs, lane);
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.T) continue;
    const float inv = 1.0f / l[rr];
    store_row(out + (static_cast<int64_t>(b) * sh.T + i) * sh.C + static_cast<int64_t>(h) * hs,
              o[rr], inv, hs, lane);
    if (lane == 0) lse[(static_cast<int64_t>(b) * sh.NH + h) * sh.T + i] = m[rr] + logf(l[rr]);
  }
}

// ---- backward --------------------------------------------------------------------------------

// D (B,NH,T) = dout . out over each head slice; one warp per row.
template <class T>
__global__ void attention_d_kernel(float* D, const T* dout, const T* out, int64_t rows, Shape sh) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= rows) return;
  const int t = static_cast<int>(w % sh.T);
  const int64_t bh = w / sh.T;
  const int h = static_cast<int>(bh % sh.NH);
  const int64_t b = bh / sh.NH;
  const int64_t off = (b * sh.T + t) * sh.C + static_cast<int64_t>(h) * sh.hs;
  float acc = 0.0f;
  for (int d = lane; d < sh.hs; d += 32) acc += to_f32(dout[off + d]) * to_f32(out[off + d]);
  acc = warp_sum(acc);
  if (lane == 0) D[w] = acc;
}

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                        Shape sh) {
  extern __shared__ float smem[];
  const int hs = sh.hs;
  const int ldk = padded(hs);
  float* q_s = smem;               // (kTile, hs)
  float* do_s = q_s + kTile * hs;  // (kTile, hs)
  float* k_s = do_s + kTile * hs;  // (kTile, ldk)
  float* v_s = k_s + kTile * ldk;  // (kTile, ldk)
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t C3 = 3 * static_cast<int64_t>(sh.C);
  const T* base = qkv + static_cast<int64_t>(b) * sh.T * C3 + static_cast<int64_t>(h) * hs;
  const T* dbase = dout + static_cast<int64_t>(b) * sh.T * sh.C + static_cast<int64_t>(h) * hs;
  const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;  // of lse and D

  load_tile(q_s, hs, base, C3, q0, sh.T, hs);
  load_tile(do_s, hs, dbase, sh.C, q0, sh.T, hs);
  float dq[kRowsPerWarp][DPL];
  float lse_r[kRowsPerWarp];
  float d_r[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    lse_r[rr] = i < sh.T ? lse[row0 + i] : 0.0f;
    d_r[rr] = i < sh.T ? D[row0 + i] : 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) dq[rr][e] = 0.0f;
  }

  for (int k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();
    load_tile(k_s, ldk, base + sh.C, C3, k0, sh.T, hs);
    load_tile(v_s, ldk, base + 2 * static_cast<int64_t>(sh.C), C3, k0, sh.T, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = q0 + r;
      if (i >= sh.T) continue;
      const int j = k0 + lane;
      float ds = 0.0f;
      if (j <= i) {
        const float p = expf(dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale - lse_r[rr]);
        ds = p * (dot(do_s + r * hs, v_s + lane * ldk, hs) - d_r[rr]);
      }
      warp_accumulate_rows(dq[rr], ds, k_s, ldk, min(kTile, i - k0 + 1), hs, lane);
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.T) continue;
    store_row(dqkv + (static_cast<int64_t>(b) * sh.T + i) * C3 + static_cast<int64_t>(h) * hs,
              dq[rr], sh.scale, hs, lane);
  }
}

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                          Shape sh) {
  extern __shared__ float smem[];
  const int hs = sh.hs;
  const int ldk = padded(hs);
  float* k_s = smem;                    // (kTile, ldk)
  float* v_s = k_s + kTile * ldk;       // (kTile, ldk)
  float* q_s = v_s + kTile * ldk;       // (kTile, hs)
  float* do_s = q_s + kTile * hs;       // (kTile, hs)
  float* p_s = do_s + kTile * hs;       // (kTile queries, kTile keys)
  float* ds_s = p_s + kTile * kTile;    // (kTile queries, kTile keys)
  float* lse_s = ds_s + kTile * kTile;  // (kTile)
  float* d_s = lse_s + kTile;           // (kTile)
  const int k0 = blockIdx.x * kTile;    // the first key tiles see the most queries: launched first
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t C3 = 3 * static_cast<int64_t>(sh.C);
  const T* base = qkv + static_cast<int64_t>(b) * sh.T * C3 + static_cast<int64_t>(h) * hs;
  const T* dbase = dout + static_cast<int64_t>(b) * sh.T * sh.C + static_cast<int64_t>(h) * hs;
  const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;

  load_tile(k_s, ldk, base + sh.C, C3, k0, sh.T, hs);
  load_tile(v_s, ldk, base + 2 * static_cast<int64_t>(sh.C), C3, k0, sh.T, hs);
  // Warp w accumulates the key rows w + kWarps * u of the tile.
  float dk[kRowsPerWarp][DPL];
  float dv[kRowsPerWarp][DPL];
#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u) {
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      dk[u][e] = 0.0f;
      dv[u][e] = 0.0f;
    }
  }

  for (int q0 = k0; q0 < sh.T; q0 += kTile) {
    __syncthreads();  // the previous query tile is consumed
    load_tile(q_s, hs, base, C3, q0, sh.T, hs);
    load_tile(do_s, hs, dbase, sh.C, q0, sh.T, hs);
    if (threadIdx.x < kTile) {
      const int i = q0 + threadIdx.x;
      lse_s[threadIdx.x] = i < sh.T ? lse[row0 + i] : 0.0f;
      d_s[threadIdx.x] = i < sh.T ? D[row0 + i] : 0.0f;
    }
    __syncthreads();
    // P and dS of (query row r, key lane), zero where masked or past T.
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
      const int r = warp + kWarps * u;
      const int i = q0 + r;
      const int j = k0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < sh.T && j <= i) {
        p = expf(dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale - lse_s[r]);
        ds = p * (dot(do_s + r * hs, v_s + lane * ldk, hs) - d_s[r]);
      }
      p_s[r * kTile + lane] = p;
      ds_s[r * kTile + lane] = ds;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
      const int jl = warp + kWarps * u;
      const int r_begin = q0 == k0 ? jl : 0;  // earlier queries of the diagonal tile are masked
      for (int r = r_begin; r < kTile; ++r) {
        const float pv = p_s[r * kTile + jl];
        const float dsv = ds_s[r * kTile + jl];
        const float* dor = do_s + r * hs;
        const float* qr = q_s + r * hs;
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
          const int d = lane + 32 * e;
          if (d < hs) {
            dv[u][e] += pv * dor[d];
            dk[u][e] += dsv * qr[d];
          }
        }
      }
    }
  }

#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u) {
    const int t = k0 + warp + kWarps * u;
    if (t >= sh.T) continue;
    T* row = dqkv + (static_cast<int64_t>(b) * sh.T + t) * C3 + static_cast<int64_t>(h) * hs;
    store_row(row + sh.C, dk[u], sh.scale, hs, lane);
    store_row(row + 2 * static_cast<int64_t>(sh.C), dv[u], 1.0f, hs, lane);
  }
}

// ---- launch helpers ------------------------------------------------------------------------

// Calls fn(std::integral_constant<int, DPL>{}) with DPL the channels per lane for head size hs.
template <class Fn>
void dispatch_head_size(int hs, Fn&& fn) {
  if (hs <= 32) {
    fn(std::integral_constant<int, 1>{});
  } else if (hs <= 64) {
    fn(std::integral_constant<int, 2>{});
  } else if (hs <= 128) {
    fn(std::integral_constant<int, 4>{});
  } else {
    fn(std::integral_constant<int, 8>{});
  }
}

// Allows `bytes` of dynamic shared memory for `kernel` when over the default 48 KiB.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* what) {
  if (bytes > kDefaultSharedBytes) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)),
          what);
  }
}

Shape make_shape(int T, int C, int NH) {
  Shape sh{};
  sh.T = T;
  sh.C = C;
  sh.NH = NH;
  sh.hs = C / NH;
  sh.scale = 1.0f / sqrtf(static_cast<float>(sh.hs));
  return sh;
}

unsigned tiles(int T) {
  return static_cast<unsigned>((T + kTile - 1) / kTile);
}

// The implementation in use: ZEROD_ATTENTION=simt at start forces the SIMT kernels of this file;
// set_attention_impl changes it.
std::atomic<AttentionImpl>& impl_in_use() {
  static std::atomic<AttentionImpl> impl{[] {
    const char* e = std::getenv("ZEROD_ATTENTION");
    return e != nullptr && std::strcmp(e, "simt") == 0 ? AttentionImpl::kSimt
                                                       : AttentionImpl::kAuto;
  }()};
  return impl;
}

bool force_simt() {
  return impl_in_use().load(std::memory_order_relaxed) == AttentionImpl::kSimt;
}

}  // namespace

void set_attention_impl(AttentionImpl impl) {
  impl_in_use().store(impl, std::memory_order_relaxed);
}

AttentionImpl attention_impl() {
  return impl_in_use().load(std::memory_order_relaxed);
}

void attention_forward(Storage dt, void* out, float* lse, const void* qkv, int B, int T, int C,
                       int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0) return;
  if (!force_simt() && attention_tc_supported(dt, C, NH, out, qkv)) {
    attention_tc_forward(dt, out, lse, qkv, B, T, C, NH, stream);
    return;
  }
  const Shape sh = make_shape(T, C, NH);
  const int ldk = padded(sh.hs);
  const size_t shared =
      (static_cast<size_t>(kTile) * sh.hs + 2 * static_cast<size_t>(kTile) * ldk) * sizeof(float);
  const dim3 grid(tiles(T), static_cast<unsigned>(NH), static_cast<unsigned>(B));
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    dispatch_head_size(sh.hs, [&](auto dpl) {
      auto kernel = attention_forward_kernel<E, decltype(dpl)::value>;
      allow_shared(kernel, shared, "attention_forward: cudaFuncSetAttribute");
      kernel<<<grid, kThreads, shared, stream>>>(static_cast<E*>(out), lse,
                                                 static_cast<const E*>(qkv), sh);
    });
  });
  check(cudaGetLastError(), "attention_forward kernel launch");
}

size_t attention_backward_scratch_bytes(int B, int T, int NH) {
  if (B <= 0 || T <= 0) return 0;
  return static_cast<size_t>(B) * NH * T * sizeof(float);
}

void attention_backward(Storage dt, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int C, int NH, float* scratch,
                        cudaStream_t stream) {
  if (B <= 0 || T <= 0) return;
  if (!force_simt() && attention_tc_supported(dt, C, NH, dqkv, dout, qkv, out)) {
    attention_tc_backward(dt, dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, stream);
    return;
  }
  const Shape sh = make_shape(T, C, NH);
  const int ldk = padded(sh.hs);
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  const size_t tile_q = static_cast<size_t>(kTile) * sh.hs;
  const size_t tile_k = static_cast<size_t>(kTile) * ldk;
  const size_t dq_shared = (2 * tile_q + 2 * tile_k) * sizeof(float);
  const size_t dkdv_shared =
      (2 * tile_k + 2 * tile_q + 2 * static_cast<size_t>(kTile) * kTile + 2 * kTile) *
      sizeof(float);
  const dim3 grid(tiles(T), static_cast<unsigned>(NH), static_cast<unsigned>(B));
  float* D = scratch;
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const E* dout_t = static_cast<const E*>(dout);
    const E* qkv_t = static_cast<const E*>(qkv);
    attention_d_kernel<E>
        <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
            D, dout_t, static_cast<const E*>(out), rows, sh);
    check(cudaGetLastError(), "attention_backward D kernel launch");
    dispatch_head_size(sh.hs, [&](auto dpl) {
      constexpr int kDpl = decltype(dpl)::value;
      auto dq_kernel = attention_dq_kernel<E, kDpl>;
      allow_shared(dq_kernel, dq_shared, "attention_backward dQ: cudaFuncSetAttribute");
      dq_kernel<<<grid, kThreads, dq_shared, stream>>>(static_cast<E*>(dqkv), dout_t, qkv_t, lse, D,
                                                       sh);
      check(cudaGetLastError(), "attention_backward dQ kernel launch");
      auto dkdv_kernel = attention_dkdv_kernel<E, kDpl>;
      allow_shared(dkdv_kernel, dkdv_shared, "attention_backward dK/dV: cudaFuncSetAttribute");
      dkdv_kernel<<<grid, kThreads, dkdv_shared, stream>>>(static_cast<E*>(dqkv), dout_t, qkv_t,
                                                           lse, D, sh);
      check(cudaGetLastError(), "attention_backward dK/dV kernel launch");
    });
  });
}

}  // namespace zerod::cuda
