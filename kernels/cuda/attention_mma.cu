// FlashAttention-2 style causal attention on mma.sync.m16n8k16 (bf16 / fp16 operands, fp32
// accumulators): see attention_mma.h for what it computes and when it runs.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .row.col; g = lane / 4, t = lane % 4):
//   A (16 x 16, 4 regs of two 16-bit values): a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..),
//     a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..);
//   B (16 x 8, 2 regs): b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g);
//   C (16 x 8, 4 floats): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, the same cols).
// Two C tiles side by side (16 x 16) are, rounded to 16 bits, exactly an A fragment: that is how
// P (and dS) feed the next product without leaving registers. ldmatrix.x4 loads four 8 x 8
// matrices whose rows lanes 8m..8m+7 address; lane i receives (row i/4, cols 2(i%4), +1) of
// each, or with .trans (rows 2(i%4), +1; col i/4).
//
// Tiles: a block of 4 warps owns 64 rows (queries, or keys in the dK/dV kernel), 16 per warp, and
// walks the other side in tiles of 64 through shared memory (row stride HS + 8 elements: 16-byte
// aligned rows, and the eight rows of an ldmatrix matrix fall in distinct banks), loaded with
// cp.async into two stages: the next tile is in flight while the block works on this one.
// - forward: grid (ceil(T/64) query tiles, NH, B), heaviest first; per key tile S = Q K^T,
//   online softmax in the exp2 domain on the fragments (row max and sum over the 4 lanes of a
//   quad), O += P V. lse = m ln 2 + ln l.
// - dQ: grid as the forward; D_i = dO_i . O_i first (to the scratch); per key tile S and
//   dP = dO V^T, P = exp2(S scale log2e - lse log2e), dS = P (dP - D), dQ += dS K.
// - dK/dV: grid (ceil(T/64) key tiles, KVH, B), heaviest first; for each query head of the
//   key/value head and each query tile at or after the key tile: S^T = K Q^T, dP^T = V dO^T,
//   P^T, dS^T, dV += P^T dO, dK += dS^T Q. Launched after dQ (reads D).
// On a diagonal tile a warp skips the 16-wide sub-tiles wholly past its rows' causal limit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kTile = 64;  // rows per block, and columns per inner tile
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct MmaShape {
  int T, NH, KVH, group;
  int64_t row;   // elements of a qkv row
  int64_t orow;  // elements of an out row
  float scale;
};

template <int HS>
struct Smem {
  static constexpr int kLd = HS + 8;  // 16-bit row stride of a (64, HS) tile
  static constexpr size_t kTileBytes = size_t{kTile} * kLd * 2;
};

// ---- warp-level primitives -------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

// c (16 x 8) += a (16 x 16) b (16 x 8).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to the storage type, lo in the low half (the lower column / k index).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// The A fragment of the 16-column block kk of two C tiles (2kk, 2kk+1) of a (16, 64) score tile.
template <class T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// Lane addresses into a (rows, ld) 16-bit tile in shared memory, for the fragments of a 16 x 16
// block at (r0, c0):
// - A operand (rows are the product's rows, columns its k): matrices (rows 0-7, k 0-7),
//   (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3.
template <class T>
__device__ __forceinline__ const T* a_addr(const T* tile, int ld, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8;
}
// - B operand stored n-major (tile rows are the product's columns n, tile columns its k):
//   matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of the
//   n-tile at r0, then b0, b1 of the n-tile at r0 + 8.
template <class T>
__device__ __forceinline__ const T* bn_addr(const T* tile, int ld, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 7) + ((lane >> 4) << 3)) * ld + c0 + ((lane >> 3) & 1) * 8;
}
// - B operand stored k-major (tile rows are the product's k, columns its n), loaded with .trans:
//   matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of the
//   n-tile at c0, then b0, b1 of the n-tile at c0 + 8.
template <class T>
__device__ __forceinline__ const T* bk_addr(const T* tile, int ld, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}

