// Launch shapes (256 threads = 8 warps per block, tiles of 32 queries x 32 keys converted to fp32
// in dynamic shared memory, K and V rows padded to an odd stride, as attention.cu):
// - forward: grid (ceil(Tq/32) query tiles, NH, B). The block walks every key tile of the block
//   of keys; the 32 x 32 visibility votes of a tile (positions in shared memory) decide with
//   __syncthreads_or whether it is loaded at all. Each warp owns 4 query rows with an online
//   softmax (m, l) and the unnormalised output row in registers (lane = channels lane + 32 e),
//   and finally merges them into out and lse.
// - backward D: one warp per (b, h, query) row, 8 per block.
// - backward dQ: grid as the forward; per visible key tile a lane computes P_ij and dS_ij for one
//   key, the warp accumulates dQ_i += dS_ij K_j; dQ is added to dqkv's query head at the end.
// - backward dK/dV: grid (ceil(Tk/32) key tiles, KVH, B); the block walks the query heads of its
//   key/value head in order and, for each, every query tile with a visible pair; a thread
//   computes P and dS for (query row, key = lane) into shared memory, then each warp accumulates
//   4 key rows of dK and dV with a lane per channel (in registers across the query heads).
#include <math_constants.h>

#include <type_traits>

#include "kernels/cuda/attention_block.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kTile = 32;  // queries per query tile and keys per key tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kTile / kWarps;

struct BlockShape {
  int Tq, Tk, NH, KVH, group, hs;
  int window;     // 0: causal only
  int64_t row;    // elements of a qkv row: (NH + 2 KVH) hs
  int64_t kvrow;  // elements of a kv row: 2 KVH hs
  int64_t orow;   // elements of an out row: NH hs
  float scale;
};

__host__ __device__ inline int padded(int hs) {
  return hs | 1;
}

__device__ __forceinline__ bool visible(int qp, int kp, int window) {
  return kp <= qp &&
         (window <= 0 || static_cast<long long>(kp) > static_cast<long long>(qp) - window);
}

// dst (kTile, ld) fp32 = rows [t0, t0 + kTile) of a (n, hs) view with row stride `stride`; rows
// at or after n are zero. Called by the whole block.
template <class T>
__device__ void load_tile(float* dst, int ld, const T* src, int64_t stride, int t0, int n, int hs) {
  for (int idx = threadIdx.x; idx < kTile * hs; idx += blockDim.x) {
    const int r = idx / hs;
    const int d = idx - r * hs;
    const int t = t0 + r;
    dst[r * ld + d] = t < n ? to_f32(src[static_cast<int64_t>(t) * stride + d]) : 0.0f;
  }
}

// pos_s[t] = pos[t0 + t] for the tile's valid rows (t0 + t < n). Threads 0..kTile-1.
__device__ __forceinline__ void load_positions(int* pos_s, const int32_t* pos, int t0, int n) {
  if (threadIdx.x < kTile) {
    const int t = t0 + static_cast<int>(threadIdx.x);
    pos_s[threadIdx.x] = t < n ? pos[t] : 0;
  }
}

// True on every thread when some query row of the tile at q0 sees some key of the tile at k0.
// Contains __syncthreads: call from all threads, after the positions are in shared memory.
__device__ bool tile_pair_visible(const int* qpos_s, int q0, int Tq, const int* kpos_s, int k0,
                                  int Tk, int window) {
  int any = 0;
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += blockDim.x) {
    const int r = idx / kTile;
    const int c = idx - r * kTile;
    if (q0 + r < Tq && k0 + c < Tk && visible(qpos_s[r], kpos_s[c], window)) any = 1;
  }
  return __syncthreads_or(any) != 0;
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// acc[e] (channel lane + 32 e) += sum over rows jj in [0, count) of coef_jj * rows[jj * ld +
// channel], coef_jj being lane jj's `coef`. One warp; count uniform over the warp.
template <int DPL>
__device__ __forceinline__ void warp_accumulate_rows(float (&acc)[DPL], float coef,
                                                     const float* rows, int ld, int count, int hs,
                                                     int lane) {
  for (int jj = 0; jj < count; ++jj) {
    const float cj = __shfl_sync(kFullMask, coef, jj);
    if (cj == 0.0f) continue;  // uniform: a hidden key
    const float* row = rows + jj * ld;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) acc[e] += cj * row[d];
    }
  }
}

