// Attention over key/value blocks at global positions (kernels/cpu/attention_block.h), the
// building block of ring attention, against attention_forward / attention_backward over the
// whole sequence: a sequence of T positions split over C = 2, 3, 4 "ranks" (contiguous chunks,
// the load-balanced causal split where rank r holds chunks r and 2C-1-r, and random position
// sets in random order), each rank's queries meeting every key block in ring order. Merged
// out / lse must equal the whole-sequence forward (1e-6) and the block gradients, summed as a
// ring sums them (dQ at the rank, dK/dV travelling with their block), the whole-sequence
// backward (1e-5). MHA and GQA, causal and sliding window, query blocks over kAttentionBlockQ.
#include "kernels/cpu/attention_block.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernel_test_util.h"
#include "kernels/cpu/attention.h"

namespace zerod::cpu {
namespace {

using test::VecF;
using Positions = std::vector<int32_t>;

// How the T positions are split over C ranks.
enum class Split { kContiguous, kLoadBalanced, kRandom };

const char* split_name(Split s) {
  switch (s) {
    case Split::kContiguous:
      return "contiguous";
    case Split::kLoadBalanced:
      return "load-balanced";
    case Split::kRandom:
      return "random";
  }
  return "?";
}

// Rank r's positions: chunk r of C (sizes differ by at most one); chunks r and 2C-1-r of 2C; or
// a random share of a random permutation, left in random order.
std::vector<Positions> split_positions(int T, int C, Split split, uint64_t seed) {
  std::vector<Positions> ranks(static_cast<size_t>(C));
  auto chunk = [&](int k, int n) {  // positions of chunk k of n
    Positions p;
    for (int t = k * T / n; t < (k + 1) * T / n; ++t) p.push_back(t);
    return p;
  };
  if (split == Split::kContiguous) {
    for (int r = 0; r < C; ++r) ranks[r] = chunk(r, C);
  } else if (split == Split::kLoadBalanced) {
    for (int r = 0; r < C; ++r) {
      ranks[r] = chunk(r, 2 * C);
      const Positions tail = chunk(2 * C - 1 - r, 2 * C);
      ranks[r].insert(ranks[r].end(), tail.begin(), tail.end());
    }
  } else {
    Positions all(static_cast<size_t>(T));
    std::iota(all.begin(), all.end(), 0);
    Rng rng(seed, 7);
    for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng.uniform(i + 1)]);
    for (int t = 0; t < T; ++t) ranks[static_cast<size_t>(t % C)].push_back(all[t]);
  }
  return ranks;
}

struct Case {
  int B, T, NH, KVH, HS, window;
};

AttentionShape whole(const Case& c) {
  return AttentionShape{c.B, c.T, c.NH, c.KVH, c.HS, c.window};
}

// The rows of a (B, T, width) tensor at `pos`: (B, |pos|, width), columns [col, col + n).
VecF gather_rows(const VecF& x, int B, int T, int64_t width, const Positions& pos, int64_t col,
                 int64_t n) {
  VecF out(static_cast<size_t>(B) * pos.size() * n);
  for (int b = 0; b < B; ++b)
    for (size_t i = 0; i < pos.size(); ++i) {
      const float* src = x.data() + (static_cast<int64_t>(b) * T + pos[i]) * width + col;
      std::copy(src, src + n, out.begin() + (static_cast<int64_t>(b) * pos.size() + i) * n);
    }
  return out;
}

// lse (B, NH, T) at `pos`: (B, NH, |pos|).
VecF gather_lse(const VecF& lse, int B, int NH, int T, const Positions& pos) {
  VecF out(static_cast<size_t>(B) * NH * pos.size());
  for (int bh = 0; bh < B * NH; ++bh)
    for (size_t i = 0; i < pos.size(); ++i)
      out[bh * pos.size() + i] = lse[static_cast<int64_t>(bh) * T + pos[i]];
  return out;
}