// dst (64, HS + 8) = rows [t0, t0 + 64) of a (T, HS) view with row stride `stride` (elements),
// asynchronously (cp.async, 16 bytes a copy; rows at or after T zero-filled). Whole block. The
// copies land by the next cp_async_wait<N> that covers their group, then a __syncthreads makes
// every thread's copies visible.
template <class T, int HS>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int64_t stride, int t0,
                                                int T_) {
  constexpr int kVecs = HS / 8;
  constexpr int kLd = Smem<HS>::kLd;
#pragma unroll
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += kThreads) {
    const int r = idx / kVecs;
    const int c = (idx - r * kVecs) * 8;
    const int t = t0 + r;
    const T* from = t < T_ ? src + static_cast<int64_t>(t) * stride + c : src;  // (not read)
    const int bytes = t < T_ ? 16 : 0;
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst + r * kLd + c)),
        "l"(from), "r"(bytes)
        : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- forward ---------------------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(T* out, float* lse, const T* qkv, MmaShape sh) {
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;  // k-steps over the head
  constexpr int kN = HS / 8;   // n-tiles of O
  extern __shared__ __align__(128) unsigned char smem[];
  // Q, then two stages of (K, V): the next key tile loads while this one is used.
  T* q_s = reinterpret_cast<T*>(smem);
  T* kv_s = reinterpret_cast<T*>(smem + Smem<HS>::kTileBytes);
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int wrow = q0 + 16 * warp;  // the warp's first query
  const int row_a = wrow + g;       // this lane's two rows
  const int row_b = row_a + 8;
  const float sl2 = sh.scale * kLog2e;
  const int kend = min(q0 + kTile, sh.T);

  load_tile_async<T, HS>(q_s, q_base, sh.row, q0, sh.T);
  load_tile_async<T, HS>(kv_s, k_base, sh.row, 0, sh.T);
  load_tile_async<T, HS>(kv_s + kTileElems, v_base, sh.row, 0, sh.T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kK][4];
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) ldsm_x4(qf[kk], a_addr(q_s, kLd, 16 * warp, 16 * kk, lane));

  float o[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F;  // running max (log2 domain)
  float l_a = 0.0f, l_b = 0.0f;                    // this lane's share of the running sums

  for (int k0 = 0, stage = 0; k0 < kend; k0 += kTile, stage ^= 1) {
    const T* k_s = kv_s + 2 * stage * kTileElems;
    const T* v_s = k_s + kTileElems;
    if (k0 + kTile < kend) {  // the next tile into the other stage (consumed: see the end)
      T* next = kv_s + 2 * (stage ^ 1) * kTileElems;
      load_tile_async<T, HS>(next, k_base, sh.row, k0 + kTile, sh.T);
      load_tile_async<T, HS>(next + kTileElems, v_base, sh.row, k0 + kTile, sh.T);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this stage's tiles have landed (all but the newest group)
    __syncthreads();
    const bool diag = k0 + kTile - 1 > wrow;  // some key of the tile is past a row of the warp
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (k0 + 16 * np > wrow + 15) continue;  // wholly masked for the warp's rows
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t kf[4];
        ldsm_x4(kf, bn_addr(k_s, kLd, 16 * np, 16 * kk, lane));
        mma<T>(s[2 * np], qf[kk], kf[0], kf[1]);
        mma<T>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
      }
    }
    // Scale to the log2 domain and mask (key j visible to row i iff j <= i).
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = k0 + 8 * j + 2 * t4;
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= sl2;
      if (diag) {
        if (key > row_a) s[j][0] = -CUDART_INF_F;
        if (key + 1 > row_a) s[j][1] = -CUDART_INF_F;
        if (key > row_b) s[j][2] = -CUDART_INF_F;
        if (key + 1 > row_b) s[j][3] = -CUDART_INF_F;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
    }
    // Every row sees key 0 in the first tile, so the maxima are finite from there on.
    mx_a = quad_max(mx_a);
    mx_b = quad_max(mx_b);
    const float alpha_a = exp2f(m_a - mx_a);  // 0 the first time (m = -inf)
    const float alpha_b = exp2f(m_b - mx_b);
    m_a = mx_a;
    m_b = mx_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(s[j][0] - m_a);
      s[j][1] = exp2f(s[j][1] - m_a);
      s[j][2] = exp2f(s[j][2] - m_b);
      s[j][3] = exp2f(s[j][3] - m_b);
      sum_a += s[j][0] + s[j][1];
      sum_b += s[j][2] + s[j][3];
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      o[n][0] *= alpha_a;
      o[n][1] *= alpha_a;
      o[n][2] *= alpha_b;
      o[n][3] *= alpha_b;
    }
    // O += P V over the key blocks of 16 the warp's rows see.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (k0 + 16 * kk > wrow + 15) continue;
      uint32_t pa[4];
      c_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < kN / 2; ++dp) {
        uint32_t vf[4];
        ldsm_x4_trans(vf, bk_addr(v_s, kLd, 16 * kk, 16 * dp, lane));
        mma<T>(o[2 * dp], pa, vf[0], vf[1]);
        mma<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

  l_a = quad_sum(l_a);
  l_b = quad_sum(l_b);
  const float inv_a = 1.0f / l_a;
  const float inv_b = 1.0f / l_b;
  T* out_a =
      out + (static_cast<int64_t>(b) * sh.T + row_a) * sh.orow + static_cast<int64_t>(h) * HS;
  T* out_b = out_a + 8 * sh.orow;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int d = 8 * n + 2 * t4;
    if (row_a < sh.T)
      *reinterpret_cast<uint32_t*>(out_a + d) = pack2<T>(o[n][0] * inv_a, o[n][1] * inv_a);
    if (row_b < sh.T)
      *reinterpret_cast<uint32_t*>(out_b + d) = pack2<T>(o[n][2] * inv_b, o[n][3] * inv_b);
  }
  if (t4 == 0) {
    float* lse_row = lse + (static_cast<int64_t>(b) * sh.NH + h) * sh.T;
    if (row_a < sh.T) lse_row[row_a] = m_a * kLn2 + logf(l_a);
    if (row_b < sh.T) lse_row[row_b] = m_b * kLn2 + logf(l_b);
  }
}

