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

// A kernel variant: MT 16-row m-tiles per warp (rows of the block: 64 MT); kHold, the warp's
// stationary A fragments (Q and dO in dQ, K and V in dK/dV) held in registers for the whole walk
// rather than reloaded from shared memory per k-step (only with MT == 1); kNp, 16-column blocks
// per pass over a tile in dK/dV (4: the 64 queries at once; 2: two passes of 32, half the score
// registers); kMinBlocks, the resident blocks per SM the register allocation must allow
// (__launch_bounds__); kFast, tiles that no mask touches for the warp run a body without mask
// tests or skipped blocks (straight-line products the compiler can interleave), the others the
// masked body (without it every tile runs the masked body, as the first version did). Every
// variant computes every element in the same order: their outputs are bitwise equal.
template <int MT, bool HOLD, int NP, int MIN_BLOCKS, bool FAST>
struct Variant {
  static_assert(MT == 1 || MT == 2, "one or two m-tiles per warp");
  static_assert(!HOLD || MT == 1, "held fragments: one m-tile per warp");
  static_assert(NP == 2 || NP == 4, "passes of 32 or 64 columns");
  static constexpr int kMT = MT;
  static constexpr bool kHold = HOLD;
  static constexpr int kNp = NP;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  static constexpr bool kFast = FAST;
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

// dst (ROWS, HS + 8) = rows [t0, t0 + ROWS) of a (T, HS) view with row stride `stride`
// (elements), asynchronously (cp.async, 16 bytes a copy; rows at or after T zero-filled). Whole
// block. The copies land by the next cp_async_wait<N> that covers their group, then a
// __syncthreads makes every thread's copies visible.
template <class T, int HS, int ROWS>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int64_t stride, int t0,
                                                int T_) {
  constexpr int kVecs = HS / 8;
  constexpr int kLd = Smem<HS>::kLd;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kVecs; idx += kThreads) {
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

template <class T, int HS, class V>
__global__ void __launch_bounds__(kThreads, V::kMinBlocks)
    mma_forward_kernel(T* out, float* lse, const T* qkv, MmaShape sh) {
  constexpr int MT = V::kMT;
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;              // k-steps over the head
  constexpr int kN = HS / 8;               // n-tiles of O
  constexpr int kRows = kWarps * 16 * MT;  // queries per block
  extern __shared__ __align__(128) unsigned char smem[];
  // Q (kRows rows), then two stages of (K, V): the next key tile loads while this one is used.
  T* q_s = reinterpret_cast<T*>(smem);
  T* kv_s = reinterpret_cast<T*>(smem + MT * Smem<HS>::kTileBytes);
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int wrow = q0 + 16 * MT * warp;  // the warp's first query; m-tile mt: wrow + 16 mt
  const int wlast = wrow + 16 * MT - 1;  // its last
  const float sl2 = sh.scale * kLog2e;
  const int kend = min(q0 + kRows, sh.T);

  load_tile_async<T, HS, kRows>(q_s, q_base, sh.row, q0, sh.T);
  load_tile_async<T, HS, kTile>(kv_s, k_base, sh.row, 0, sh.T);
  load_tile_async<T, HS, kTile>(kv_s + kTileElems, v_base, sh.row, 0, sh.T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[MT][kK][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk)
      ldsm_x4(qf[mt][kk], a_addr(q_s, kLd, 16 * (MT * warp + mt), 16 * kk, lane));
  }

  float o[MT][kN][4];
  float m_a[MT], m_b[MT];  // running max (log2 domain) of this lane's two rows per m-tile
  float l_a[MT], l_b[MT];  // this lane's share of the running sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < kN; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    m_a[mt] = m_b[mt] = -CUDART_INF_F;
    l_a[mt] = l_b[mt] = 0.0f;
  }

  for (int k0 = 0, stage = 0; k0 < kend; k0 += kTile, stage ^= 1) {
    const T* k_s = kv_s + 2 * stage * kTileElems;
    const T* v_s = k_s + kTileElems;
    if (k0 + kTile < kend) {  // the next tile into the other stage (consumed: see the end)
      T* next = kv_s + 2 * (stage ^ 1) * kTileElems;
      load_tile_async<T, HS, kTile>(next, k_base, sh.row, k0 + kTile, sh.T);
      load_tile_async<T, HS, kTile>(next + kTileElems, v_base, sh.row, k0 + kTile, sh.T);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this stage's tiles have landed (all but the newest group)
    __syncthreads();
    // Every key of the tile visible to every row of the warp: the body without masks or skipped
    // blocks (straight-line products the compiler interleaves); else the masked body.
    const bool full = k0 + kTile - 1 <= wrow;
    auto tile = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      float s[MT][8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
      }
      // S = Q K^T over the 16-key blocks some row of the warp sees; each K fragment serves the
      // warp's MT m-tiles.
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (kMasked && k0 + 16 * np > wlast) continue;  // wholly masked for the warp's rows
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          uint32_t kf[4];
          ldsm_x4(kf, bn_addr(k_s, kLd, 16 * np, 16 * kk, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (kMasked && k0 + 16 * np > wrow + 16 * mt + 15) continue;
            mma<T>(s[mt][2 * np], qf[mt][kk], kf[0], kf[1]);
            mma<T>(s[mt][2 * np + 1], qf[mt][kk], kf[2], kf[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r0 = wrow + 16 * mt;
        if (kMasked && k0 > r0 + 15)
          continue;  // the whole tile is past these rows: m, l and O stay
        const int row_a = r0 + g;
        const int row_b = row_a + 8;
        const bool diag = k0 + kTile - 1 > r0;  // some key of the tile is past a row of the m-tile
        // Scale to the log2 domain and mask (key j visible to row i iff j <= i).
        float mx_a = m_a[mt], mx_b = m_b[mt];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int key = k0 + 8 * j + 2 * t4;
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] *= sl2;
          if (kMasked && diag) {
            if (key > row_a) s[mt][j][0] = -CUDART_INF_F;
            if (key + 1 > row_a) s[mt][j][1] = -CUDART_INF_F;
            if (key > row_b) s[mt][j][2] = -CUDART_INF_F;
            if (key + 1 > row_b) s[mt][j][3] = -CUDART_INF_F;
          }
          mx_a = fmaxf(mx_a, fmaxf(s[mt][j][0], s[mt][j][1]));
          mx_b = fmaxf(mx_b, fmaxf(s[mt][j][2], s[mt][j][3]));
        }
        // Every row sees key 0 in the first tile, so the maxima are finite from there on.
        mx_a = quad_max(mx_a);
        mx_b = quad_max(mx_b);
        const float alpha_a = exp2f(m_a[mt] - mx_a);  // 0 the first time (m = -inf)
        const float alpha_b = exp2f(m_b[mt] - mx_b);
        m_a[mt] = mx_a;
        m_b[mt] = mx_b;
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          s[mt][j][0] = exp2f(s[mt][j][0] - mx_a);
          s[mt][j][1] = exp2f(s[mt][j][1] - mx_a);
          s[mt][j][2] = exp2f(s[mt][j][2] - mx_b);
          s[mt][j][3] = exp2f(s[mt][j][3] - mx_b);
          sum_a += s[mt][j][0] + s[mt][j][1];
          sum_b += s[mt][j][2] + s[mt][j][3];
        }
        l_a[mt] = l_a[mt] * alpha_a + sum_a;
        l_b[mt] = l_b[mt] * alpha_b + sum_b;
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          o[mt][n][0] *= alpha_a;
          o[mt][n][1] *= alpha_a;
          o[mt][n][2] *= alpha_b;
          o[mt][n][3] *= alpha_b;
        }
      }
      // O += P V over the key blocks of 16 the rows see; each V fragment serves the MT m-tiles.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kMasked && k0 + 16 * kk > wlast) continue;
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_to_a<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < kN / 2; ++dp) {
          uint32_t vf[4];
          ldsm_x4_trans(vf, bk_addr(v_s, kLd, 16 * kk, 16 * dp, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (kMasked && k0 + 16 * kk > wrow + 16 * mt + 15) continue;
            mma<T>(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
            mma<T>(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
          }
        }
      }
    };
    if (V::kFast && full) {
      tile(std::false_type{});
    } else {
      tile(std::true_type{});
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row_a = wrow + 16 * mt + g;
    const int row_b = row_a + 8;
    const float sum_a = quad_sum(l_a[mt]);
    const float sum_b = quad_sum(l_b[mt]);
    const float inv_a = 1.0f / sum_a;
    const float inv_b = 1.0f / sum_b;
    T* out_a =
        out + (static_cast<int64_t>(b) * sh.T + row_a) * sh.orow + static_cast<int64_t>(h) * HS;
    T* out_b = out_a + 8 * sh.orow;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int d = 8 * n + 2 * t4;
      if (row_a < sh.T)
        *reinterpret_cast<uint32_t*>(out_a + d) =
            pack2<T>(o[mt][n][0] * inv_a, o[mt][n][1] * inv_a);
      if (row_b < sh.T)
        *reinterpret_cast<uint32_t*>(out_b + d) =
            pack2<T>(o[mt][n][2] * inv_b, o[mt][n][3] * inv_b);
    }
    if (t4 == 0) {
      float* lse_row = lse + (static_cast<int64_t>(b) * sh.NH + h) * sh.T;
      if (row_a < sh.T) lse_row[row_a] = m_a[mt] * kLn2 + logf(sum_a);
      if (row_b < sh.T) lse_row[row_b] = m_b[mt] * kLn2 + logf(sum_b);
    }
  }
}

