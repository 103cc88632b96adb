// Tensor-core causal attention (flash-attention style, nvcuda::wmma 16x16x16 bf16/fp16 products
// with fp32 accumulators): the products Q K^T, P V, dO V^T, dS K, P^T dO and dS^T Q run on
// tensor cores; scale, causal / window mask, softmax and dS = P (dP - D) run as SIMT fp32 code on
// fp32 score tiles in shared memory. No code depends on the WMMA fragment element layout:
// fragments only meet memory through load_matrix_sync / store_matrix_sync.
//
// Launch shapes: 128 threads = 4 warps per block; tiles of 64 queries x 64 keys; warp w owns 16
// rows (queries, or keys in the dK/dV kernel) of its block's tile, so warps only meet at the
// __syncthreads around the cooperative tile loads. Q/K/V/dO tiles stay in the storage dtype in
// shared memory (row stride hs + 8 elements); per-warp score tiles are fp32 (stride 68). Query
// head h reads key/value head h / (NH/KVH) in place. A warp only multiplies the 16-wide
// sub-tiles that hold a key (query) one of its rows sees: on the diagonal tile warp w multiplies
// its key sub-tiles 0..w, and with a window the sub-tiles wholly before the window are skipped
// (as are the key tiles before the window of the block's first query).
// - forward: grid (ceil(T/64) query tiles, NH, B), heaviest (last) query tiles first. Online
//   softmax in the exp2 domain: running max m and sum l per row in registers (replicated over
//   the lanes), the output accumulator O in shared memory as fp32 (rescaled by SIMT code, then
//   loaded as accumulator fragments for O += P V).
// - backward dQ: grid as the forward. First D_i = dO_i . O_i of the block's rows (to the scratch
//   for the dK/dV kernel), then per key tile S and dP = dO V^T by WMMA, P = exp(S scale - lse)
//   and dS = P (dP - D) by SIMT, dQ += dS K by WMMA into register accumulators.
// - backward dK/dV: grid (ceil(T/64) key tiles, KVH, B); for each query head of its key/value
//   head in order, per query tile that sees its keys the warp computes S^T = K Q^T and
//   dP^T = V dO^T for its 16 keys, P^T and dS^T by SIMT, then dV += P^T dO and dK += dS^T Q into
//   register accumulators (summing the query heads of a shared head). Launched after the dQ
//   kernel (it reads D). Deterministic, no atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcTile = 64;  // queries per query tile, keys per key tile
constexpr int kTcWarps = kTcTile / 16;
constexpr int kTcThreads = 32 * kTcWarps;
// __launch_bounds__ minimum blocks per SM: no register cap at 128 threads (255 per thread either
// way), but it steers ptxas away from a small spill it otherwise makes in dq_kernel<__half, 32>.
constexpr int kTcMinBlocks = 2;
constexpr int kLdS = kTcTile + 4;  // fp32 row stride of the per-warp (16, 64) score tiles
constexpr int kLdP = kTcTile + 8;  // 16-bit row stride of the per-warp (16, 64) P / dS tiles
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct TcShape {
  int T, NH, KVH, group;
  int window;    // 0 (causal) or 0 < window < T
  int64_t row;   // elements of a qkv row
  int64_t orow;  // elements of an out row
  float scale;
};

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared memory layout (byte offsets, all multiples of 128; per-warp pieces multiples of 32).
template <int HS>
struct Layout {
  static constexpr int kLdX = HS + 8;  // 16-bit row stride of (64, HS) tiles
  static constexpr int kLdO = HS + 4;  // fp32 row stride of the per-warp (16, HS) O tile
  static constexpr size_t kX = size_t{kTcTile} * kLdX * 2;
  static constexpr size_t kS = size_t{kTcWarps} * 16 * kLdS * sizeof(float);  // all warps
  static constexpr size_t kP = size_t{kTcWarps} * 16 * kLdP * 2;
  static constexpr size_t kO = size_t{kTcWarps} * 16 * kLdO * sizeof(float);
  static constexpr size_t kRow = size_t{kTcTile} * sizeof(float);  // one float per tile row
  // forward: Q, K, V tiles, S, P, O
  static constexpr size_t kFwd = 3 * kX + kS + kP + kO;
  // dQ: Q, dO, K, V tiles, S, dP, dS, lse, D
  static constexpr size_t kDq = 4 * kX + 2 * kS + kP + 2 * kRow;
  // dK/dV: K, V, Q, dO tiles, S^T, dP^T, P^T, dS^T, lse, D
  static constexpr size_t kDkdv = 4 * kX + 2 * kS + 2 * kP + 2 * kRow;
};