double max_abs(const VecF& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// max |got - want| / max(1e-30, max |want|).
double rel(const VecF& got, const VecF& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0;
  for (size_t i = 0; i < got.size(); ++i)
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
  return num / std::max(1e-30, max_abs(want));
}

struct Reference {
  VecF qkv, out, lse, dout, dqkv;
};

Reference reference(const Case& c, uint64_t seed) {
  const AttentionShape s = whole(c);
  Reference r;
  r.qkv = test::randn(int64_t{c.B} * c.T * s.qkv_row(), seed);
  r.out.resize(static_cast<size_t>(c.B) * c.T * s.out_row());
  r.lse.resize(static_cast<size_t>(c.B) * c.NH * c.T);
  attention_forward(r.out.data(), r.lse.data(), r.qkv.data(), s);
  r.dout = test::randn(static_cast<int64_t>(r.out.size()), seed + 1);
  r.dqkv.resize(r.qkv.size());
  attention_backward(r.dqkv.data(), r.dout.data(), r.qkv.data(), r.out.data(), r.lse.data(), s);
  return r;
}

// One rank's view of the sequence: its query rows and positions.
struct RankState {
  Positions qpos;
  VecF qkv, dout, out, lse, dqkv;
};

// Runs ring attention over `ranks` position sets (each rank's queries against every rank's
// key/value block, starting with its own and going round) and checks it against the reference.
void check_ring(const Case& c, const std::vector<Positions>& ranks, const std::string& what) {
  SCOPED_TRACE(what);
  const AttentionShape s = whole(c);
  const Reference ref = reference(c, 1000 + c.T + c.window);
  const int C = static_cast<int>(ranks.size());
  const int64_t R = s.qkv_row();
  const int64_t kvw = int64_t{2} * c.KVH * c.HS;
  const int64_t kcol = int64_t{c.NH} * c.HS;  // the key/value columns of a qkv row

  std::vector<RankState> st(static_cast<size_t>(C));
  std::vector<VecF> kv(static_cast<size_t>(C));
  for (int r = 0; r < C; ++r) {
    st[r].qpos = ranks[r];
    st[r].qkv = gather_rows(ref.qkv, c.B, c.T, R, ranks[r], 0, R);
    st[r].dout = gather_rows(ref.dout, c.B, c.T, s.out_row(), ranks[r], 0, s.out_row());
    kv[r] = gather_rows(ref.qkv, c.B, c.T, R, ranks[r], kcol, kvw);
  }

  // Forward: rank r meets blocks r, r-1, ..., r+1 (a ring passing blocks to rank + 1).
  for (int r = 0; r < C; ++r) {
    RankState& x = st[r];
    AttentionShape local = s;
    local.T = static_cast<int>(x.qpos.size());
    x.out.assign(static_cast<size_t>(c.B) * local.T * s.out_row(), test::kNaN);
    x.lse.assign(static_cast<size_t>(c.B) * c.NH * local.T, test::kNaN);
    for (int step = 0; step < C; ++step) {
      const int blk = ((r - step) % C + C) % C;
      attention_block_forward(x.out.data(), x.lse.data(), x.qkv.data(), x.qpos.data(),
                              kv[blk].data(), ranks[blk].data(),
                              static_cast<int>(ranks[blk].size()), local, step == 0);
    }
    const VecF want_out = gather_rows(ref.out, c.B, c.T, s.out_row(), x.qpos, 0, s.out_row());
    const VecF want_lse = gather_lse(ref.lse, c.B, c.NH, c.T, x.qpos);
    EXPECT_LE(rel(x.out, want_out), 1e-6) << "out of rank " << r;
    double lse_err = 0;
    for (size_t i = 0; i < want_lse.size(); ++i)
      lse_err = std::max(lse_err, std::fabs(double(x.lse[i]) - want_lse[i]) /
                                      std::max(1.0, std::fabs(double(want_lse[i]))));
    EXPECT_LE(lse_err, 1e-6) << "lse of rank " << r;
  }

  // Backward: each block's dK/dV travels the ring and every rank adds its part (the first one
  // overwrites); dQ accumulates at its rank.
  std::vector<VecF> dkv(static_cast<size_t>(C), VecF(0));
  for (int b = 0; b < C; ++b) dkv[b].assign(kv[b].size(), test::kNaN);
  std::vector<bool> touched(static_cast<size_t>(C), false);
  for (int r = 0; r < C; ++r) {
    RankState& x = st[r];
    AttentionShape local = s;
    local.T = static_cast<int>(x.qpos.size());
    x.dqkv.assign(x.qkv.size(), 0.0f);
    for (int step = 0; step < C; ++step) {
      const int blk = ((r - step) % C + C) % C;
      attention_block_backward(x.dqkv.data(), dkv[blk].data(), x.dout.data(), x.qkv.data(),
                               x.qpos.data(), kv[blk].data(), ranks[blk].data(),
                               static_cast<int>(ranks[blk].size()), x.out.data(), x.lse.data(),
                               local, /*accumulate_dkv=*/touched[blk]);
      touched[blk] = true;
    }
    // The key/value columns of dqkv are not touched.
    const VecF kvcols = gather_rows(
        x.dqkv, c.B, local.T, R,
        [&] {
          Positions all(static_cast<size_t>(local.T));
          std::iota(all.begin(), all.end(), 0);
          return all;
        }(),
        kcol, kvw);
    EXPECT_EQ(max_abs(kvcols), 0.0) << "rank " << r << " wrote dqkv's key/value columns";
  }
  // dQ of every rank and dK/dV of every block against the reference's rows.
  VecF got_dq, want_dq, got_dkv, want_dkv;
  for (int r = 0; r < C; ++r) {
    Positions own(ranks[r].size());
    std::iota(own.begin(), own.end(), 0);
    const VecF g = gather_rows(st[r].dqkv, c.B, static_cast<int>(own.size()), R, own, 0, kcol);
    const VecF w = gather_rows(ref.dqkv, c.B, c.T, R, ranks[r], 0, kcol);
    got_dq.insert(got_dq.end(), g.begin(), g.end());
    want_dq.insert(want_dq.end(), w.begin(), w.end());
    const VecF wk = gather_rows(ref.dqkv, c.B, c.T, R, ranks[r], kcol, kvw);
    got_dkv.insert(got_dkv.end(), dkv[r].begin(), dkv[r].end());
    want_dkv.insert(want_dkv.end(), wk.begin(), wk.end());
  }
  EXPECT_LE(rel(got_dq, want_dq), 1e-5) << "dq";
  EXPECT_LE(rel(got_dkv, want_dkv), 1e-5) << "dk, dv";
}

// MHA and GQA (2 and 6 query heads per key/value head), causal and windows (a window narrower
// than a rank's chunk, so whole blocks fall outside it; one wider than the sequence); T not
// divisible by C or 2C, and T = 150 so a rank holds more than kAttentionBlockQ query rows.
constexpr Case kCases[] = {
    {2, 37, 3, 3, 8, 0},  {2, 37, 4, 2, 16, 0},   {1, 150, 6, 1, 8, 0}, {2, 37, 3, 3, 8, 5},
    {2, 41, 4, 2, 8, 13}, {1, 150, 4, 2, 16, 20}, {1, 29, 2, 1, 8, 64},
};

TEST(AttentionBlock, RingOverBlocksEqualsWholeSequenceAttention) {
  for (const Case& c : kCases) {
    for (int C : {2, 3, 4}) {
      for (Split split : {Split::kContiguous, Split::kLoadBalanced, Split::kRandom}) {
        check_ring(c, split_positions(c.T, C, split, 17 + C),
                   fmt::format("B={} T={} NH={} KVH={} HS={} window={}, C={} {}", c.B, c.T, c.NH,
                               c.KVH, c.HS, c.window, C, split_name(split)));
      }
    }
  }
}

// One rank holding the whole sequence, keys in one block: the block ops are attention_forward and
// attention_backward (dQ into the query columns, dK/dV into the kv block).
TEST(AttentionBlock, OneBlockIsTheWholeAttention) {
  const Case c{2, 70, 4, 2, 16, 0};
  std::vector<Positions> one(1);
  one[0].resize(70);
  std::iota(one[0].begin(), one[0].end(), 0);
  check_ring(c, one, "one block");
}

// Rows that see no key of a block: the first block gives out 0 and lse -inf, a later one leaves
// them bit for bit; with no keys at all (Tk = 0) likewise. A later visible block then takes over.
TEST(AttentionBlock, HiddenBlocksLeaveRowsAloneAndFirstBlocksClearThem) {
  const AttentionShape s{1, 3, 2, 1, 4, 0};
  const Positions qpos = {0, 1, 9};
  const VecF qkv = test::randn(3 * s.qkv_row(), 5);
  const Positions kpos = {5, 6};  // hidden from queries 0 and 1, visible to 9
  const VecF kv = test::randn(2 * 2 * 4, 6);
  VecF out(3 * s.out_row(), test::kNaN), lse(2 * 3, test::kNaN);
  attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(), kv.data(), kpos.data(),
                          2, s, /*first_block=*/true);
  constexpr float inf = std::numeric_limits<float>::infinity();
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(lse[h * 3 + 0], -inf);
    EXPECT_EQ(lse[h * 3 + 1], -inf);
    EXPECT_TRUE(std::isfinite(lse[h * 3 + 2]));
  }
  for (int i = 0; i < 2 * 8; ++i) EXPECT_EQ(out[i], 0.0f) << i;  // rows 0 and 1
  // A block hidden from every query, and an empty one: nothing changes.
  const VecF before_out = out, before_lse = lse;
  const Positions late = {10, 11};
  attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(), kv.data(), late.data(),
                          2, s, false);
  attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(), nullptr, nullptr, 0, s,
                          false);
  EXPECT_TRUE(test::bitwise_equal(out, before_out));
  EXPECT_TRUE(test::bitwise_equal(lse, before_lse));
  // An empty first block clears every row.
  attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(), nullptr, nullptr, 0, s,
                          true);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -inf);
  // Backward through rows whose final lse is -inf (they saw nothing): no gradient, no NaN.
  VecF dqkv(qkv.size(), 0.0f), dkv(kv.size(), test::kNaN);
  const VecF dout = test::randn(static_cast<int64_t>(out.size()), 7);
  attention_block_backward(dqkv.data(), dkv.data(), dout.data(), qkv.data(), qpos.data(), kv.data(),
                           kpos.data(), 2, out.data(), lse.data(), s, false);
  for (float x : dqkv) EXPECT_EQ(x, 0.0f);
  for (float x : dkv) EXPECT_EQ(x, 0.0f);
  EXPECT_THROW(attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(), kv.data(),
                                       kpos.data(), -1, s, true),
               Error);
}