// ---- backward dQ (and D) ---------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(T* dqkv, float* D, const T* dout, const T* qkv, const T* out, const float* lse,
                  MmaShape sh) {
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;
  constexpr int kN = HS / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q, dO, then two stages of (K, V).
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = reinterpret_cast<T*>(smem + Smem<HS>::kTileBytes);
  T* kv_s = reinterpret_cast<T*>(smem + 2 * Smem<HS>::kTileBytes);
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int64_t obase = static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * HS;
  const int64_t stat0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;  // of lse and D
  const int wrow = q0 + 16 * warp;
  const int row_a = wrow + g;
  const int row_b = row_a + 8;
  const float sl2 = sh.scale * kLog2e;

  const int kend = min(q0 + kTile, sh.T);
  load_tile_async<T, HS>(q_s, q_base, sh.row, q0, sh.T);
  load_tile_async<T, HS>(do_s, dout + obase, sh.orow, q0, sh.T);
  load_tile_async<T, HS>(kv_s, k_base, sh.row, 0, sh.T);
  load_tile_async<T, HS>(kv_s + kTileElems, v_base, sh.row, 0, sh.T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // D of rows a and b: the quad's 4 lanes split the head, HS / 4 channels each.
  float d_a = 0.0f, d_b = 0.0f;
  {
    const int c0 = t4 * (HS / 4);
    const T* do_a = do_s + (16 * warp + g) * kLd;
    const T* do_b = do_a + 8 * kLd;
    if (row_a < sh.T) {
      const T* o_a = out + obase + static_cast<int64_t>(row_a) * sh.orow;
#pragma unroll
      for (int c = c0; c < c0 + HS / 4; ++c) d_a += to_f32(do_a[c]) * to_f32(o_a[c]);
    }
    if (row_b < sh.T) {
      const T* o_b = out + obase + static_cast<int64_t>(row_b) * sh.orow;
#pragma unroll
      for (int c = c0; c < c0 + HS / 4; ++c) d_b += to_f32(do_b[c]) * to_f32(o_b[c]);
    }
  }
  d_a = quad_sum(d_a);
  d_b = quad_sum(d_b);
  if (t4 == 0) {
    if (row_a < sh.T) D[stat0 + row_a] = d_a;
    if (row_b < sh.T) D[stat0 + row_b] = d_b;
  }
  const float lse_a = row_a < sh.T ? lse[stat0 + row_a] * kLog2e : 0.0f;
  const float lse_b = row_b < sh.T ? lse[stat0 + row_b] * kLog2e : 0.0f;

  uint32_t qf[kK][4], df[kK][4];
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    ldsm_x4(qf[kk], a_addr(q_s, kLd, 16 * warp, 16 * kk, lane));
    ldsm_x4(df[kk], a_addr(do_s, kLd, 16 * warp, 16 * kk, lane));
  }
  float dq[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  for (int k0 = 0, stage = 0; k0 < kend; k0 += kTile, stage ^= 1) {
    const T* k_s = kv_s + 2 * stage * kTileElems;
    const T* v_s = k_s + kTileElems;
    if (k0 + kTile < kend) {
      T* next = kv_s + 2 * (stage ^ 1) * kTileElems;
      load_tile_async<T, HS>(next, k_base, sh.row, k0 + kTile, sh.T);
      load_tile_async<T, HS>(next + kTileElems, v_base, sh.row, k0 + kTile, sh.T);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float s[8][4], dp[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (k0 + 16 * np > wrow + 15) continue;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t kf[4], vf[4];
        ldsm_x4(kf, bn_addr(k_s, kLd, 16 * np, 16 * kk, lane));
        mma<T>(s[2 * np], qf[kk], kf[0], kf[1]);
        mma<T>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
        ldsm_x4(vf, bn_addr(v_s, kLd, 16 * np, 16 * kk, lane));
        mma<T>(dp[2 * np], df[kk], vf[0], vf[1]);
        mma<T>(dp[2 * np + 1], df[kk], vf[2], vf[3]);
      }
    }
    // dS = P (dP - D), P = exp2(S scale log2e - lse log2e), 0 where masked (into s).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int key = k0 + 8 * j + 2 * t4;
      const float p0 = key <= row_a ? exp2f(s[j][0] * sl2 - lse_a) : 0.0f;
      const float p1 = key + 1 <= row_a ? exp2f(s[j][1] * sl2 - lse_a) : 0.0f;
      const float p2 = key <= row_b ? exp2f(s[j][2] * sl2 - lse_b) : 0.0f;
      const float p3 = key + 1 <= row_b ? exp2f(s[j][3] * sl2 - lse_b) : 0.0f;
      s[j][0] = p0 * (dp[j][0] - d_a);
      s[j][1] = p1 * (dp[j][1] - d_a);
      s[j][2] = p2 * (dp[j][2] - d_b);
      s[j][3] = p3 * (dp[j][3] - d_b);
    }
    // dQ += dS K (K read k-major: its rows are the product's k).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (k0 + 16 * kk > wrow + 15) continue;
      uint32_t sa[4];
      c_to_a<T>(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp2 = 0; dp2 < kN / 2; ++dp2) {
        uint32_t kt[4];
        ldsm_x4_trans(kt, bk_addr(k_s, kLd, 16 * kk, 16 * dp2, lane));
        mma<T>(dq[2 * dp2], sa, kt[0], kt[1]);
        mma<T>(dq[2 * dp2 + 1], sa, kt[2], kt[3]);
      }
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

  T* dq_a = dqkv + (static_cast<int64_t>(b) * sh.T + row_a) * sh.row + static_cast<int64_t>(h) * HS;
  T* dq_b = dq_a + 8 * sh.row;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int d = 8 * n + 2 * t4;
    if (row_a < sh.T)
      *reinterpret_cast<uint32_t*>(dq_a + d) = pack2<T>(dq[n][0] * sh.scale, dq[n][1] * sh.scale);
    if (row_b < sh.T)
      *reinterpret_cast<uint32_t*>(dq_b + d) = pack2<T>(dq[n][2] * sh.scale, dq[n][3] * sh.scale);
  }
}