// dst (64, ld) = rows [t0, t0 + 64) of a (T, HS) view with row stride `stride` (elements), rows
// at or after T zero; 16-byte vectors (src rows and dst rows 16-byte aligned). Whole block.
template <class T, int HS>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, int64_t stride, int t0,
                                          int T_) {
  constexpr int kVecs = HS / 8;  // 8 16-bit elements per uint4
  for (int idx = threadIdx.x; idx < kTcTile * kVecs; idx += blockDim.x) {
    const int r = idx / kVecs;
    const int c = (idx - r * kVecs) * 8;
    const int t = t0 + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t < T_) v = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(t) * stride + c);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
  }
}

// out (16, 16n) for n in [n_begin, n_end): A (16, HS) times B^T, B (16n rows, HS), both row-major
// 16-bit in shared memory with row stride ld; out fp32 row-major with stride kLdS. One warp.
template <class T, int HS>
__device__ __forceinline__ void warp_abt(float* out, const T* a, const T* b, int ld, int n_begin,
                                         int n_end) {
  for (int n = n_begin; n < n_end; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA<T> fa;
      FragBCol<T> fb;
      wmma::load_matrix_sync(fa, a + 16 * kk, ld);
      wmma::load_matrix_sync(fb, b + 16 * n * ld + 16 * kk, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, kLdS, wmma::mem_row_major);
  }
}

