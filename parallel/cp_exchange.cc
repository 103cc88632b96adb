#include "parallel/cp_exchange.h"

#include <utility>

#include "core/error.h"
#include "model/op_timing.h"
#include "model/shard.h"

namespace zerod {

const char* context_impl_name(ContextImpl impl) {
  return impl == ContextImpl::kRing ? "ring" : "ulysses";
}

ContextImpl parse_context_impl(const std::string& name) {
  if (name == "ulysses") return ContextImpl::kUlysses;
  if (name == "ring") return ContextImpl::kRing;
  ZD_THROW_INPUT("context_impl \"{}\": \"ulysses\" or \"ring\"", name);
}

std::string ulysses_problem(int n_head, int n_kv_head, int C) {
  if (C <= 1 || (n_head % C == 0 && n_kv_head % C == 0)) return "";
  return fmt::format(
      "Ulysses context parallelism over {} ranks moves whole heads: {} does not divide the {} "
      "attention heads{} of a tensor rank (use context_impl \"ring\", which works for any head "
      "count)",
      C, C, n_head,
      n_kv_head != n_head ? fmt::format(" and {} key/value heads", n_kv_head) : std::string());
}

ContextParallelExchange::ContextParallelExchange(Communicator& context_group, Backend& backend,
                                                 ContextImpl impl, Exchange* tensor,
                                                 MemoryTracker* tracker)
    : comm_(context_group),
      be_(backend),
      impl_(impl),
      tensor_(tensor != nullptr ? tensor : &identity_),
      tracker_(tracker),
      type_(backend.compute_elem_size() == 4         ? CommType::kF32
            : backend.compute_dtype() == DType::kF16 ? CommType::kF16
                                                     : CommType::kBF16),
      esz_(backend.compute_elem_size()) {
  ZD_CHECK(tensor_->context_size() == 1, "the tensor group's exchange splits sequences itself");
}

void ContextParallelExchange::prepare(const AttentionShape& s) {
  const int C = comm_.size();
  if (impl_ == ContextImpl::kUlysses) {
    const std::string problem = ulysses_problem(s.NH, s.KVH, C);
    if (!problem.empty()) throw InputError(problem);
  }
  if (s.B != B_ || s.T != T_) {
    B_ = s.B;
    T_ = s.T;
    seq_ = s.T * C;
    host_positions_.clear();
    for (int r = 0; r < C; ++r) {
      const std::vector<int32_t> p = context_positions(seq_, ContextShard{r, C});
      host_positions_.insert(host_positions_.end(), p.begin(), p.end());
    }
    const size_t bytes = host_positions_.size() * sizeof(int32_t);
    positions_buffer_ = be_.allocate(bytes, MemCategory::kActivations, tracker_);
    positions_ = static_cast<int32_t*>(positions_buffer_.data());
    be_.copy(positions_, host_positions_.data(), bytes);
  }
  // Ulysses: [0] send, [1] receive (B T_ qkv_row each), [2] q, k, v of this rank's heads in
  // position order (the same size), [3] their output, [4] its gradient (B T_ out_row each),
  // [5] the gradient of [2]. Ring: [0], [1] a key/value block and its gradient (2 B T_ 2 KVH HS
  // each), sent and received in turn.
  const int64_t rows = int64_t{s.B} * s.T;
  std::vector<int64_t> elems;
  if (impl_ == ContextImpl::kUlysses) {
    elems = {rows * s.qkv_row(), rows * s.qkv_row(), rows * s.qkv_row(),
             rows * s.out_row(), rows * s.out_row(), rows * s.qkv_row()};
  } else {
    const int64_t block = rows * 2 * s.KVH * s.HS;
    elems = {2 * block, 2 * block};
  }
  int64_t total = 0;
  for (int64_t e : elems) total += e;
  if (total <= prepared_elems_ && work_.size() == elems.size()) {
    bool fits = true;
    for (size_t i = 0; i < elems.size(); ++i)
      fits &= static_cast<int64_t>(work_[i].bytes()) >= elems[i] * static_cast<int64_t>(esz_);
    if (fits) return;
  }
  work_.clear();
  for (int64_t e : elems)
    work_.push_back(
        be_.allocate(static_cast<size_t>(e) * esz_, MemCategory::kActivations, tracker_));
  prepared_elems_ = total;
}

// ---- Ulysses ----------------------------------------------------------------------------------

void ContextParallelExchange::scatter_heads(const void* rows, int64_t row_width,
                                            const std::vector<Section>& sections, void* send) {
  const int C = comm_.size();
  const int64_t n = int64_t{B_} * T_;
  int64_t wc = 0;  // the columns of one rank's heads
  for (const Section& k : sections) wc += k.width / C;
  for (int c = 0; c < C; ++c) {
    int64_t col = 0;
    for (const Section& k : sections) {
      const int64_t w = k.width / C;
      be_.copy_2d(elem_at(send, c * n * wc + col, esz_), wc, elem_at(rows, k.offset + c * w, esz_),
                  row_width, n, w);
      col += w;
    }
  }
}

void ContextParallelExchange::gather_heads(const void* recv, int64_t row_width,
                                           const std::vector<Section>& sections, void* rows) {
  const int C = comm_.size();
  const int64_t n = int64_t{B_} * T_;
  int64_t wc = 0;
  for (const Section& k : sections) wc += k.width / C;
  for (int c = 0; c < C; ++c) {
    int64_t col = 0;
    for (const Section& k : sections) {
      const int64_t w = k.width / C;
      be_.copy_2d(elem_at(rows, k.offset + c * w, esz_), row_width,
                  elem_at(recv, c * n * wc + col, esz_), wc, n, w);
      col += w;
    }
  }
}

// Calls fn(packed, global, len) for each run of consecutive global positions: rows
// [packed, packed + len) of the rank-major packing [rank s][B][T_ rows of s] are rows
// [global, global + len) of (B, seq) in global position order.
void ContextParallelExchange::for_each_position_run(
    const std::function<void(int64_t packed, int64_t global, int64_t len)>& fn) const {
  const int C = comm_.size();
  for (int s = 0; s < C; ++s) {
    const int32_t* pos = host_positions_.data() + int64_t{s} * T_;
    for (int b = 0; b < B_; ++b) {
      for (int i = 0; i < T_;) {
        int len = 1;
        while (i + len < T_ && pos[i + len] == pos[i] + len) ++len;
        fn((int64_t{s} * B_ + b) * T_ + i, int64_t{b} * seq_ + pos[i], len);
        i += len;
      }
    }
  }
}

// recv [rank s][B][T_ rows of s][width] -> seqs (B, seq, width), row = global position.
void ContextParallelExchange::to_global_order(const void* recv, int64_t width, void* seqs) {
  for_each_position_run([&](int64_t packed, int64_t global, int64_t len) {
    be_.copy(elem_at(seqs, global * width, esz_), elem_at(recv, packed * width, esz_),
             static_cast<size_t>(len * width) * esz_);
  });
}

void ContextParallelExchange::from_global_order(const void* seqs, int64_t width, void* send) {
  for_each_position_run([&](int64_t packed, int64_t global, int64_t len) {
    be_.copy(elem_at(send, packed * width, esz_), elem_at(seqs, global * width, esz_),
             static_cast<size_t>(len * width) * esz_);
  });
}

void ContextParallelExchange::heads_forward(const void* rows, int64_t row_width,
                                            const std::vector<Section>& sections, void* seqs) {
  int64_t wc = 0;
  for (const Section& k : sections) wc += k.width / comm_.size();
  scatter_heads(rows, row_width, sections, ws(0));
  comm_.all_to_all(ws(0), ws(1), int64_t{B_} * T_ * wc, type_);
  to_global_order(ws(1), wc, seqs);
}

void ContextParallelExchange::heads_backward(const void* seqs, int64_t row_width,
                                             const std::vector<Section>& sections, void* rows) {
  int64_t wc = 0;
  for (const Section& k : sections) wc += k.width / comm_.size();
  from_global_order(seqs, wc, ws(0));
  comm_.all_to_all(ws(0), ws(1), int64_t{B_} * T_ * wc, type_);
  gather_heads(ws(1), row_width, sections, rows);
}

namespace {

AttentionShape heads_shape(const AttentionShape& s, int C) {
  AttentionShape h = s;
  h.T = s.T * C;
  h.NH = s.NH / C;
  h.KVH = s.KVH / C;
  return h;
}

}  // namespace

void ContextParallelExchange::ulysses_forward(void* out, float* stats, const void* qkv,
                                              const AttentionShape& s) {
  const int C = comm_.size();
  const int64_t q = int64_t{s.NH} * s.HS, kv = int64_t{s.KVH} * s.HS;
  const std::vector<Section> qkv_sections = {{0, q}, {q, kv}, {q + kv, kv}};
  const std::vector<Section> out_sections = {{0, q}};
  heads_forward(qkv, s.qkv_row(), qkv_sections, ws(2));
  be_.attention_forward(ws(3), stats, ws(2), heads_shape(s, C));
  heads_backward(ws(3), s.out_row(), out_sections, out);
}

void ContextParallelExchange::ulysses_backward(void* dqkv, const void* dout, const void* qkv,
                                               const void* out, const float* stats,
                                               const AttentionShape& s) {
  const int C = comm_.size();
  const int64_t q = int64_t{s.NH} * s.HS, kv = int64_t{s.KVH} * s.HS;
  const std::vector<Section> qkv_sections = {{0, q}, {q, kv}, {q + kv, kv}};
  const std::vector<Section> out_sections = {{0, q}};
  // The forward's inputs and output again (the model keeps only its rows), then dout.
  heads_forward(qkv, s.qkv_row(), qkv_sections, ws(2));
  heads_forward(out, s.out_row(), out_sections, ws(3));
  heads_forward(dout, s.out_row(), out_sections, ws(4));
  be_.attention_backward(ws(5), ws(4), ws(2), ws(3), stats, heads_shape(s, C));
  heads_backward(ws(5), s.qkv_row(), qkv_sections, dqkv);
}

// ---- ring ------------------------------------------------------------------------------------

void ContextParallelExchange::ring_forward(void* out, float* stats, const void* qkv,
                                           const AttentionShape& s) {
  const int C = comm_.size(), r = comm_.rank();
  const int next = (r + 1) % C, prev = (r + C - 1) % C;
  const int64_t rows = int64_t{s.B} * s.T, kvw = int64_t{2} * s.KVH * s.HS;
  void* cur = ws(0);
  void* nxt = ws(1);
  // This rank's block: the key and value columns of its rows.
  be_.copy_2d(cur, kvw, elem_at(qkv, int64_t{s.NH} * s.HS, esz_), s.qkv_row(), rows, kvw);
  for (int i = 0; i < C; ++i) {
    const int holder = (r + C - i) % C;  // whose rows the block in `cur` is
    // The next block moves while this one is attended to.
    WorkPtr moving;
    if (i + 1 < C) moving = comm_.send_recv_async(cur, next, nxt, prev, rows * kvw, type_);
    be_.attention_block_forward(out, stats, qkv, positions_of(r), cur, positions_of(holder), s.T, s,
                                i == 0);
    if (moving) moving->wait();
    std::swap(cur, nxt);
  }
}

void ContextParallelExchange::ring_backward(void* dqkv, const void* dout, const void* qkv,
                                            const void* out, const float* stats,
                                            const AttentionShape& s) {
  const int C = comm_.size(), r = comm_.rank();
  const int next = (r + 1) % C, prev = (r + C - 1) % C;
  const int64_t rows = int64_t{s.B} * s.T, kvw = int64_t{2} * s.KVH * s.HS, n = rows * kvw;
  // Each buffer: a key/value block, then the gradient of that block (dK, dV) accumulated by the
  // ranks it has visited.
  void* cur = ws(0);
  void* nxt = ws(1);
  const int64_t q = int64_t{s.NH} * s.HS;
  be_.copy_2d(cur, kvw, elem_at(qkv, q, esz_), s.qkv_row(), rows, kvw);
  be_.memset_zero(dqkv, static_cast<size_t>(rows * s.qkv_row()) * esz_);
  for (int i = 0; i < C; ++i) {
    const int holder = (r + C - i) % C;
    WorkPtr moving;
    if (i + 1 < C) moving = comm_.send_recv_async(cur, next, nxt, prev, n, type_);
    be_.attention_block_backward(dqkv, elem_at(cur, n, esz_), dout, qkv, positions_of(r), cur,
                                 positions_of(holder), s.T, out, stats, s, i > 0);
    if (moving) moving->wait();
    // The gradient block follows its block (after the last step: home, to the rank after this
    // one, whose block it is; this rank receives its own).
    comm_.send_recv(elem_at(cur, n, esz_), next, elem_at(nxt, n, esz_), prev, n, type_);
    std::swap(cur, nxt);
  }
  be_.copy_2d(elem_at(dqkv, q, esz_), s.qkv_row(), elem_at(cur, n, esz_), kvw, rows, kvw);
}

// ---- the seam ---------------------------------------------------------------------------------

void ContextParallelExchange::attention_forward(void* out, float* stats, const void* qkv,
                                                const AttentionShape& s) {
  prepare(s);
  if (impl_ == ContextImpl::kUlysses) {
    ulysses_forward(out, stats, qkv, s);
  } else {
    ring_forward(out, stats, qkv, s);
  }
}

void ContextParallelExchange::attention_backward(void* dqkv, const void* dout, const void* qkv,
                                                 const void* out, const float* stats,
                                                 const AttentionShape& s) {
  prepare(s);
  if (impl_ == ContextImpl::kUlysses) {
    ulysses_backward(dqkv, dout, qkv, out, stats, s);
  } else {
    ring_backward(dqkv, dout, qkv, out, stats, s);
  }
}

double ContextParallelExchange::context_sum(double x) {
  context_sum(&x, 1);
  return x;
}

void ContextParallelExchange::context_sum(double* x, int64_t n) {
  // (Host memory: the context group's communicator is Gloo's on CPU ranks.)
  comm_.all_reduce(x, n, CommType::kF64, ReduceOp::kSum);
}

}  // namespace zerod