// dst[d] = acc[e] * scale (+ dst[d] when `add`) for the lane's channels d = lane + 32 e < hs.
template <class T, int DPL>
__device__ __forceinline__ void store_row(T* dst, const float (&acc)[DPL], float scale, bool add,
                                          int hs, int lane) {
#pragma unroll
  for (int e = 0; e < DPL; ++e) {
    const int d = lane + 32 * e;
    if (d < hs) dst[d] = from_f32<T>(acc[e] * scale + (add ? to_f32(dst[d]) : 0.0f));
  }
}

// ---- forward ---------------------------------------------------------------------------------

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    block_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* qpos, const T* kv,
                         const int32_t* kpos, BlockShape sh, bool first) {
  extern __shared__ float smem[];
  __shared__ int qpos_s[kTile];
  __shared__ int kpos_s[kTile];
  const int hs = sh.hs;
  const int ldk = padded(hs);
  float* q_s = smem;               // (kTile, hs)
  float* k_s = q_s + kTile * hs;   // (kTile, ldk)
  float* v_s = k_s + kTile * ldk;  // (kTile, ldk)
  const int q0 = blockIdx.x * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const T* q_base = qkv + static_cast<int64_t>(b) * sh.Tq * sh.row + static_cast<int64_t>(h) * hs;
  const T* kv_rows = kv + static_cast<int64_t>(b) * sh.Tk * sh.kvrow;
  const T* k_base = kv_rows + static_cast<int64_t>(kvh) * hs;
  const T* v_base = kv_rows + static_cast<int64_t>(sh.KVH + kvh) * hs;

  load_tile(q_s, hs, q_base, sh.row, q0, sh.Tq, hs);
  load_positions(qpos_s, qpos, q0, sh.Tq);
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

  for (int k0 = 0; k0 < sh.Tk; k0 += kTile) {
    __syncthreads();  // the previous key tile is consumed (and q_s, qpos_s are loaded)
    load_positions(kpos_s, kpos, k0, sh.Tk);
    __syncthreads();
    if (!tile_pair_visible(qpos_s, q0, sh.Tq, kpos_s, k0, sh.Tk, sh.window)) continue;
    load_tile(k_s, ldk, k_base, sh.kvrow, k0, sh.Tk, hs);
    load_tile(v_s, ldk, v_base, sh.kvrow, k0, sh.Tk, hs);
    __syncthreads();
    const int count = min(kTile, sh.Tk - k0);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      if (q0 + r >= sh.Tq) continue;  // uniform over the warp
      const bool vis = lane < count && visible(qpos_s[r], kpos_s[lane], sh.window);
      if (!__any_sync(kFullMask, vis)) continue;  // the row sees no key of this tile
      const float s = vis ? dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale : -CUDART_INF_F;
      const float m_new = fmaxf(m[rr], warp_max(s));  // finite: some key is visible
      const float p = vis ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[rr] - m_new);  // 0 while m is -inf
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[rr][e] *= alpha;
      warp_accumulate_rows(o[rr], p, v_s, ldk, count, hs, lane);
    }
  }

  // Merge the block's rows into out and lse.
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.Tq) continue;
    T* orow = out + (static_cast<int64_t>(b) * sh.Tq + i) * sh.orow + static_cast<int64_t>(h) * hs;
    float* L = lse + (static_cast<int64_t>(b) * sh.NH + h) * sh.Tq + i;
    const float prev = first ? -CUDART_INF_F : *L;
    __syncwarp();         // every lane has read lse before lane 0 writes it
    if (l[rr] == 0.0f) {  // no key of the block is visible (uniform over the warp)
      if (first) {
        float zero[DPL];
#pragma unroll
        for (int e = 0; e < DPL; ++e) zero[e] = 0.0f;
        store_row(orow, zero, 1.0f, false, hs, lane);
        if (lane == 0) *L = -CUDART_INF_F;
      }
      continue;
    }
    const float lb = m[rr] + logf(l[rr]);
    if (prev == -CUDART_INF_F) {
      store_row(orow, o[rr], 1.0f / l[rr], false, hs, lane);
      if (lane == 0) *L = lb;
      continue;
    }
    const float merged = fmaxf(prev, lb) + log1pf(expf(-fabsf(prev - lb)));
    const float keep = expf(prev - merged);
    const float take = expf(m[rr] - merged);  // = exp(lb - merged) / l
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) orow[d] = from_f32<T>(to_f32(orow[d]) * keep + o[rr][e] * take);
    }
    if (lane == 0) *L = merged;
  }
}

// ---- backward --------------------------------------------------------------------------------