// ---- backward dQ (and D) ---------------------------------------------------------------------

template <class T, int HS, class V>
__global__ void __launch_bounds__(kThreads, V::kMinBlocks)
    mma_dq_kernel(T* dqkv, float* D, const T* dout, const T* qkv, const T* out, const float* lse,
                  MmaShape sh) {
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;
  constexpr int kN = HS / 8;
  constexpr int MT = V::kMT;
  constexpr int kRows = kWarps * 16 * MT;  // queries per block
  // Held: the warp's Q and dO fragments stay in registers for the whole walk; else they are
  // reloaded from shared memory per k-step (fewer registers).
  constexpr bool kHold = V::kHold;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q, dO (kRows rows each), then two stages of (K, V).
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = reinterpret_cast<T*>(smem + MT * Smem<HS>::kTileBytes);
  T* kv_s = reinterpret_cast<T*>(smem + 2 * MT * Smem<HS>::kTileBytes);
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kvh = h / sh.group;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* q_base = rows + static_cast<int64_t>(h) * HS;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int64_t obase = static_cast<int64_t>(b) * sh.T * sh.orow + static_cast<int64_t>(h) * HS;
  const int64_t stat0 = (static_cast<int64_t>(b) * sh.NH + h) * sh.T;  // of lse and D
  const int wrow = q0 + 16 * MT * warp;
  const int wlast = wrow + 16 * MT - 1;
  const float sl2 = sh.scale * kLog2e;

  const int kend = min(q0 + kRows, sh.T);
  load_tile_async<T, HS, kRows>(q_s, q_base, sh.row, q0, sh.T);
  load_tile_async<T, HS, kRows>(do_s, dout + obase, sh.orow, q0, sh.T);
  load_tile_async<T, HS, kTile>(kv_s, k_base, sh.row, 0, sh.T);
  load_tile_async<T, HS, kTile>(kv_s + kTileElems, v_base, sh.row, 0, sh.T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // D of rows a and b of each m-tile: the quad's 4 lanes split the head, HS / 4 channels each.
  float d_a[MT], d_b[MT], lse_a[MT], lse_b[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row_a = wrow + 16 * mt + g;
    const int row_b = row_a + 8;
    float da = 0.0f, db = 0.0f;
    const int c0 = t4 * (HS / 4);
    const T* do_a = do_s + (16 * (MT * warp + mt) + g) * kLd;
    const T* do_b = do_a + 8 * kLd;
    if (row_a < sh.T) {
      const T* o_a = out + obase + static_cast<int64_t>(row_a) * sh.orow;
#pragma unroll
      for (int c = c0; c < c0 + HS / 4; ++c) da += to_f32(do_a[c]) * to_f32(o_a[c]);
    }
    if (row_b < sh.T) {
      const T* o_b = out + obase + static_cast<int64_t>(row_b) * sh.orow;
#pragma unroll
      for (int c = c0; c < c0 + HS / 4; ++c) db += to_f32(do_b[c]) * to_f32(o_b[c]);
    }
    da = quad_sum(da);
    db = quad_sum(db);
    if (t4 == 0) {
      if (row_a < sh.T) D[stat0 + row_a] = da;
      if (row_b < sh.T) D[stat0 + row_b] = db;
    }
    d_a[mt] = da;
    d_b[mt] = db;
    lse_a[mt] = row_a < sh.T ? lse[stat0 + row_a] * kLog2e : 0.0f;
    lse_b[mt] = row_b < sh.T ? lse[stat0 + row_b] * kLog2e : 0.0f;
  }

  uint32_t qh[kHold ? kK : 1][4], dh[kHold ? kK : 1][4];
  if constexpr (kHold) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      ldsm_x4(qh[kk], a_addr(q_s, kLd, 16 * warp, 16 * kk, lane));
      ldsm_x4(dh[kk], a_addr(do_s, kLd, 16 * warp, 16 * kk, lane));
    }
  }
  float dq[MT][kN][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < kN; ++n) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
  }

  for (int k0 = 0, stage = 0; k0 < kend; k0 += kTile, stage ^= 1) {
    const T* k_s = kv_s + 2 * stage * kTileElems;
    const T* v_s = k_s + kTileElems;
    if (k0 + kTile < kend) {
      T* next = kv_s + 2 * (stage ^ 1) * kTileElems;
      load_tile_async<T, HS, kTile>(next, k_base, sh.row, k0 + kTile, sh.T);
      load_tile_async<T, HS, kTile>(next + kTileElems, v_base, sh.row, k0 + kTile, sh.T);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    // Every key of the tile visible to every row of the warp: the body without masks (as the
    // forward).
    const bool full = k0 + kTile - 1 <= wrow;
    auto tile = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      float s[MT][8][4], dp[MT][8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = dp[mt][j][e] = 0.0f;
        }
      }
      // S = Q K^T and dP = dO V^T; each K and V fragment serves the warp's MT m-tiles.
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        uint32_t qa[MT][4], da[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kHold) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              qa[mt][r] = qh[kk][r];
              da[mt][r] = dh[kk][r];
            }
          } else {
            ldsm_x4(qa[mt], a_addr(q_s, kLd, 16 * (MT * warp + mt), 16 * kk, lane));
            ldsm_x4(da[mt], a_addr(do_s, kLd, 16 * (MT * warp + mt), 16 * kk, lane));
          }
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (kMasked && k0 + 16 * np > wlast) continue;
          uint32_t kf[4], vf[4];
          ldsm_x4(kf, bn_addr(k_s, kLd, 16 * np, 16 * kk, lane));
          ldsm_x4(vf, bn_addr(v_s, kLd, 16 * np, 16 * kk, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (kMasked && k0 + 16 * np > wrow + 16 * mt + 15) continue;
            mma<T>(s[mt][2 * np], qa[mt], kf[0], kf[1]);
            mma<T>(s[mt][2 * np + 1], qa[mt], kf[2], kf[3]);
            mma<T>(dp[mt][2 * np], da[mt], vf[0], vf[1]);
            mma<T>(dp[mt][2 * np + 1], da[mt], vf[2], vf[3]);
          }
        }
      }
      // dS = P (dP - D), P = exp2(S scale log2e - lse log2e), 0 where masked (into s).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row_a = wrow + 16 * mt + g;
        const int row_b = row_a + 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int key = k0 + 8 * j + 2 * t4;
          const float p0 = (!kMasked || key <= row_a) ? exp2f(s[mt][j][0] * sl2 - lse_a[mt]) : 0.0f;
          const float p1 =
              (!kMasked || key + 1 <= row_a) ? exp2f(s[mt][j][1] * sl2 - lse_a[mt]) : 0.0f;
          const float p2 = (!kMasked || key <= row_b) ? exp2f(s[mt][j][2] * sl2 - lse_b[mt]) : 0.0f;
          const float p3 =
              (!kMasked || key + 1 <= row_b) ? exp2f(s[mt][j][3] * sl2 - lse_b[mt]) : 0.0f;
          s[mt][j][0] = p0 * (dp[mt][j][0] - d_a[mt]);
          s[mt][j][1] = p1 * (dp[mt][j][1] - d_a[mt]);
          s[mt][j][2] = p2 * (dp[mt][j][2] - d_b[mt]);
          s[mt][j][3] = p3 * (dp[mt][j][3] - d_b[mt]);
        }
      }
      // dQ += dS K (K read k-major: its rows are the product's k); each K fragment serves MT.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kMasked && k0 + 16 * kk > wlast) continue;
        uint32_t sa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_to_a<T>(sa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dp2 = 0; dp2 < kN / 2; ++dp2) {
          uint32_t kt[4];
          ldsm_x4_trans(kt, bk_addr(k_s, kLd, 16 * kk, 16 * dp2, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (kMasked && k0 + 16 * kk > wrow + 16 * mt + 15) continue;
            mma<T>(dq[mt][2 * dp2], sa[mt], kt[0], kt[1]);
            mma<T>(dq[mt][2 * dp2 + 1], sa[mt], kt[2], kt[3]);
          }
        }
      }
    };
    if (V::kFast && full) {
      tile(std::false_type{});
    } else {
      tile(std::true_type{});
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int row_a = wrow + 16 * mt + g;
    const int row_b = row_a + 8;
    T* dq_a =
        dqkv + (static_cast<int64_t>(b) * sh.T + row_a) * sh.row + static_cast<int64_t>(h) * HS;
    T* dq_b = dq_a + 8 * sh.row;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int d = 8 * n + 2 * t4;
      if (row_a < sh.T)
        *reinterpret_cast<uint32_t*>(dq_a + d) =
            pack2<T>(dq[mt][n][0] * sh.scale, dq[mt][n][1] * sh.scale);
      if (row_b < sh.T)
        *reinterpret_cast<uint32_t*>(dq_b + d) =
            pack2<T>(dq[mt][n][2] * sh.scale, dq[mt][n][3] * sh.scale);
    }
  }
}