// acc (16, 16) += A (16, 16t) x B (16t rows, 16) over t in [t_begin, t_end): A row-major with row
// stride lda (its 16-column blocks side by side), B row-major with row stride ldb (its 16-row
// blocks stacked), both 16-bit in shared memory. One warp.
template <class T>
__device__ __forceinline__ void warp_ab_acc(FragC& acc, const T* a, int lda, const T* b, int ldb,
                                            int t_begin, int t_end) {
  for (int t = t_begin; t < t_end; ++t) {
    FragA<T> fa;
    FragBRow<T> fb;
    wmma::load_matrix_sync(fa, a + 16 * t, lda);
    wmma::load_matrix_sync(fb, b + 16 * t * ldb, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// Rows [first_row, first_row + 16) of dst (row stride `stride`, 16 columns), those below T, =
// scale * tile (16, 16), an fp32 tile in shared memory with row stride kLdS. One warp.
template <class T>
__device__ __forceinline__ void warp_store_tile(T* dst, int64_t stride, const float* tile,
                                                int first_row, int T_, float scale, int lane) {
  for (int idx = lane; idx < 256; idx += 32) {
    const int r = idx >> 4;
    const int c = idx & 15;
    const int row = first_row + r;
    if (row < T_)
      dst[static_cast<int64_t>(row) * stride + c] = from_f32<T>(tile[r * kLdS + c] * scale);
  }
}

// ---- masks -----------------------------------------------------------------------------------

// True when query i sees key j.
__device__ __forceinline__ bool sees(int i, int j, int window) {
  return j <= i && (window == 0 || j > i - window);
}

// The first key tile query tile q0 needs (the one holding the first key in q0's window).
__host__ __device__ inline int tc_first_key_tile(int q0, int window) {
  if (window <= 0) return 0;
  const int lo = q0 - window + 1;
  return lo > 0 ? lo / kTcTile * kTcTile : 0;
}

// Key sub-tiles [*n_begin, *n_end) of the key tile at k0 holding every key that queries
// [r0, r0 + 16) see (k0 <= r0); empty when *n_begin >= *n_end.
__device__ __forceinline__ void key_subtiles(int r0, int k0, int window, int* n_begin, int* n_end) {
  *n_end = min(kTcWarps, (r0 + 15 - k0) / 16 + 1);
  const int lo = window > 0 ? r0 - window + 1 - k0 : 0;  // the first row's first key
  *n_begin = lo > 0 ? lo / 16 : 0;
}

// Query sub-tiles [*m_begin, *m_end) of the query tile at q0 holding every query below T that
// sees one of keys [j0, j0 + 16); empty when *m_begin >= *m_end.
__device__ __forceinline__ void query_subtiles(int j0, int q0, int T_, int window, int* m_begin,
                                               int* m_end) {
  *m_begin = j0 > q0 ? (j0 - q0) / 16 : 0;  // (j0 - q0 is a multiple of 16)
  int end = min(kTcWarps, (T_ - q0 + 15) / 16);
  if (window > 0) {
    const int last = j0 + 15 + window - 1 - q0;  // the last query seeing key j0 + 15
    end = last < 0 ? 0 : min(end, last / 16 + 1);
  }
  *m_end = end;
}

// ---- forward ---------------------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kTcThreads, kTcMinBlocks)
    attention_tc_forward_kernel(T* out, float* lse, const T* qkv, TcShape sh) {
  using L = Layout<HS>;
  constexpr int ldx = L::kLdX;
  constexpr int ldo = L::kLdO;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = reinterpret_cast<T*>(smem + L::kX);
  T* v_s = reinterpret_cast<T*>(smem + 2 * L::kX);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  float* s_w = reinterpret_cast<float*>(smem + 3 * L::kX) + warp * 16 * kLdS;
  T* p_w = reinterpret_cast<T*>(smem + 3 * L::kX + L::kS) + warp * 16 * kLdP;
  float* o_w = reinterpret_cast<float*>(smem + 3 * L::kX + L::kS + L::kP) + warp * 16 * ldo;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int r0 = q0 + 16 * warp;  // the warp's first query
  const bool active = r0 < sh.T;  // uniform over the warp
  const float sl2 = sh.scale * kLog2e;

  load_rows<T, HS>(q_s, ldx, q_base, sh.row, q0, sh.T);
  for (int idx = lane; idx < 16 * HS; idx += 32) o_w[(idx / HS) * ldo + idx % HS] = 0.0f;
  float m[16];  // running max of the row's scores (log2 domain), the same in every lane
  float l[16];  // running sum of exp2(score - m)
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    m[r] = -CUDART_INF_F;
    l[r] = 0.0f;
  }

  for (int k0 = tc_first_key_tile(q0, sh.window); k0 <= q0; k0 += kTcTile) {
    __syncthreads();  // the previous K/V tiles are consumed (and O is zeroed, the first time)
    load_rows<T, HS>(k_s, ldx, k_base, sh.row, k0, sh.T);
    load_rows<T, HS>(v_s, ldx, v_base, sh.row, k0, sh.T);
    __syncthreads();
    if (!active) continue;
    // Key sub-tiles holding the keys the warp's rows see.
    int n_begin, n_end;
    key_subtiles(r0, k0, sh.window, &n_begin, &n_end);
    if (n_begin >= n_end) continue;  // the whole tile is before the warp's windows
    warp_abt<T, HS>(s_w, q_s + 16 * warp * ldx, k_s, ldx, n_begin, n_end);
    __syncwarp();
    // Online softmax, a row at a time over the whole warp (keys lane and lane + 32). Masked keys
    // get p = 0 (their scores, possibly never computed, are unread). A row may see no key of
    // this tile (before its window): then m stays -inf and alpha is 1 (O and l are still 0).
    // Every row sees its own key in the diagonal tile, so l > 0 at the end.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int i = r0 + r;
      const bool v0 = sees(i, k0 + lane, sh.window);
      const bool v1 = sees(i, k0 + lane + 32, sh.window);
      const float s0 = v0 ? s_w[r * kLdS + lane] * sl2 : -CUDART_INF_F;
      const float s1 = v1 ? s_w[r * kLdS + lane + 32] * sl2 : -CUDART_INF_F;
      const float m_new = fmaxf(m[r], warp_max(fmaxf(s0, s1)));
      const float p0 = v0 ? exp2f(s0 - m_new) : 0.0f;
      const float p1 = v1 ? exp2f(s1 - m_new) : 0.0f;
      // 0 when m was -inf and m_new is finite; 1 (not NaN) while both are -inf.
      const float alpha = m_new == -CUDART_INF_F ? 1.0f : exp2f(m[r] - m_new);
      l[r] = l[r] * alpha + warp_sum(p0 + p1);
      m[r] = m_new;
      p_w[r * kLdP + lane] = from_f32<T>(p0);
      p_w[r * kLdP + lane + 32] = from_f32<T>(p1);
#pragma unroll
      for (int d = lane; d < HS; d += 32) o_w[r * ldo + d] *= alpha;
    }
    __syncwarp();
    // O += P V over the visible key sub-tiles.
#pragma unroll
    for (int dt = 0; dt < HS / 16; ++dt) {
      FragC acc;
      wmma::load_matrix_sync(acc, o_w + 16 * dt, ldo, wmma::mem_row_major);
      warp_ab_acc(acc, p_w, kLdP, v_s + 16 * dt, ldx, n_begin, n_end);
      wmma::store_matrix_sync(o_w + 16 * dt, acc, ldo, wmma::mem_row_major);
    }
  }

  if (!active) return;
  __syncwarp();  // O stored by the fragments of all lanes
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int i = r0 + r;
    if (i >= sh.T) break;  // uniform over the warp
    const float inv = 1.0f / l[r];
    T* orow = out + (static_cast<int64_t>(b) * sh.T + i) * sh.orow + static_cast<int64_t>(h) * HS;
#pragma unroll
    for (int d = lane; d < HS; d += 32) orow[d] = from_f32<T>(o_w[r * ldo + d] * inv);
    if (lane == 0) {
      lse[(static_cast<int64_t>(b) * sh.NH + h) * sh.T + i] = m[r] * kLn2 + logf(l[r]);
    }
  }
}