// ---- backward dK/dV --------------------------------------------------------------------------

template <class T, int HS>
__global__ void __launch_bounds__(kThreads)
    mma_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                    MmaShape sh) {
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;
  constexpr int kN = HS / 8;
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  extern __shared__ __align__(128) unsigned char smem[];
  // K, V, then two stages of (Q, dO) and two of (lse log2e, D) (64 floats each): the next query
  // tile loads while this one is used.
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + Smem<HS>::kTileBytes);
  T* qd_s = reinterpret_cast<T*>(smem + 2 * Smem<HS>::kTileBytes);
  float* stat_s = reinterpret_cast<float*>(smem + 6 * Smem<HS>::kTileBytes);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int k0 = blockIdx.x * kTile;  // the first key tiles see the most queries: first
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int wkey = k0 + 16 * warp;  // the warp's first key
  const int key_a = wkey + g;
  const int key_b = key_a + 8;
  const float sl2 = sh.scale * kLog2e;

  // The block walks (query head of the group, query tile at or after k0) in order.
  const int qtiles = (sh.T - k0 + kTile - 1) / kTile;
  const int steps = sh.group * qtiles;
  auto issue = [&](int step, int stage) {
    const int hh = step / qtiles;
    const int q0 = k0 + (step - hh * qtiles) * kTile;
    const int h = kvh * sh.group + hh;
    T* q_dst = qd_s + 2 * stage * kTileElems;
    load_tile_async<T, HS>(q_dst, rows + static_cast<int64_t>(h) * HS, sh.row, q0, sh.T);
    load_tile_async<T, HS>(
        q_dst + kTileElems,
        dout + static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * HS, sh.orow, q0,
        sh.T);
    if (threadIdx.x < kTile) {
      const int i = q0 + threadIdx.x;
      const int64_t stat0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;
      float* st = stat_s + 2 * kTile * stage;
      st[threadIdx.x] = i < sh.T ? lse[stat0 + i] * kLog2e : 0.0f;
      st[kTile + threadIdx.x] = i < sh.T ? D[stat0 + i] : 0.0f;
    }
  };

  load_tile_async<T, HS>(k_s, k_base, sh.row, k0, sh.T);
  load_tile_async<T, HS>(v_s, v_base, sh.row, k0, sh.T);
  issue(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t kf[kK][4], vf[kK][4];
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    ldsm_x4(kf[kk], a_addr(k_s, kLd, 16 * warp, 16 * kk, lane));
    ldsm_x4(vf[kk], a_addr(v_s, kLd, 16 * warp, 16 * kk, lane));
  }
  float dk[kN][4], dv[kN][4];
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }

  for (int step = 0, stage = 0; step < steps; ++step, stage ^= 1) {
    if (step + 1 < steps) issue(step + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // this stage's tiles and statistics are in place
    const int q0 = k0 + (step % qtiles) * kTile;
    const T* q_s = qd_s + 2 * stage * kTileElems;
    const T* do_s = q_s + kTileElems;
    const float* lse_s = stat_s + 2 * kTile * stage;  // (64), log2 domain
    const float* d_s = lse_s + kTile;                 // (64)
    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys x the tile's 64 queries.
    float st[8][4], dpt[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0f;
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (q0 + 16 * np + 15 < wkey) continue;  // these queries see none of the warp's keys
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t qf[4], of[4];
        ldsm_x4(qf, bn_addr(q_s, kLd, 16 * np, 16 * kk, lane));
        mma<T>(st[2 * np], kf[kk], qf[0], qf[1]);
        mma<T>(st[2 * np + 1], kf[kk], qf[2], qf[3]);
        ldsm_x4(of, bn_addr(do_s, kLd, 16 * np, 16 * kk, lane));
        mma<T>(dpt[2 * np], vf[kk], of[0], of[1]);
        mma<T>(dpt[2 * np + 1], vf[kk], of[2], of[3]);
      }
    }
    // P^T (into st) and dS^T (into dpt): query i sees key j iff j <= i < T.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int qi = 8 * j + 2 * t4;  // the tile's query of columns c0 / c2 (c1 / c3: qi + 1)
      const int i0 = q0 + qi;
      const int i1 = i0 + 1;
      const float l0 = lse_s[qi], l1 = lse_s[qi + 1];
      const float D0 = d_s[qi], D1 = d_s[qi + 1];
      const float p0 = (key_a <= i0 && i0 < sh.T) ? exp2f(st[j][0] * sl2 - l0) : 0.0f;
      const float p1 = (key_a <= i1 && i1 < sh.T) ? exp2f(st[j][1] * sl2 - l1) : 0.0f;
      const float p2 = (key_b <= i0 && i0 < sh.T) ? exp2f(st[j][2] * sl2 - l0) : 0.0f;
      const float p3 = (key_b <= i1 && i1 < sh.T) ? exp2f(st[j][3] * sl2 - l1) : 0.0f;
      dpt[j][0] = p0 * (dpt[j][0] - D0);
      dpt[j][1] = p1 * (dpt[j][1] - D1);
      dpt[j][2] = p2 * (dpt[j][2] - D0);
      dpt[j][3] = p3 * (dpt[j][3] - D1);
      st[j][0] = p0;
      st[j][1] = p1;
      st[j][2] = p2;
      st[j][3] = p3;
    }
    // dV += P^T dO and dK += dS^T Q (dO and Q read k-major: their rows are the product's k).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (q0 + 16 * kk + 15 < wkey) continue;
      uint32_t pa[4], sa[4];
      c_to_a<T>(pa, st[2 * kk], st[2 * kk + 1]);
      c_to_a<T>(sa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dp2 = 0; dp2 < kN / 2; ++dp2) {
        uint32_t ot[4], qt[4];
        ldsm_x4_trans(ot, bk_addr(do_s, kLd, 16 * kk, 16 * dp2, lane));
        mma<T>(dv[2 * dp2], pa, ot[0], ot[1]);
        mma<T>(dv[2 * dp2 + 1], pa, ot[2], ot[3]);
        ldsm_x4_trans(qt, bk_addr(q_s, kLd, 16 * kk, 16 * dp2, lane));
        mma<T>(dk[2 * dp2], sa, qt[0], qt[1]);
        mma<T>(dk[2 * dp2 + 1], sa, qt[2], qt[3]);
      }
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

  const int64_t kcol = static_cast<int64_t>(sh.NH + kvh) * HS;
  const int64_t vcol = static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  T* row_a_ptr = dqkv + (static_cast<int64_t>(b) * sh.T + key_a) * sh.row;
  T* row_b_ptr = row_a_ptr + 8 * sh.row;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int d = 8 * n + 2 * t4;
    if (key_a < sh.T) {
      *reinterpret_cast<uint32_t*>(row_a_ptr + kcol + d) =
          pack2<T>(dk[n][0] * sh.scale, dk[n][1] * sh.scale);
      *reinterpret_cast<uint32_t*>(row_a_ptr + vcol + d) = pack2<T>(dv[n][0], dv[n][1]);
    }
    if (key_b < sh.T) {
      *reinterpret_cast<uint32_t*>(row_b_ptr + kcol + d) =
          pack2<T>(dk[n][2] * sh.scale, dk[n][3] * sh.scale);
      *reinterpret_cast<uint32_t*>(row_b_ptr + vcol + d) = pack2<T>(dv[n][2], dv[n][3]);
    }
  }
}