// ---- backward dK/dV --------------------------------------------------------------------------

template <class T, int HS, class V>
__global__ void __launch_bounds__(kThreads, V::kMinBlocks)
    mma_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                    MmaShape sh) {
  constexpr int kLd = Smem<HS>::kLd;
  constexpr int kK = HS / 16;
  constexpr int kN = HS / 8;
  constexpr int MT = V::kMT;
  constexpr int kRows = kWarps * 16 * MT;  // keys per block
  constexpr int kTileElems = static_cast<int>(Smem<HS>::kTileBytes / sizeof(T));
  // Held: the warp's K and V fragments stay in registers for the whole walk; else reloaded per
  // k-step. kNp 16-query blocks per pass over a query tile (2: two passes, half the scores).
  constexpr bool kHold = V::kHold;
  constexpr int kNp = V::kNp;
  extern __shared__ __align__(128) unsigned char smem[];
  // K, V (kRows rows each), then two stages of (Q, dO) and two of (lse log2e, D) (64 floats
  // each): the next query tile loads while this one is used.
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + MT * Smem<HS>::kTileBytes);
  T* qd_s = reinterpret_cast<T*>(smem + 2 * MT * Smem<HS>::kTileBytes);
  float* stat_s = reinterpret_cast<float*>(smem + (2 * MT + 4) * Smem<HS>::kTileBytes);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const int k0 = blockIdx.x * kRows;  // the first key tiles see the most queries: first
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const T* rows = qkv + static_cast<int64_t>(b) * sh.T * sh.row;
  const T* k_base = rows + static_cast<int64_t>(sh.NH + kvh) * HS;
  const T* v_base = rows + static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
  const int wkey = k0 + 16 * MT * warp;  // the warp's first key; m-tile mt: wkey + 16 mt
  const float sl2 = sh.scale * kLog2e;

  // The block walks (query head of the group, query tile of 64 at or after k0) in order.
  const int qtiles = (sh.T - k0 + kTile - 1) / kTile;
  const int steps = sh.group * qtiles;
  auto issue = [&](int step, int stage) {
    const int hh = step / qtiles;
    const int q0 = k0 + (step - hh * qtiles) * kTile;
    const int h = kvh * sh.group + hh;
    T* q_dst = qd_s + 2 * stage * kTileElems;
    load_tile_async<T, HS, kTile>(q_dst, rows + static_cast<int64_t>(h) * HS, sh.row, q0, sh.T);
    load_tile_async<T, HS, kTile>(
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

  load_tile_async<T, HS, kRows>(k_s, k_base, sh.row, k0, sh.T);
  load_tile_async<T, HS, kRows>(v_s, v_base, sh.row, k0, sh.T);
  issue(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t kh[kHold ? kK : 1][4], vh[kHold ? kK : 1][4];
  if constexpr (kHold) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      ldsm_x4(kh[kk], a_addr(k_s, kLd, 16 * warp, 16 * kk, lane));
      ldsm_x4(vh[kk], a_addr(v_s, kLd, 16 * warp, 16 * kk, lane));
    }
  }
  float dk[MT][kN][4], dv[MT][kN][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      dk[mt][n][0] = dk[mt][n][1] = dk[mt][n][2] = dk[mt][n][3] = 0.0f;
      dv[mt][n][0] = dv[mt][n][1] = dv[mt][n][2] = dv[mt][n][3] = 0.0f;
    }
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
    // Every query of the tile (all before T) sees every key of the warp: the body without masks.
    const bool full = q0 >= wkey + 16 * MT - 1 && q0 + kTile <= sh.T;
    auto tile = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int np0 = 0; np0 < 4; np0 += kNp) {
        // S^T = K Q^T and dP^T = V dO^T for the warp's keys x this pass's 16 kNp queries.
        float st[MT][2 * kNp][4], dpt[MT][2 * kNp][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < 2 * kNp; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) st[mt][j][e] = dpt[mt][j][e] = 0.0f;
          }
        }
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          uint32_t ka[MT][4], va[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if constexpr (kHold) {
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                ka[mt][r] = kh[kk][r];
                va[mt][r] = vh[kk][r];
              }
            } else {
              ldsm_x4(ka[mt], a_addr(k_s, kLd, 16 * (MT * warp + mt), 16 * kk, lane));
              ldsm_x4(va[mt], a_addr(v_s, kLd, 16 * (MT * warp + mt), 16 * kk, lane));
            }
          }