// ---- backward dQ (and D) ---------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kTcThreads, kTcMinBlocks)
    attention_tc_dq_kernel(T* dqkv, float* D, const T* dout, const T* qkv, const T* out,
                           const float* lse, TcShape sh) {
  using L = Layout<HS>;
  constexpr int ldx = L::kLdX;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = reinterpret_cast<T*>(smem + L::kX);
  T* k_s = reinterpret_cast<T*>(smem + 2 * L::kX);
  T* v_s = reinterpret_cast<T*>(smem + 3 * L::kX);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  unsigned char* rest = smem + 4 * L::kX;
  float* s_w = reinterpret_cast<float*>(rest) + warp * 16 * kLdS;
  float* dp_w = reinterpret_cast<float*>(rest + L::kS) + warp * 16 * kLdS;
  T* ds_w = reinterpret_cast<T*>(rest + 2 * L::kS) + warp * 16 * kLdP;
  float* lse_s = reinterpret_cast<float*>(rest + 2 * L::kS + L::kP);  // (64), log2 domain
  float* d_s = lse_s + kTcTile;                                       // (64)

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int64_t obase = static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * HS;
  const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;  // of lse and D
  const int r0 = q0 + 16 * warp;
  const bool active = r0 < sh.T;
  const float sl2 = sh.scale * kLog2e;

  load_rows<T, HS>(q_s, ldx, q_base, sh.row, q0, sh.T);
  load_rows<T, HS>(do_s, ldx, dout + obase, sh.orow, q0, sh.T);
  __syncthreads();
  if (active) {
    // D_i = dO_i . O_i of the warp's rows, kept for the dK/dV kernel.
    for (int r = 0; r < 16; ++r) {
      const int i = r0 + r;
      float acc = 0.0f;
      if (i < sh.T) {
        const T* orow = out + obase + static_cast<int64_t>(i) * sh.orow;
        for (int d = lane; d < HS; d += 32) {
          acc += to_f32(do_s[(16 * warp + r) * ldx + d]) * to_f32(orow[d]);
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) {
        d_s[16 * warp + r] = i < sh.T ? acc : 0.0f;
        lse_s[16 * warp + r] = i < sh.T ? lse[row0 + i] * kLog2e : 0.0f;
        if (i < sh.T) D[row0 + i] = acc;
      }
    }
  }

  FragC dq[HS / 16];
#pragma unroll
  for (int dt = 0; dt < HS / 16; ++dt) wmma::fill_fragment(dq[dt], 0.0f);

  // (The diagonal tile is always walked, so the __syncthreads below also orders lse_s and d_s.)
  for (int k0 = tc_first_key_tile(q0, sh.window); k0 <= q0; k0 += kTcTile) {
    __syncthreads();  // the previous K/V tiles are consumed (and lse_s, d_s are written)
    load_rows<T, HS>(k_s, ldx, k_base, sh.row, k0, sh.T);
    load_rows<T, HS>(v_s, ldx, v_base, sh.row, k0, sh.T);
    __syncthreads();
    if (!active) continue;
    int n_begin, n_end;
    key_subtiles(r0, k0, sh.window, &n_begin, &n_end);
    if (n_begin >= n_end) continue;
    warp_abt<T, HS>(s_w, q_s + 16 * warp * ldx, k_s, ldx, n_begin, n_end);
    warp_abt<T, HS>(dp_w, do_s + 16 * warp * ldx, v_s, ldx, n_begin, n_end);
    __syncwarp();
#pragma unroll 4
    for (int r = 0; r < 16; ++r) {
      const int i = r0 + r;
      const float lse2 = lse_s[16 * warp + r];
      const float d_i = d_s[16 * warp + r];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + 32 * half;
        const bool vis = i < sh.T && sees(i, k0 + c, sh.window);
        float ds = 0.0f;
        if (vis) {
          const float p = exp2f(s_w[r * kLdS + c] * sl2 - lse2);
          ds = p * (dp_w[r * kLdS + c] - d_i);
        }
        ds_w[r * kLdP + c] = from_f32<T>(ds);
      }
    }
    __syncwarp();
#pragma unroll
    for (int dt = 0; dt < HS / 16; ++dt)
      warp_ab_acc(dq[dt], ds_w, kLdP, k_s + 16 * dt, ldx, n_begin, n_end);
  }

  if (!active) return;
    // dQ * scale through the warp's score tile, 16 channels at a time.
#pragma unroll
  for (int dt = 0; dt < HS / 16; ++dt) {
    __syncwarp();  // the previous 16 channels are written out
    wmma::store_matrix_sync(s_w, dq[dt], kLdS, wmma::mem_row_major);
    __syncwarp();
    warp_store_tile(
        dqkv + static_cast<int64_t>(b) * sh.T * sh.row + static_cast<int64_t>(h) * HS + 16 * dt,
        sh.row, s_w, r0, sh.T, sh.scale, lane);
  }
}