// ---- host side -------------------------------------------------------------------------------

MmaShape make_mma_shape(const AttentionDims& s) {
  if (s.NH <= 0 || s.KVH <= 0 || s.NH % s.KVH != 0) {
    check(cudaErrorInvalidValue, "attention (mma): invalid heads");
  }
  MmaShape sh{};
  sh.T = s.T;
  sh.NH = s.NH;
  sh.KVH = s.KVH;
  sh.group = s.NH / s.KVH;
  sh.row = s.qkv_row();
  sh.orow = s.out_row();
  sh.scale = 1.0f / sqrtf(static_cast<float>(s.HS));
  return sh;
}

unsigned mma_tiles(int T) {
  return static_cast<unsigned>((T + kTile - 1) / kTile);
}

constexpr int kMmaHeadSize = 64;

}  // namespace

bool attention_mma_supported(Storage dt, const AttentionDims& s, const void* a, const void* b,
                             const void* c, const void* d) {
  if (dt != Storage::kBF16 && dt != Storage::kF16) return false;
  if (s.HS != kMmaHeadSize) return false;
  if (s.window > 0 && s.window < s.T) return false;
  return aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);  // (null: aligned)
}

void attention_mma_forward(Storage dt, void* out, float* lse, const void* qkv,
                           const AttentionDims& s, cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const MmaShape sh = make_mma_shape(s);
  const dim3 grid(mma_tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  dispatch_16bit(dt, "attention (mma): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    constexpr int HS = kMmaHeadSize;
    const size_t shared = 5 * Smem<HS>::kTileBytes;  // Q and two stages of K, V
    auto kernel = mma_forward_kernel<E, HS>;
    allow_dynamic_shared(kernel, shared, "attention_forward (mma): cudaFuncSetAttribute");
    kernel<<<grid, kThreads, shared, stream>>>(static_cast<E*>(out), lse,
                                               static_cast<const E*>(qkv), sh);
  });
  check(cudaGetLastError(), "attention_forward (mma) kernel launch");
}