#pragma unroll
          for (int nl = 0; nl < kNp; ++nl) {
            const int np = np0 + nl;
            if (kMasked && q0 + 16 * np + 15 < wkey)
              continue;  // these queries see none of the warp's keys
            uint32_t qf[4], of[4];
            ldsm_x4(qf, bn_addr(q_s, kLd, 16 * np, 16 * kk, lane));
            ldsm_x4(of, bn_addr(do_s, kLd, 16 * np, 16 * kk, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              if (kMasked && q0 + 16 * np + 15 < wkey + 16 * mt) continue;
              mma<T>(st[mt][2 * nl], ka[mt], qf[0], qf[1]);
              mma<T>(st[mt][2 * nl + 1], ka[mt], qf[2], qf[3]);
              mma<T>(dpt[mt][2 * nl], va[mt], of[0], of[1]);
              mma<T>(dpt[mt][2 * nl + 1], va[mt], of[2], of[3]);
            }
          }
        }
        // P^T (into st) and dS^T (into dpt): query i sees key j iff j <= i < T.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int key_a = wkey + 16 * mt + g;
          const int key_b = key_a + 8;
#pragma unroll
          for (int j = 0; j < 2 * kNp; ++j) {
            const int qi = 16 * np0 + 8 * j + 2 * t4;  // the tile's query of c0 / c2 (c1 / c3: +1)
            const int i0 = q0 + qi;
            const int i1 = i0 + 1;
            const float l0 = lse_s[qi], l1 = lse_s[qi + 1];
            const float D0 = d_s[qi], D1 = d_s[qi + 1];
            const float p0 =
                (!kMasked || (key_a <= i0 && i0 < sh.T)) ? exp2f(st[mt][j][0] * sl2 - l0) : 0.0f;
            const float p1 =
                (!kMasked || (key_a <= i1 && i1 < sh.T)) ? exp2f(st[mt][j][1] * sl2 - l1) : 0.0f;
            const float p2 =
                (!kMasked || (key_b <= i0 && i0 < sh.T)) ? exp2f(st[mt][j][2] * sl2 - l0) : 0.0f;
            const float p3 =
                (!kMasked || (key_b <= i1 && i1 < sh.T)) ? exp2f(st[mt][j][3] * sl2 - l1) : 0.0f;
            dpt[mt][j][0] = p0 * (dpt[mt][j][0] - D0);
            dpt[mt][j][1] = p1 * (dpt[mt][j][1] - D1);
            dpt[mt][j][2] = p2 * (dpt[mt][j][2] - D0);
            dpt[mt][j][3] = p3 * (dpt[mt][j][3] - D1);
            st[mt][j][0] = p0;
            st[mt][j][1] = p1;
            st[mt][j][2] = p2;
            st[mt][j][3] = p3;
          }
        }
        // dV += P^T dO and dK += dS^T Q (dO and Q read k-major: their rows are the product's k);
        // each dO and Q fragment serves the MT m-tiles.