// ---- backward dK/dV --------------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kTcThreads, kTcMinBlocks)
    attention_tc_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                             TcShape sh) {
  using L = Layout<HS>;
  constexpr int ldx = L::kLdX;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + L::kX);
  T* q_s = reinterpret_cast<T*>(smem + 2 * L::kX);
  T* do_s = reinterpret_cast<T*>(smem + 3 * L::kX);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  unsigned char* rest = smem + 4 * L::kX;
  float* st_w = reinterpret_cast<float*>(rest) + warp * 16 * kLdS;           // S^T (keys, queries)
  float* dpt_w = reinterpret_cast<float*>(rest + L::kS) + warp * 16 * kLdS;  // dP^T
  T* pt_w = reinterpret_cast<T*>(rest + 2 * L::kS) + warp * 16 * kLdP;       // P^T
  T* dst_w = reinterpret_cast<T*>(rest + 2 * L::kS + L::kP) + warp * 16 * kLdP;  // dS^T
  float* lse_s = reinterpret_cast<float*>(rest + 2 * L::kS + 2 * L::kP);  // (64), log2 domain
  float* d_s = lse_s + kTcTile;                                           // (64)

  const int k0 = blockIdx.x * kTcTile;  // the first key tiles see the most queries: first
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const int64_t k_off = static_cast<int64_t>(sh.NH + kvh) * HS;
  const int64_t v_off = static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int j0 = k0 + 16 * warp;  // the warp's first key
  const bool active = j0 < sh.T;
  const float sl2 = sh.scale * kLog2e;
  // Queries [k0, q_end) see some key of the tile.
  const int q_end = sh.window > 0 ? min(sh.T, k0 + kTcTile + sh.window - 1) : sh.T;

  load_rows<T, HS>(k_s, ldx, rows + k_off, sh.row, k0, sh.T);
  load_rows<T, HS>(v_s, ldx, rows + v_off, sh.row, k0, sh.T);
  FragC dk[HS / 16];
  FragC dv[HS / 16];
