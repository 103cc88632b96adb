// The blocking and threading of the AVX-512 SGEMM engine (loop structure: gemm_avx512.h).
#include "kernels/cpu/gemm_avx512.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace zerod::cpu::gemm_avx512 {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Splits `len` into ceil(len / max_block) nearly equal blocks, each a multiple of `unit`
// (except the last) and at most max_block long.
int64_t balanced_block(int64_t len, int64_t max_block, int64_t unit) {
  const int64_t blocks = ceil_div(len, max_block);
  return std::min(max_block, round_up(ceil_div(len, blocks), unit));
}

// Packing buffers of the calling thread, reused across calls (a fresh allocation per call
// would page-fault the whole buffer every time). One per thread that calls sgemm, so
// concurrent calls from different threads (ranks) never share one.
//
// The buffer is 2 MB aligned and asks for transparent huge pages: with 4 KB pages the packed
// blocks (the B~ block alone is half of L2) land on random physical pages, and in some
// processes enough of them collide in the same L2 sets to slow a thread down by a third to a
// half (measured: the same shape at 210 or 330 GFLOP/s from one process to the next).
// Physically contiguous 2 MB pages spread them evenly over the sets.
class Workspace {
 public:
  ~Workspace() { std::free(data_); }
  float* get(size_t floats) {
    if (floats > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      constexpr size_t kHugePage = size_t{2} << 20;
      const size_t bytes = (floats * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
      data_ = static_cast<float*>(std::aligned_alloc(kHugePage, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
      madvise(data_, bytes, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
      capacity_ = bytes / sizeof(float);
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

struct Problem {
  bool trans_a = false;
  bool trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int64_t ldc = 0;
  const float* bias = nullptr;
};

// Rows [row0, row1) x columns [col0, col1) of C, computed by one thread with its own buffers.
struct Region {
  int64_t row0, row1, col0, col1;
};

struct Blocking {
  int64_t kc;  // k block: from K only, so the summation order never depends on the threads
  int64_t mc;  // rows of an A~ block
  int64_t nc;  // columns of a B~ block
};

void run_region(const Problem& p, const Blocking& bl, const Region& r, float* a_buf, float* b_buf) {
  for (int64_t ic = r.row0; ic < r.row1; ic += bl.mc) {
    const int64_t mc = std::min(bl.mc, r.row1 - ic);
    for (int64_t pc = 0; pc < p.K; pc += bl.kc) {
      const int64_t kc = std::min(bl.kc, p.K - pc);
      pack_a(p.trans_a, p.A, p.lda, ic, mc, pc, kc, a_buf);
      TileStore store;
      store.alpha = p.alpha;
      store.beta = pc == 0 ? p.beta : 1.0f;
      const bool last_k = pc + kc == p.K;
      for (int64_t jc = r.col0; jc < r.col1; jc += bl.nc) {
        const int64_t nc = std::min(bl.nc, r.col1 - jc);
        pack_b(p.trans_b, p.B, p.ldb, jc, nc, pc, kc, b_buf);
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kMr, mc - ir));
          const float* a_panel = a_buf + ir * kc;
          float* c_row = p.C + (ic + ir) * p.ldc;
          for (int64_t jr = 0; jr < nc; jr += kNr) {
            const int64_t j = jc + jr;
            const int n = static_cast<int>(std::min<int64_t>(kNr, nc - jr));
            store.bias = last_k && p.bias != nullptr ? p.bias + j : nullptr;
            micro_tile(kc, a_panel, mr, b_buf + jr * kc, n, c_row + j, p.ldc, store);
          }
        }
      }
    }
  }
}

// Splits C into tm x tn regions for `threads` threads (tm * tn == threads): the split with the
// least estimated time per thread. A region costs its micro-tiles (padding included) plus its
// packing: its rows of A once, its columns of B once per A~ block. Splitting columns duplicates
// the packing of A across threads and splitting rows that of B, so the smaller operand is
// the one duplicated.
void choose_grid(int64_t M, int64_t N, int64_t K, int threads, int* tm_out, int* tn_out) {
  double best = -1.0;
  for (int tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    const int tn = threads / tm;
    const int64_t rows = std::min(M, ceil_div(ceil_div(M, kMr), tm) * kMr);
    const int64_t cols = std::min(N, ceil_div(ceil_div(N, kNr), tn) * kNr);
    // Unit: one k step of a 14 x 32 micro-tile (28 FMAs, ~14 cycles); packing one float costs
    // about 1/16 of that (measured ~12-20 GB/s per core).
    const double tiles = static_cast<double>(ceil_div(rows, kMr) * ceil_div(cols, kNr));
    const double packed = static_cast<double>(rows + cols * ceil_div(rows, kMc));
    const double cost = (tiles + packed / 16.0) * static_cast<double>(K);
    if (best < 0 || cost < best) {
      best = cost;
      *tm_out = tm;
      *tn_out = tn;
    }
  }
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias, int threads) {
  Problem p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.M = M;
  p.N = N;
  p.K = K;
  p.alpha = alpha;
  p.A = A;
  p.lda = lda;
  p.B = B;
  p.ldb = ldb;
  p.beta = beta;
  p.C = C;
  p.ldc = ldc;
  p.bias = bias;

  // Below ~4 MFLOP (about 20 us on one core) a parallel region costs more than it saves.
  if (2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) < 4e6) {
    threads = 1;
  }
  threads = std::max(1, threads);
  int tm = 1, tn = 1;
  choose_grid(M, N, K, threads, &tm, &tn);
  const int64_t m_panels = ceil_div(M, kMr);
  const int64_t n_panels = ceil_div(N, kNr);
  const int64_t rows_max = ceil_div(m_panels, tm) * kMr;
  const int64_t cols_max = ceil_div(n_panels, tn) * kNr;
  Blocking bl;
  bl.kc = balanced_block(K, kKc, 8);
  bl.mc = balanced_block(std::min(rows_max, round_up(M, kMr)), kMc, kMr);
  bl.nc = balanced_block(std::min(cols_max, round_up(N, kNr)), kNc, kNr);
  // Per thread: A~ (mc, kc) and B~ (kc, nc), each padded against cache-set aliasing.
  const int64_t a_floats = round_up(bl.mc * bl.kc, 16) + 16 * 5;
  const int64_t b_floats = round_up(bl.nc * bl.kc, 16) + 16 * 3;
  const int64_t per_thread = a_floats + b_floats;
  static thread_local Workspace workspace;
  float* buf = workspace.get(static_cast<size_t>(per_thread * threads));

  auto region = [&](int t) {
    const int t_m = t % tm;
    const int t_n = t / tm;
    Region r;
    r.row0 = std::min(M, m_panels * t_m / tm * kMr);
    r.row1 = std::min(M, m_panels * (t_m + 1) / tm * kMr);
    r.col0 = std::min(N, n_panels * t_n / tn * kNr);
    r.col1 = std::min(N, n_panels * (t_n + 1) / tn * kNr);
    return r;
  };
  if (threads == 1) {
    run_region(p, bl, region(0), buf, buf + a_floats);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    // A smaller team than asked for (OMP_DYNAMIC, thread limits): threads loop over regions.
    const int team = omp_get_num_threads();
    for (int t = omp_get_thread_num(); t < threads; t += team) {
      const Region r = region(t);
      float* mine = buf + static_cast<int64_t>(omp_get_thread_num()) * per_thread;
      if (r.row1 > r.row0 && r.col1 > r.col0) run_region(p, bl, r, mine, mine + a_floats);
    }
  }
}

}  // namespace zerod::cpu::gemm_avx512