#pragma unroll
        for (int nl = 0; nl < kNp; ++nl) {
          const int kq = np0 + nl;  // the 16-query block
          if (kMasked && q0 + 16 * kq + 15 < wkey) continue;
          uint32_t pa[MT][4], sa[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            c_to_a<T>(pa[mt], st[mt][2 * nl], st[mt][2 * nl + 1]);
            c_to_a<T>(sa[mt], dpt[mt][2 * nl], dpt[mt][2 * nl + 1]);
          }
#pragma unroll
          for (int dp2 = 0; dp2 < kN / 2; ++dp2) {
            uint32_t ot[4], qt[4];
            ldsm_x4_trans(ot, bk_addr(do_s, kLd, 16 * kq, 16 * dp2, lane));
            ldsm_x4_trans(qt, bk_addr(q_s, kLd, 16 * kq, 16 * dp2, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              if (kMasked && q0 + 16 * kq + 15 < wkey + 16 * mt) continue;
              mma<T>(dv[mt][2 * dp2], pa[mt], ot[0], ot[1]);
              mma<T>(dv[mt][2 * dp2 + 1], pa[mt], ot[2], ot[3]);
              mma<T>(dk[mt][2 * dp2], sa[mt], qt[0], qt[1]);
              mma<T>(dk[mt][2 * dp2 + 1], sa[mt], qt[2], qt[3]);
            }
          }
        }
      }
    };
    if (V::kFast && full) {
      tile(std::false_type{});
    } else {
      tile(std::true_type{});
    }
    __syncthreads();  // this stage is consumed before the next iteration loads into it
  }

  const int64_t kcol = static_cast<int64_t>(sh.NH + kvh) * HS;
  const int64_t vcol = static_cast<int64_t>(sh.NH + sh.KVH + kvh) * HS;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int key_a = wkey + 16 * mt + g;
    const int key_b = key_a + 8;
    T* row_a_ptr = dqkv + (static_cast<int64_t>(b) * sh.T + key_a) * sh.row;
    T* row_b_ptr = row_a_ptr + 8 * sh.row;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int d = 8 * n + 2 * t4;
      if (key_a < sh.T) {
        *reinterpret_cast<uint32_t*>(row_a_ptr + kcol + d) =
            pack2<T>(dk[mt][n][0] * sh.scale, dk[mt][n][1] * sh.scale);
        *reinterpret_cast<uint32_t*>(row_a_ptr + vcol + d) = pack2<T>(dv[mt][n][0], dv[mt][n][1]);
      }
      if (key_b < sh.T) {
        *reinterpret_cast<uint32_t*>(row_b_ptr + kcol + d) =
            pack2<T>(dk[mt][n][2] * sh.scale, dk[mt][n][3] * sh.scale);
        *reinterpret_cast<uint32_t*>(row_b_ptr + vcol + d) = pack2<T>(dv[mt][n][2], dv[mt][n][3]);
      }
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