#pragma unroll
  for (int dt = 0; dt < HS / 16; ++dt) {
    wmma::fill_fragment(dk[dt], 0.0f);
    wmma::fill_fragment(dv[dt], 0.0f);
  }

  // The query heads sharing this key/value head, in order (a deterministic sum).
  for (int g = 0; g < sh.group; ++g) {
    const int h = kvh * sh.group + g;
    const T* q_base = rows + static_cast<int64_t>(h) * HS;
    const T* dbase = dout + static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * HS;
    const int64_t row0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;
    for (int q0 = k0; q0 < q_end; q0 += kTcTile) {
      __syncthreads();  // the previous query tile is consumed
      load_rows<T, HS>(q_s, ldx, q_base, sh.row, q0, sh.T);
      load_rows<T, HS>(do_s, ldx, dbase, sh.orow, q0, sh.T);
      if (threadIdx.x < kTcTile) {
        const int i = q0 + threadIdx.x;
        lse_s[threadIdx.x] = i < sh.T ? lse[row0 + i] * kLog2e : 0.0f;
        d_s[threadIdx.x] = i < sh.T ? D[row0 + i] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      // Query sub-tiles [m_begin, m_end) hold the queries that see the warp's keys: on the
      // diagonal tile the earlier sub-tiles precede every key of the warp, past the window's end
      // the later ones follow it, and sub-tiles starting at or after T are padding.
      int m_begin, m_end;
      query_subtiles(j0, q0, sh.T, sh.window, &m_begin, &m_end);
      if (m_begin >= m_end) continue;
      warp_abt<T, HS>(st_w, k_s + 16 * warp * ldx, q_s, ldx, m_begin, m_end);
      warp_abt<T, HS>(dpt_w, v_s + 16 * warp * ldx, do_s, ldx, m_begin, m_end);
      __syncwarp();
#pragma unroll 4
      for (int r = 0; r < 16; ++r) {
        const int j = j0 + r;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int c = lane + 32 * half;
          const int i = q0 + c;
          const bool vis = i < sh.T && sees(i, j, sh.window);
          float p = 0.0f, ds = 0.0f;
          if (vis) {
            p = exp2f(st_w[r * kLdS + c] * sl2 - lse_s[c]);
            ds = p * (dpt_w[r * kLdS + c] - d_s[c]);
          }
          pt_w[r * kLdP + c] = from_f32<T>(p);
          dst_w[r * kLdP + c] = from_f32<T>(ds);
        }
      }
      __syncwarp();
#pragma unroll
      for (int dt = 0; dt < HS / 16; ++dt) {
        warp_ab_acc(dv[dt], pt_w, kLdP, do_s + 16 * dt, ldx, m_begin, m_end);
        warp_ab_acc(dk[dt], dst_w, kLdP, q_s + 16 * dt, ldx, m_begin, m_end);
      }
    }
  }

  if (!active) return;
    // dK * scale and dV through the warp's score tiles, 16 channels at a time.
#pragma unroll
  for (int dt = 0; dt < HS / 16; ++dt) {
    __syncwarp();
    wmma::store_matrix_sync(st_w, dk[dt], kLdS, wmma::mem_row_major);
    wmma::store_matrix_sync(dpt_w, dv[dt], kLdS, wmma::mem_row_major);
    __syncwarp();
    T* base = dqkv + static_cast<int64_t>(b) * sh.T * sh.row + 16 * dt;
    warp_store_tile(base + k_off, sh.row, st_w, j0, sh.T, sh.scale, lane);
    warp_store_tile(base + v_off, sh.row, dpt_w, j0, sh.T, 1.0f, lane);
  }
}

// ---- launch helpers ------------------------------------------------------------------------

