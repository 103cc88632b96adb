// Launch shapes (256 threads = 8 warps per block, tiles of 32 queries x 32 keys, K/V/Q/dO tiles
// converted to fp32 in dynamic shared memory, K and V rows padded to an odd stride so that a
// lane per key reads without bank conflicts):
// - forward: grid (ceil(T/32) query tiles, NH, B), heaviest (last) query tiles first. The block
//   reads the key/value head of its query head (h / (NH/KVH)) in place and walks the key tiles
//   its queries see (from the first key inside the window of its first query, up to the
//   diagonal). Each warp owns 4 query rows; per key tile a lane computes one key's score, the
//   warp keeps an online softmax (running max m, sum l) and the output row in registers
//   (lane = channels lane+32e).
// - backward D: one warp per (b, h, t) row, 8 per block.
// - backward dQ: grid as the forward; per key tile a lane computes P_ij and dS_ij for one key,
//   then the warp accumulates dQ_i += dS_ij K_j with a lane per channel.
// - backward dK/dV: grid (ceil(T/32) key tiles, KVH, B); the block walks the query heads of its
//   key/value head in order and, for each, the query tiles that see its keys (at and after the
//   keys, up to the window's end); a thread computes P and dS for (query row, key = lane) into
//   shared memory, then each warp accumulates 4 key rows of dK and dV with a lane per channel
//   (in registers across the query heads: the sum of a shared head, without atomics).
// - KV cache: a grid-stride copy of the new k/v rows into the caches, then one warp per
//   (b, h, new query) with an online softmax over the cached keys it sees, 32 keys (a lane each)
//   at a time.
#include <math_constants.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kTile = 32;  // queries per query tile and keys per key tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kTile / kWarps;

struct Shape {
  int T, NH, KVH, group, hs;
  int window;                // 0 (causal) or 0 < window < T (a wider window changes nothing)
  const int32_t* doc_start;  // (B,T) document masking, or null (see AttentionDims)
  int64_t row;               // elements of a qkv row: (NH + 2 KVH) hs
  int64_t orow;              // elements of an out row: NH hs
  float scale;
};

// Row stride of the K and V tiles in shared memory: odd, so that lane j reading row j hits
// bank (j * stride + d) % 32, all distinct.
__host__ __device__ inline int padded(int hs) {
  return hs | 1;
}

// The first key query i sees: the window's first, and with document masking (ds: the batch
// row's doc_start, or null) not before i's document. Non-decreasing in i, so a query tile's
// first row gives the tile's first key.
__device__ inline int first_visible(int i, int window, const int32_t* ds) {
  const int w = window > 0 ? max(0, i - window + 1) : 0;
  return ds != nullptr ? max(w, ds[i]) : w;
}

// The first key tile query tile q0 needs: the one holding q0's first visible key.
__device__ inline int first_key_tile(int q0, int window, const int32_t* ds) {
  return first_visible(q0, window, ds) / kTile * kTile;
}