unsigned mma_tiles(int T, int rows) {
  return static_cast<unsigned>((T + rows - 1) / rows);
}

// The variants each kernel comes in (attention_mma.h numbers them: index = position here).
// Variant 0 of each is the first version's shape (no unmasked fast path).
using Fwd0 = Variant<1, true, 4, 4, false>;   // 64-query blocks, 4 per SM
using Fwd1 = Variant<1, true, 4, 4, true>;    // + the unmasked body for full tiles
using Fwd2 = Variant<1, true, 4, 5, true>;    // squeezed to 5 blocks per SM
using Fwd3 = Variant<2, false, 4, 1, true>;   // 128-query blocks: K/V fragments feed two m-tiles
using Dq0 = Variant<1, true, 4, 3, false>;    // Q, dO fragments held, 3 blocks per SM
using Dq1 = Variant<1, true, 4, 3, true>;     // + the unmasked body
using Dq2 = Variant<1, false, 4, 3, true>;    // fragments reloaded per k-step
using Dq3 = Variant<1, false, 4, 4, true>;    // reloaded, 4 blocks per SM
using Dq4 = Variant<2, false, 4, 1, true>;    // 128-query blocks
using Dkdv0 = Variant<1, true, 4, 2, false>;  // K, V held, 64 queries a pass, 2 blocks per SM
using Dkdv1 = Variant<1, true, 4, 2, true>;   // + the unmasked body
using Dkdv2 = Variant<1, false, 2, 3, true>;  // reloaded, 32 queries a pass, 3 blocks per SM
using Dkdv3 = Variant<1, true, 2, 3, true>;   // held, 32 queries a pass, 3 blocks per SM
using Dkdv4 = Variant<2, false, 2, 1, true>;  // 128-key blocks