// Calls fn(std::integral_constant<int, HS>{}) for the supported head sizes.
template <class Fn>
void dispatch_tc_head_size(int hs, Fn&& fn) {
  switch (hs) {
    case 32:
      fn(std::integral_constant<int, 32>{});
      return;
    case 64:
      fn(std::integral_constant<int, 64>{});
      return;
    case 128:
      fn(std::integral_constant<int, 128>{});
      return;
    default:
      check(cudaErrorInvalidValue, "attention (tensor cores): unsupported head size");
  }
}

TcShape make_tc_shape(const AttentionDims& s) {
  if (s.NH <= 0 || s.KVH <= 0 || s.NH % s.KVH != 0 || s.window < 0) {
    check(cudaErrorInvalidValue, "attention (tensor cores): invalid heads or window");
  }
  TcShape sh{};
  sh.T = s.T;
  sh.NH = s.NH;
  sh.KVH = s.KVH;
  sh.group = s.NH / s.KVH;
  sh.window = s.window < s.T ? s.window : 0;  // a window of T or more is no window
  sh.row = s.qkv_row();
  sh.orow = s.out_row();
  sh.scale = 1.0f / sqrtf(static_cast<float>(s.HS));
  return sh;
}

unsigned tc_tiles(int T) {
  return static_cast<unsigned>((T + kTcTile - 1) / kTcTile);
}

}  // namespace

bool attention_tc_supported(Storage dt, int head_size, const void* a, const void* b, const void* c,
                            const void* d) {
  if (dt != Storage::kBF16 && dt != Storage::kF16) return false;
  if (head_size != 32 && head_size != 64 && head_size != 128) return false;
  return aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);  // (null: aligned)
}

void attention_tc_forward(Storage dt, void* out, float* lse, const void* qkv,
                          const AttentionDims& s, cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const TcShape sh = make_tc_shape(s);
  const dim3 grid(tc_tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  dispatch_16bit(dt, "attention (tensor cores): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    dispatch_tc_head_size(s.HS, [&](auto hs_tag) {
      constexpr int HS = decltype(hs_tag)::value;
      const size_t shared = Layout<HS>::kFwd;
      auto kernel = attention_tc_forward_kernel<E, HS>;
      allow_dynamic_shared(kernel, shared,
                           "attention_forward (tensor cores): cudaFuncSetAttribute");
      kernel<<<grid, kTcThreads, shared, stream>>>(static_cast<E*>(out), lse,
                                                   static_cast<const E*>(qkv), sh);
    });
  });
  check(cudaGetLastError(), "attention_forward (tensor cores) kernel launch");
}

void attention_tc_backward(Storage dt, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, const AttentionDims& s,
                           float* scratch, cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const TcShape sh = make_tc_shape(s);
  const dim3 dq_grid(tc_tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  const dim3 dkdv_grid(tc_tiles(s.T), static_cast<unsigned>(s.KVH), static_cast<unsigned>(s.B));
  float* D = scratch;
  dispatch_16bit(dt, "attention (tensor cores): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    dispatch_tc_head_size(s.HS, [&](auto hs_tag) {
      constexpr int HS = decltype(hs_tag)::value;
      const size_t dq_shared = Layout<HS>::kDq;
      auto dq_kernel = attention_tc_dq_kernel<E, HS>;
      allow_dynamic_shared(dq_kernel, dq_shared,
                           "attention_backward dQ (tensor cores): cudaFuncSetAttribute");
      dq_kernel<<<dq_grid, kTcThreads, dq_shared, stream>>>(
          static_cast<E*>(dqkv), D, static_cast<const E*>(dout), static_cast<const E*>(qkv),
          static_cast<const E*>(out), lse, sh);
      check(cudaGetLastError(), "attention_backward dQ (tensor cores) kernel launch");
      const size_t dkdv_shared = Layout<HS>::kDkdv;
      auto dkdv_kernel = attention_tc_dkdv_kernel<E, HS>;
      allow_dynamic_shared(dkdv_kernel, dkdv_shared,
                           "attention_backward dK/dV (tensor cores): cudaFuncSetAttribute");
      dkdv_kernel<<<dkdv_grid, kTcThreads, dkdv_shared, stream>>>(
          static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, D,
          sh);
      check(cudaGetLastError(), "attention_backward dK/dV (tensor cores) kernel launch");
    });
  });
}

}  // namespace zerod::cuda