// D (B,NH,Tq) = dout . out over each head slice; one warp per row.
template <class T>
__global__ void block_d_kernel(float* D, const T* dout, const T* out, int64_t rows, BlockShape sh) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= rows) return;
  const int t = static_cast<int>(w % sh.Tq);
  const int64_t bh = w / sh.Tq;
  const int h = static_cast<int>(bh % sh.NH);
  const int64_t b = bh / sh.NH;
  const int64_t off = (b * sh.Tq + t) * sh.orow + static_cast<int64_t>(h) * sh.hs;
  float acc = 0.0f;
  for (int d = lane; d < sh.hs; d += 32) acc += to_f32(dout[off + d]) * to_f32(out[off + d]);
  acc = warp_sum(acc);
  if (lane == 0) D[w] = acc;
}

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    block_dq_kernel(T* dqkv, const T* dout, const T* qkv, const int32_t* qpos, const T* kv,
                    const int32_t* kpos, const float* lse, const float* D, BlockShape sh) {
  extern __shared__ float smem[];
  __shared__ int qpos_s[kTile];
  __shared__ int kpos_s[kTile];
  const int hs = sh.hs;
  const int ldk = padded(hs);
  float* q_s = smem;               // (kTile, hs)
  float* do_s = q_s + kTile * hs;  // (kTile, hs)
  float* k_s = do_s + kTile * hs;  // (kTile, ldk)
  float* v_s = k_s + kTile * ldk;  // (kTile, ldk)
  const int q0 = blockIdx.x * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t qoff = static_cast<int64_t>(b) * sh.Tq * sh.row + static_cast<int64_t>(h) * hs;
  const T* kv_rows = kv + static_cast<int64_t>(b) * sh.Tk * sh.kvrow;
  const T* k_base = kv_rows + static_cast<int64_t>(kvh) * hs;
  const T* v_base = kv_rows + static_cast<int64_t>(sh.KVH + kvh) * hs;
  const T* dbase = dout + static_cast<int64_t>(b) * sh.Tq * sh.orow + static_cast<int64_t>(h) * hs;
  const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.Tq;  // of lse and D

  load_tile(q_s, hs, qkv + qoff, sh.row, q0, sh.Tq, hs);
  load_tile(do_s, hs, dbase, sh.orow, q0, sh.Tq, hs);
  load_positions(qpos_s, qpos, q0, sh.Tq);
  float dq[kRowsPerWarp][DPL];
  float lse_r[kRowsPerWarp];
  float d_r[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    lse_r[rr] = i < sh.Tq ? lse[row0 + i] : -CUDART_INF_F;
    d_r[rr] = i < sh.Tq ? D[row0 + i] : 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) dq[rr][e] = 0.0f;
  }

  for (int k0 = 0; k0 < sh.Tk; k0 += kTile) {
    __syncthreads();
    load_positions(kpos_s, kpos, k0, sh.Tk);
    __syncthreads();
    if (!tile_pair_visible(qpos_s, q0, sh.Tq, kpos_s, k0, sh.Tk, sh.window)) continue;
    load_tile(k_s, ldk, k_base, sh.kvrow, k0, sh.Tk, hs);
    load_tile(v_s, ldk, v_base, sh.kvrow, k0, sh.Tk, hs);
    __syncthreads();
    const int count = min(kTile, sh.Tk - k0);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      if (q0 + r >= sh.Tq || lse_r[rr] == -CUDART_INF_F) continue;  // uniform
      const bool vis = lane < count && visible(qpos_s[r], kpos_s[lane], sh.window);
      if (!__any_sync(kFullMask, vis)) continue;
      float ds = 0.0f;
      if (vis) {
        const float p = expf(dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale - lse_r[rr]);
        ds = p * (dot(do_s + r * hs, v_s + lane * ldk, hs) - d_r[rr]);
      }
      warp_accumulate_rows(dq[rr], ds, k_s, ldk, count, hs, lane);
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.Tq) continue;
    store_row(dqkv + qoff + static_cast<int64_t>(i) * sh.row, dq[rr], sh.scale, true, hs, lane);
  }
}