// The batch row's doc_start (or null without document masking).
__device__ inline const int32_t* row_doc_start(const Shape& sh, int b) {
  return sh.doc_start != nullptr ? sh.doc_start + static_cast<int64_t>(b) * sh.T : nullptr;
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

// acc[e] (channel lane + 32 e) += sum over rows jj in [begin, end) of coef_jj * rows[jj * ld +
// channel], where coef_jj is lane jj's `coef` (broadcast over the warp). One warp;
// 0 <= begin, end <= 32, both uniform over the warp.
template <int DPL>
__device__ __forceinline__ void warp_accumulate_rows(float (&acc)[DPL], float coef,
                                                     const float* rows, int ld, int begin, int end,
                                                     int hs, int lane) {
  for (int jj = begin; jj < end; ++jj) {
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

// The keys of the key tile at k0 that query i sees: [*lo, *hi] (empty when *lo > *hi).
__device__ __forceinline__ void visible_keys(int i, int k0, int window, const int32_t* ds, int* lo,
                                             int* hi) {
  *lo = max(k0, first_visible(i, window, ds));
  *hi = min(k0 + kTile - 1, i);
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
  const int kvh = h / sh.group;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * hs;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * hs;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * hs;
  const int32_t* doc = row_doc_start(sh, b);

  load_tile(q_s, hs, q_base, sh.row, q0, sh.T, hs);
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

  for (int k0 = first_key_tile(q0, sh.window, doc); k0 <= q0; k0 += kTile) {
    __syncthreads();  // the previous key tile is consumed (and q_s is loaded, the first time)
    load_tile(k_s, ldk, k_base, sh.row, k0, sh.T, hs);
    load_tile(v_s, ldk, v_base, sh.row, k0, sh.T, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = q0 + r;
      if (i >= sh.T) continue;  // uniform over the warp
      int jlo, jhi;
      visible_keys(i, k0, sh.window, doc, &jlo, &jhi);
      if (jlo > jhi) continue;  // the row sees no key of this tile (uniform)
      const int j = k0 + lane;
      const bool vis = j >= jlo && j <= jhi;
      float s = -CUDART_INF_F;
      if (vis) s = dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale;
      // Some key of the tile is visible, so m_new is finite (alpha = 0 while m is -inf).
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float p = vis ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[rr] - m_new);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[rr][e] *= alpha;
      warp_accumulate_rows(o[rr], p, v_s, ldk, jlo - k0, jhi - k0 + 1, hs, lane);
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.T) continue;
    const float inv = 1.0f / l[rr];  // every row sees its own key: l >= 1
    store_row(out + (static_cast<int64_t>(b) * sh.T + i) * sh.orow + static_cast<int64_t>(h) * hs,
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
  const int64_t off = (b * sh.T + t) * sh.orow + static_cast<int64_t>(h) * sh.hs;
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
  const int kvh = h / sh.group;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * hs;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * hs;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * hs;
  const T* dbase = dout + static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * hs;
  const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;  // of lse and D
  const int32_t* doc = row_doc_start(sh, b);

  load_tile(q_s, hs, q_base, sh.row, q0, sh.T, hs);
  load_tile(do_s, hs, dbase, sh.orow, q0, sh.T, hs);
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

  for (int k0 = first_key_tile(q0, sh.window, doc); k0 <= q0; k0 += kTile) {
    __syncthreads();
    load_tile(k_s, ldk, k_base, sh.row, k0, sh.T, hs);
    load_tile(v_s, ldk, v_base, sh.row, k0, sh.T, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int i = q0 + r;
      if (i >= sh.T) continue;
      int jlo, jhi;
      visible_keys(i, k0, sh.window, doc, &jlo, &jhi);
      if (jlo > jhi) continue;
      const int j = k0 + lane;
      float ds = 0.0f;
      if (j >= jlo && j <= jhi) {
        const float p = expf(dot(q_s + r * hs, k_s + lane * ldk, hs) * sh.scale - lse_r[rr]);
        ds = p * (dot(do_s + r * hs, v_s + lane * ldk, hs) - d_r[rr]);
      }
      warp_accumulate_rows(dq[rr], ds, k_s, ldk, jlo - k0, jhi - k0 + 1, hs, lane);
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp * kRowsPerWarp + rr;
    if (i >= sh.T) continue;
    store_row(dqkv + (static_cast<int64_t>(b) * sh.T + i) * sh.row + static_cast<int64_t>(h) * hs,
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
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const int64_t k_off = static_cast<int64_t>(sh.NH + kvh) * hs;
  const int64_t v_off = static_cast<int64_t>(sh.NH + sh.KVH + kvh) * hs;
  // Queries [k0, q_end) see some key of the tile (the last key k0 + kTile - 1 is seen up to
  // query k0 + kTile - 1 + window - 1).
  const int q_end = sh.window > 0 ? min(sh.T, k0 + kTile + sh.window - 1) : sh.T;
  const int32_t* doc = row_doc_start(sh, b);

  load_tile(k_s, ldk, rows + k_off, sh.row, k0, sh.T, hs);
  load_tile(v_s, ldk, rows + v_off, sh.row, k0, sh.T, hs);
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
    const T* q_base = rows + static_cast<int64_t>(h) * hs;
    const T* dbase = dout + static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * hs;
    const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;
    for (int q0 = k0; q0 < q_end; q0 += kTile) {
      // Document masking: from the first query tile whose first row's document starts after the
      // tile's last key on, no query sees a key of the tile (uniform over the block).
      if (doc != nullptr && doc[q0] > k0 + kTile - 1) break;
      __syncthreads();  // the previous query tile is consumed
      load_tile(q_s, hs, q_base, sh.row, q0, sh.T, hs);
      load_tile(do_s, hs, dbase, sh.orow, q0, sh.T, hs);
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
        if (i < sh.T && j <= i && (sh.window == 0 || j > i - sh.window) &&
            (doc == nullptr || j >= doc[i])) {
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
        const int j = k0 + jl;
        // Query rows that see key j: i = q0 + r in [j, j + window) and below T (the others,
        // also those of a later document, hold P = dS = 0; skipping them only saves work).
        const int r_begin = max(0, j - q0);
        const int r_end = min(kTile, (sh.window > 0 ? min(sh.T, j + sh.window) : sh.T) - q0);
        for (int r = r_begin; r < r_end; ++r) {
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
  }

#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u) {
    const int t = k0 + warp + kWarps * u;
    if (t >= sh.T) continue;
    T* row = dqkv + (static_cast<int64_t>(b) * sh.T + t) * sh.row;
    store_row(row + k_off, dk[u], sh.scale, hs, lane);
    store_row(row + v_off, dv[u], 1.0f, hs, lane);
  }
}

// ---- KV cache (generation) -------------------------------------------------------------------

// kcache, vcache [b, pos0 + t, :] = the k and v heads of qkv [b, t, :] (KVH*hs channels each).
template <class T>
__global__ void kv_cache_store_kernel(T* kcache, T* vcache, const T* qkv, int pos0, int maxT,
                                      Shape sh, int B) {
  const int64_t kv_row = static_cast<int64_t>(sh.KVH) * sh.hs;
  const int64_t total = static_cast<int64_t>(B) * sh.T * kv_row;
  const int64_t k_off = static_cast<int64_t>(sh.NH) * sh.hs;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t bt = idx / kv_row;
    const int64_t c = idx - bt * kv_row;
    const int64_t b = bt / sh.T;
    const int64_t t = bt - b * sh.T;
    const T* src = qkv + bt * sh.row + k_off + c;
    const int64_t dst = (b * maxT + pos0 + t) * kv_row + c;
    kcache[dst] = src[0];
    vcache[dst] = src[kv_row];
  }
}

// out [b, t, h] = attention of query (b, t, h) at position pos0 + t over the cached keys it sees;
// one warp per (b, h, t), `rows` = B*NH*T of them.
template <class T, int DPL>
__global__ void __launch_bounds__(kThreads)
    kv_cache_attention_kernel(T* out, const T* qkv, const T* kcache, const T* vcache, int pos0,
                              int maxT, Shape sh, int64_t rows) {
  __shared__ float q_all[kWarps][kAttentionMaxHeadSize];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (w >= rows) return;  // uniform over the warp; the kernel only synchronises warps
  const int hs = sh.hs;
  const int t = static_cast<int>(w % sh.T);
  const int64_t bh = w / sh.T;
  const int h = static_cast<int>(bh % sh.NH);
  const int64_t b = bh / sh.NH;
  const int kvh = h / sh.group;
  const int i = pos0 + t;  // the query's position
  float* q = q_all[warp];
  const T* qrow = qkv + (b * sh.T + t) * sh.row + static_cast<int64_t>(h) * hs;
  for (int d = lane; d < hs; d += 32) q[d] = to_f32(qrow[d]);
  __syncwarp();
  const int64_t kv_row = static_cast<int64_t>(sh.KVH) * hs;
  const T* kb = kcache + b * maxT * kv_row + static_cast<int64_t>(kvh) * hs;
  const T* vb = vcache + b * maxT * kv_row + static_cast<int64_t>(kvh) * hs;
  const int jlo = sh.window > 0 ? max(0, i - sh.window + 1) : 0;
  float m = -CUDART_INF_F, l = 0.0f;
  float o[DPL];
#pragma unroll
  for (int e = 0; e < DPL; ++e) o[e] = 0.0f;
  for (int k0 = jlo; k0 <= i; k0 += 32) {
    const int j = k0 + lane;
    const bool vis = j <= i;
    float s = -CUDART_INF_F;
    if (vis) {
      const T* kr = kb + static_cast<int64_t>(j) * kv_row;
      float acc = 0.0f;
      for (int d = 0; d < hs; ++d) acc += q[d] * to_f32(kr[d]);
      s = acc * sh.scale;
    }
    const float m_new = fmaxf(m, warp_max(s));  // key k0 is visible: finite
    const float p = vis ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[e] *= alpha;
    const int count = min(32, i - k0 + 1);
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
      const T* vr = vb + static_cast<int64_t>(k0 + jj) * kv_row;
#pragma unroll
      for (int e = 0; e < DPL; ++e) {
        const int d = lane + 32 * e;
        if (d < hs) o[e] += pj * to_f32(vr[d]);
      }
    }
  }
  store_row(out + (b * sh.T + t) * sh.orow + static_cast<int64_t>(h) * hs, o, 1.0f / l, hs, lane);
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

// `span`: the positions a query may see at most (T, or pos0 + T with a cache); a window at least
// that wide is no window.
Shape make_shape(const AttentionDims& s, int span) {
  if (s.NH <= 0 || s.KVH <= 0 || s.NH % s.KVH != 0 || s.HS < 1 || s.HS > kAttentionMaxHeadSize ||
      s.window < 0) {
    check(cudaErrorInvalidValue, "attention: invalid shape (heads, head size or window)");
  }
  Shape sh{};
  sh.T = s.T;
  sh.NH = s.NH;
  sh.KVH = s.KVH;
  sh.group = s.NH / s.KVH;
  sh.hs = s.HS;
  sh.window = s.window < span ? s.window : 0;
  sh.doc_start = s.doc_start;
  sh.row = s.qkv_row();
  sh.orow = s.out_row();
  sh.scale = 1.0f / sqrtf(static_cast<float>(s.HS));
  return sh;
}

unsigned tiles(int T) {
  return static_cast<unsigned>((T + kTile - 1) / kTile);
}

// The implementation in use: ZEROD_ATTENTION=simt (or wmma) at start forces the SIMT kernels of
// this file (or the WMMA ones); set_attention_impl changes it.
std::atomic<AttentionImpl>& impl_in_use() {
  static std::atomic<AttentionImpl> impl{[] {
    const char* e = std::getenv("ZEROD_ATTENTION");
    if (e != nullptr && std::strcmp(e, "simt") == 0) return AttentionImpl::kSimt;
    if (e != nullptr && std::strcmp(e, "wmma") == 0) return AttentionImpl::kWmma;
    return AttentionImpl::kAuto;
  }()};
  return impl;
}

bool force_simt() {
  return impl_in_use().load(std::memory_order_relaxed) == AttentionImpl::kSimt;
}

bool allow_mma() {
  return impl_in_use().load(std::memory_order_relaxed) == AttentionImpl::kAuto;
}

MmaVariants variants_from_env() {
  const char* e = std::getenv("ZEROD_ATTENTION_MMA");
  if (e == nullptr || *e == '\0') return MmaVariants{};
  return parse_attention_mma_variants(e);
}

std::mutex& variants_mutex() {
  static std::mutex m;
  return m;
}

MmaVariants& variants_in_use() {
  static MmaVariants v = variants_from_env();
  return v;
}

}  // namespace

void set_attention_impl(AttentionImpl impl) {
  impl_in_use().store(impl, std::memory_order_relaxed);
}

AttentionImpl attention_impl() {
  return impl_in_use().load(std::memory_order_relaxed);
}

MmaVariants parse_attention_mma_variants(const std::string& value) {
  int f = -1, q = -1, k = -1;
  char tail = 0;
  if (std::sscanf(value.c_str(), "%d,%d,%d%c", &f, &q, &k, &tail) != 3 || f < 0 ||
      f >= kMmaForwardVariants || q < 0 || q >= kMmaDqVariants || k < 0 || k >= kMmaDkdvVariants) {
    throw InputError("ZEROD_ATTENTION_MMA='" + value +
                     "': expected forward,dq,dkdv variant numbers below " +
                     std::to_string(kMmaForwardVariants) + "," + std::to_string(kMmaDqVariants) +
                     "," + std::to_string(kMmaDkdvVariants) + " (for example 1,3,3)");
  }
  MmaVariants v;
  v.forward = f;
  v.dq = q;
  v.dkdv = k;
  return v;
}

void set_attention_mma_variants(MmaVariants v) {
  if (v.forward < 0 || v.forward >= kMmaForwardVariants || v.dq < 0 || v.dq >= kMmaDqVariants ||
      v.dkdv < 0 || v.dkdv >= kMmaDkdvVariants) {
    throw InputError("set_attention_mma_variants: no such variant " + std::to_string(v.forward) +
                     "," + std::to_string(v.dq) + "," + std::to_string(v.dkdv));
  }
  std::lock_guard<std::mutex> lock(variants_mutex());
  variants_in_use() = v;
}

MmaVariants attention_mma_variants() {
  std::lock_guard<std::mutex> lock(variants_mutex());
  return variants_in_use();
}

void attention_forward(Storage dt, void* out, float* lse, const void* qkv, const AttentionDims& s,
                       cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const Shape sh = make_shape(s, s.T);
  // Document masking runs the SIMT kernels below (the only ones that implement it).
  const bool fast = s.doc_start == nullptr;
  if (fast && allow_mma() && attention_mma_supported(dt, s, out, qkv)) {
    attention_mma_forward(dt, out, lse, qkv, s, stream, attention_mma_variants().forward);
    return;
  }
  if (fast && !force_simt() && attention_tc_supported(dt, s.HS, out, qkv)) {
    attention_tc_forward(dt, out, lse, qkv, s, stream);
    return;
  }
  const int ldk = padded(sh.hs);
  const size_t shared =
      (static_cast<size_t>(kTile) * sh.hs + 2 * static_cast<size_t>(kTile) * ldk) * sizeof(float);
  const dim3 grid(tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    dispatch_head_size(sh.hs, [&](auto dpl) {
      auto kernel = attention_forward_kernel<E, decltype(dpl)::value>;
      allow_dynamic_shared(kernel, shared, "attention_forward: cudaFuncSetAttribute");
      kernel<<<grid, kThreads, shared, stream>>>(static_cast<E*>(out), lse,
                                                 static_cast<const E*>(qkv), sh);
    });
  });
  check(cudaGetLastError(), "attention_forward kernel launch");
}

size_t attention_backward_scratch_bytes(const AttentionDims& s) {
  if (s.B <= 0 || s.T <= 0 || s.NH <= 0) return 0;
  return static_cast<size_t>(s.B) * s.NH * s.T * sizeof(float);
}

void attention_backward(Storage dt, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, const AttentionDims& s, float* scratch,
                        cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const Shape sh = make_shape(s, s.T);
  const bool fast = s.doc_start == nullptr;  // (document masking: SIMT, as the forward)
  if (fast && allow_mma() && attention_mma_supported(dt, s, dqkv, dout, qkv, out)) {
    const MmaVariants v = attention_mma_variants();
    attention_mma_backward(dt, dqkv, dout, qkv, out, lse, s, scratch, stream, v.dq, v.dkdv);
    return;
  }
  if (fast && !force_simt() && attention_tc_supported(dt, s.HS, dqkv, dout, qkv, out)) {
    attention_tc_backward(dt, dqkv, dout, qkv, out, lse, s, scratch, stream);
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
  const dim3 dkdv_grid(tiles(s.T), static_cast<unsigned>(s.KVH), static_cast<unsigned>(s.B));
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
      allow_dynamic_shared(dq_kernel, dq_shared, "attention_backward dQ: cudaFuncSetAttribute");
      dq_kernel<<<dq_grid, kThreads, dq_shared, stream>>>(static_cast<E*>(dqkv), dout_t, qkv_t, lse,
                                                          D, sh);
      check(cudaGetLastError(), "attention_backward dQ kernel launch");
      auto dkdv_kernel = attention_dkdv_kernel<E, kDpl>;
      allow_dynamic_shared(dkdv_kernel, dkdv_shared,
                           "attention_backward dK/dV: cudaFuncSetAttribute");
      dkdv_kernel<<<dkdv_grid, kThreads, dkdv_shared, stream>>>(static_cast<E*>(dqkv), dout_t,
                                                                qkv_t, lse, D, sh);
      check(cudaGetLastError(), "attention_backward dK/dV kernel launch");
    });
  });
}

void attention_kv_cache(Storage dt, void* out, const void* qkv, void* kcache, void* vcache,
                        int pos0, int maxT, const AttentionDims& s, cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  if (pos0 < 0 || maxT < 0 || static_cast<int64_t>(pos0) + s.T > maxT) {
    check(cudaErrorInvalidValue, "attention_kv_cache: positions past the cache");
  }
  if (s.doc_start != nullptr) {
    check(cudaErrorInvalidValue, "attention_kv_cache: document masking is not supported");
  }
  const Shape sh = make_shape(s, pos0 + s.T);
  const int64_t kv_elems = static_cast<int64_t>(s.B) * s.T * s.KVH * s.HS;
  const int64_t rows = static_cast<int64_t>(s.B) * s.NH * s.T;
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    kv_cache_store_kernel<E><<<grid_stride_blocks(kv_elems), kElementwiseThreads, 0, stream>>>(
        static_cast<E*>(kcache), static_cast<E*>(vcache), static_cast<const E*>(qkv), pos0, maxT,
        sh, s.B);
    check(cudaGetLastError(), "attention_kv_cache store kernel launch");
    dispatch_head_size(sh.hs, [&](auto dpl) {
      kv_cache_attention_kernel<E, decltype(dpl)::value>
          <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
              static_cast<E*>(out), static_cast<const E*>(qkv), static_cast<const E*>(kcache),
              static_cast<const E*>(vcache), pos0, maxT, sh, rows);
    });
    check(cudaGetLastError(), "attention_kv_cache attention kernel launch");
  });
}

}  // namespace zerod::cuda