// copy_2d packs the key/value columns of qkv rows into a kv block and back.
TEST(AttentionBlock, Copy2dPacksAndUnpacksKeyValueColumns) {
  auto backend = make_cpu_backend(DType::kF32);
  const AttentionShape s{2, 5, 4, 2, 3, 0};
  const int64_t R = s.qkv_row(), kvw = 2 * 2 * 3, rows = 2 * 5;
  const VecF qkv = test::randn(rows * R, 9);
  VecF kv(rows * kvw, test::kNaN);
  backend->copy_2d(kv.data(), kvw, qkv.data() + 4 * 3, R, rows, kvw);
  Positions all = {0, 1, 2, 3, 4};
  EXPECT_TRUE(test::bitwise_equal(kv, gather_rows(qkv, 2, 5, R, all, 12, kvw)));
  VecF back(rows * R, 1.0f);
  backend->copy_2d(back.data() + 12, R, kv.data(), kvw, rows, kvw);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < R; ++c)
      EXPECT_EQ(back[r * R + c], c < 12 ? 1.0f : qkv[r * R + c]) << r << "," << c;
  EXPECT_THROW(backend->copy_2d(kv.data(), 2, qkv.data(), R, rows, 3), Error);
}

}  // namespace
}  // namespace zerod::cpu