template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    block_dkdv_kernel(T* dkv, const T* dout, const T* qkv, const int32_t* qpos, const T* kv,
                      const int32_t* kpos, const float* lse, const float* D, BlockShape sh,
                      bool accumulate) {
  extern __shared__ float smem[];
  __shared__ int qpos_s[kTile];
  __shared__ int kpos_s[kTile];
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
  const int k0 = blockIdx.x * kTile;
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t kv0 = static_cast<int64_t>(b) * sh.Tk * sh.kvrow;
  const int64_t k_off = static_cast<int64_t>(kvh) * hs;
  const int64_t v_off = static_cast<int64_t>(sh.KVH + kvh) * hs;
  const T* q_rows = qkv + static_cast<int64_t>(b) * sh.Tq * sh.row;

  load_tile(k_s, ldk, kv + kv0 + k_off, sh.kvrow, k0, sh.Tk, hs);
  load_tile(v_s, ldk, kv + kv0 + v_off, sh.kvrow, k0, sh.Tk, hs);
  load_positions(kpos_s, kpos, k0, sh.Tk);
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

  // The query heads sharing this key/value head, in order (a deterministic sum).
  for (int g = 0; g < sh.group; ++g) {
    const int h = kvh * sh.group + g;
    const T* q_base = q_rows + static_cast<int64_t>(h) * hs;
    const T* dbase =
        dout + static_cast<int64_t>(b) * sh.Tq * sh.orow + static_cast<int64_t>(h) * hs;
    const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.Tq;
    for (int q0 = 0; q0 < sh.Tq; q0 += kTile) {
      __syncthreads();  // the previous query tile is consumed (and k_s, v_s, kpos_s are loaded)
      load_positions(qpos_s, qpos, q0, sh.Tq);
      __syncthreads();
      if (!tile_pair_visible(qpos_s, q0, sh.Tq, kpos_s, k0, sh.Tk, sh.window)) continue;
      load_tile(q_s, hs, q_base, sh.row, q0, sh.Tq, hs);
      load_tile(do_s, hs, dbase, sh.orow, q0, sh.Tq, hs);
      if (threadIdx.x < kTile) {
        const int i = q0 + threadIdx.x;
        lse_s[threadIdx.x] = i < sh.Tq ? lse[row0 + i] : -CUDART_INF_F;
        d_s[threadIdx.x] = i < sh.Tq ? D[row0 + i] : 0.0f;
      }
      __syncthreads();
      // P and dS of (query row r, key lane), zero where hidden, past Tq / Tk, or lse is -inf.
#pragma unroll
      for (int u = 0; u < kRowsPerWarp; ++u) {
        const int r = warp + kWarps * u;
        float p = 0.0f, ds = 0.0f;
        if (q0 + r < sh.Tq && k0 + lane < sh.Tk && lse_s[r] != -CUDART_INF_F &&
            visible(qpos_s[r], kpos_s[lane], sh.window)) {
          p = expf(dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale - lse_s[r]);
          ds = p * (dot(do_s + r * hs, v_s + lane * ldk, hs) - d_s[r]);
        }
        p_s[r * kTile + lane] = p;
        ds_s[r * kTile + lane] = ds;
      }
      __syncthreads();
      const int rows = min(kTile, sh.Tq - q0);
#pragma unroll
      for (int u = 0; u < kRowsPerWarp; ++u) {
        const int jl = warp + kWarps * u;
        for (int r = 0; r < rows; ++r) {
          const float pv = p_s[r * kTile + jl];
          const float dsv = ds_s[r * kTile + jl];
          if (pv == 0.0f && dsv == 0.0f) continue;  // uniform over the warp
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
  }

#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u) {
    const int t = k0 + warp + kWarps * u;
    if (t >= sh.Tk) continue;
    T* row = dkv + kv0 + static_cast<int64_t>(t) * sh.kvrow;
    store_row(row + k_off, dk[u], sh.scale, accumulate, hs, lane);
    store_row(row + v_off, dv[u], 1.0f, accumulate, hs, lane);
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

BlockShape make_shape(const AttentionDims& s, int Tk) {
  if (s.NH <= 0 || s.KVH <= 0 || s.NH % s.KVH != 0 || s.HS < 1 || s.HS > kAttentionMaxHeadSize ||
      s.window < 0 || Tk < 0) {
    check(cudaErrorInvalidValue, "attention_block: invalid shape (heads, head size, window, Tk)");
  }
  BlockShape sh{};
  sh.Tq = s.T;
  sh.Tk = Tk;
  sh.NH = s.NH;
  sh.KVH = s.KVH;
  sh.group = s.NH / s.KVH;
  sh.hs = s.HS;
  sh.window = s.window;
  sh.row = s.qkv_row();
  sh.kvrow = static_cast<int64_t>(2) * s.KVH * s.HS;
  sh.orow = s.out_row();
  sh.scale = 1.0f / sqrtf(static_cast<float>(s.HS));
  return sh;
}

unsigned tiles(int n) {
  return static_cast<unsigned>((n + kTile - 1) / kTile);
}

}  // namespace

void attention_block_forward(Storage dt, void* out, float* lse, const void* qkv,
                             const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                             const AttentionDims& s, bool first_block, cudaStream_t stream) {
  const BlockShape sh = make_shape(s, Tk);
  if (s.B <= 0 || s.T <= 0) return;
  // With no keys the kernel walks no tile: every row is merged as "sees nothing".
  const int ldk = padded(sh.hs);
  const size_t shared =
      (static_cast<size_t>(kTile) * sh.hs + 2 * static_cast<size_t>(kTile) * ldk) * sizeof(float);
  const dim3 grid(tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    dispatch_head_size(sh.hs, [&](auto dpl) {
      auto kernel = block_forward_kernel<E, decltype(dpl)::value>;
      allow_dynamic_shared(kernel, shared, "attention_block_forward: cudaFuncSetAttribute");
      kernel<<<grid, kThreads, shared, stream>>>(static_cast<E*>(out), lse,
                                                 static_cast<const E*>(qkv), qpos,
                                                 static_cast<const E*>(kv), kpos, sh, first_block);
    });
  });
  check(cudaGetLastError(), "attention_block_forward kernel launch");
}

size_t attention_block_backward_scratch_bytes(const AttentionDims& s) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0) return 0;
  return static_cast<size_t>(s.B) * s.NH * s.T * sizeof(float);
}