void attention_mma_backward(Storage dt, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, const AttentionDims& s,
                            float* scratch, cudaStream_t stream) {
  if (s.B <= 0 || s.T <= 0) return;
  const MmaShape sh = make_mma_shape(s);
  const dim3 dq_grid(mma_tiles(s.T), static_cast<unsigned>(s.NH), static_cast<unsigned>(s.B));
  const dim3 dkdv_grid(mma_tiles(s.T), static_cast<unsigned>(s.KVH), static_cast<unsigned>(s.B));
  float* D = scratch;
  dispatch_16bit(dt, "attention (mma): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    constexpr int HS = kMmaHeadSize;
    const size_t dq_shared = 6 * Smem<HS>::kTileBytes;  // Q, dO and two stages of K, V
    auto dq_kernel = mma_dq_kernel<E, HS>;
    allow_dynamic_shared(dq_kernel, dq_shared, "attention_backward dQ (mma): cudaFuncSetAttribute");
    dq_kernel<<<dq_grid, kThreads, dq_shared, stream>>>(
        static_cast<E*>(dqkv), D, static_cast<const E*>(dout), static_cast<const E*>(qkv),
        static_cast<const E*>(out), lse, sh);
    check(cudaGetLastError(), "attention_backward dQ (mma) kernel launch");
    // K, V, two stages of (Q, dO) and of (lse, D)
    const size_t dkdv_shared = 6 * Smem<HS>::kTileBytes + 4 * kTile * sizeof(float);
    auto dkdv_kernel = mma_dkdv_kernel<E, HS>;
    allow_dynamic_shared(dkdv_kernel, dkdv_shared,
                         "attention_backward dK/dV (mma): cudaFuncSetAttribute");
    dkdv_kernel<<<dkdv_grid, kThreads, dkdv_shared, stream>>>(
        static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, D, sh);
    check(cudaGetLastError(), "attention_backward dK/dV (mma) kernel launch");
  });
}

}  // namespace zerod::cuda