template <class E, class V>
void launch_forward(E* out, float* lse, const E* qkv, const AttentionDims& s, const MmaShape& sh,
                    cudaStream_t stream) {
  constexpr int HS = 64;
  const dim3 grid(mma_tiles(s.T, kWarps * 16 * V::kMT), static_cast<unsigned>(s.NH),
                  static_cast<unsigned>(s.B));
  const size_t shared = (V::kMT + 4) * Smem<HS>::kTileBytes;  // Q and two stages of K, V
  auto kernel = mma_forward_kernel<E, HS, V>;
  allow_dynamic_shared(kernel, shared, "attention_forward (mma): cudaFuncSetAttribute");
  kernel<<<grid, kThreads, shared, stream>>>(out, lse, qkv, sh);
}

template <class E, class V>
void launch_dq(E* dqkv, float* D, const E* dout, const E* qkv, const E* out, const float* lse,
               const AttentionDims& s, const MmaShape& sh, cudaStream_t stream) {
  constexpr int HS = 64;
  const dim3 grid(mma_tiles(s.T, kWarps * 16 * V::kMT), static_cast<unsigned>(s.NH),
                  static_cast<unsigned>(s.B));
  const size_t shared = (2 * V::kMT + 4) * Smem<HS>::kTileBytes;  // Q, dO, 2 stages of K, V
  auto kernel = mma_dq_kernel<E, HS, V>;
  allow_dynamic_shared(kernel, shared, "attention_backward dQ (mma): cudaFuncSetAttribute");
  kernel<<<grid, kThreads, shared, stream>>>(dqkv, D, dout, qkv, out, lse, sh);
}