void attention_block_backward(Storage dt, void* dqkv, void* dkv, const void* dout, const void* qkv,
                              const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                              const void* out, const float* lse, const AttentionDims& s,
                              bool accumulate_dkv, float* scratch, cudaStream_t stream) {
  const BlockShape sh = make_shape(s, Tk);
  if (s.B <= 0 || Tk <= 0) return;
  if (s.T <= 0) {  // no queries: the block's gradients are zero
    if (!accumulate_dkv) {
      const size_t elem = dt == Storage::kF32 ? sizeof(float) : sizeof(uint16_t);
      check(cudaMemsetAsync(dkv, 0, static_cast<size_t>(s.B) * Tk * sh.kvrow * elem, stream),
            "attention_block_backward: cudaMemsetAsync");
    }
    return;
  }
  const int ldk = padded(sh.hs);
  const int64_t rows = static_cast<int64_t>(s.B) * s.NH * s.T;
  const size_t tile_q = static_cast<size_t>(kTile) * sh.hs;
  const size_t tile_k = static_cast<size_t>(kTile) * ldk;
  const size_t dq_shared = (2 * tile_q + 2 * tile_k) * sizeof(float);
  const size_t dkdv_shared =
      (2 * tile_k + 2 * tile_q + 2 * static_cast<size_t>(kTile) * kTile + 2 * kTile) *
      sizeof(float);
  const dim3 dq_grid(tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  const dim3 dkdv_grid(tiles(Tk), static_cast<unsigned>(s.KVH), static_cast<unsigned>(s.B));
  float* D = scratch;
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    const E* dout_t = static_cast<const E*>(dout);
    const E* qkv_t = static_cast<const E*>(qkv);
    const E* kv_t = static_cast<const E*>(kv);
    block_d_kernel<E><<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
        D, dout_t, static_cast<const E*>(out), rows, sh);
    check(cudaGetLastError(), "attention_block_backward D kernel launch");
    dispatch_head_size(sh.hs, [&](auto dpl) {
      constexpr int kDpl = decltype(dpl)::value;
      auto dq_kernel = block_dq_kernel<E, kDpl>;
      allow_dynamic_shared(dq_kernel, dq_shared,
                           "attention_block_backward dQ: cudaFuncSetAttribute");
      dq_kernel<<<dq_grid, kThreads, dq_shared, stream>>>(static_cast<E*>(dqkv), dout_t, qkv_t,
                                                          qpos, kv_t, kpos, lse, D, sh);
      check(cudaGetLastError(), "attention_block_backward dQ kernel launch");
      auto dkdv_kernel = block_dkdv_kernel<E, kDpl>;
      allow_dynamic_shared(dkdv_kernel, dkdv_shared,
                           "attention_block_backward dK/dV: cudaFuncSetAttribute");
      dkdv_kernel<<<dkdv_grid, kThreads, dkdv_shared, stream>>>(
          static_cast<E*>(dkv), dout_t, qkv_t, qpos, kv_t, kpos, lse, D, sh, accumulate_dkv);
      check(cudaGetLastError(), "attention_block_backward dK/dV kernel launch");
    });
  });
}

}  // namespace zerod::cuda