template <class E, class V>
void launch_dkdv(E* dqkv, const E* dout, const E* qkv, const float* lse, const float* D,
                 const AttentionDims& s, const MmaShape& sh, cudaStream_t stream) {
  constexpr int HS = 64;
  const dim3 grid(mma_tiles(s.T, kWarps * 16 * V::kMT), static_cast<unsigned>(s.KVH),
                  static_cast<unsigned>(s.B));
  // K, V, two stages of (Q, dO) and of (lse, D)
  const size_t shared = (2 * V::kMT + 4) * Smem<HS>::kTileBytes + 4 * kTile * sizeof(float);
  auto kernel = mma_dkdv_kernel<E, HS, V>;
  allow_dynamic_shared(kernel, shared, "attention_backward dK/dV (mma): cudaFuncSetAttribute");
  kernel<<<grid, kThreads, shared, stream>>>(dqkv, dout, qkv, lse, D, sh);
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
                           const AttentionDims& s, cudaStream_t stream, int variant) {
  if (s.B <= 0 || s.T <= 0) return;
  if (variant < 0 || variant >= kMmaForwardVariants)
    check(cudaErrorInvalidValue, "attention_forward (mma): no such kernel variant");
  const MmaShape sh = make_mma_shape(s);
  dispatch_16bit(dt, "attention (mma): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    auto* o = static_cast<E*>(out);
    const auto* x = static_cast<const E*>(qkv);
    if (variant == 0) launch_forward<E, Fwd0>(o, lse, x, s, sh, stream);
    if (variant == 1) launch_forward<E, Fwd1>(o, lse, x, s, sh, stream);
    if (variant == 2) launch_forward<E, Fwd2>(o, lse, x, s, sh, stream);
    if (variant == 3) launch_forward<E, Fwd3>(o, lse, x, s, sh, stream);
  });
  check(cudaGetLastError(), "attention_forward (mma) kernel launch");
}

void attention_mma_backward(Storage dt, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, const AttentionDims& s,
                            float* scratch, cudaStream_t stream, int dq_variant, int dkdv_variant) {
  if (s.B <= 0 || s.T <= 0) return;
  if (dq_variant < 0 || dq_variant >= kMmaDqVariants || dkdv_variant < 0 ||
      dkdv_variant >= kMmaDkdvVariants)
    check(cudaErrorInvalidValue, "attention_backward (mma): no such kernel variant");
  const MmaShape sh = make_mma_shape(s);
  float* D = scratch;
  dispatch_16bit(dt, "attention (mma): unsupported storage dtype", [&](auto tag) {
    using E = typename decltype(tag)::type;
    auto* dx = static_cast<E*>(dqkv);
    const auto* g = static_cast<const E*>(dout);
    const auto* x = static_cast<const E*>(qkv);
    const auto* o = static_cast<const E*>(out);
    if (dq_variant == 0) launch_dq<E, Dq0>(dx, D, g, x, o, lse, s, sh, stream);
    if (dq_variant == 1) launch_dq<E, Dq1>(dx, D, g, x, o, lse, s, sh, stream);
    if (dq_variant == 2) launch_dq<E, Dq2>(dx, D, g, x, o, lse, s, sh, stream);
    if (dq_variant == 3) launch_dq<E, Dq3>(dx, D, g, x, o, lse, s, sh, stream);
    if (dq_variant == 4) launch_dq<E, Dq4>(dx, D, g, x, o, lse, s, sh, stream);
    check(cudaGetLastError(), "attention_backward dQ (mma) kernel launch");
    if (dkdv_variant == 0) launch_dkdv<E, Dkdv0>(dx, g, x, lse, D, s, sh, stream);
    if (dkdv_variant == 1) launch_dkdv<E, Dkdv1>(dx, g, x, lse, D, s, sh, stream);
    if (dkdv_variant == 2) launch_dkdv<E, Dkdv2>(dx, g, x, lse, D, s, sh, stream);
    if (dkdv_variant == 3) launch_dkdv<E, Dkdv3>(dx, g, x, lse, D, s, sh, stream);
    if (dkdv_variant == 4) launch_dkdv<E, Dkdv4>(dx, g, x, lse, D, s, sh, stream);
    check(cudaGetLastError(), "attention_backward dK/dV (mma) kernel launch");
  });
}

}  // namespace zerod::cuda
