#include "zero/muon_exchange.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace zerod {

std::vector<MuonMatrix> muon_matrices(const ParamLayout& layout) {
  std::vector<MuonMatrix> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    if (u == layout.embedding_unit() || u == layout.final_unit()) continue;  // embeddings, head
    for (const TensorInfo& t : layout.unit(u).tensors) {
      if (t.shape.size() != 2) continue;  // norms, biases
      out.push_back({u, t.offset, t.shape[0], t.shape[1], 0});
    }
  }
  return out;
}

MuonExchange::MuonExchange(const ParamLayout& layout, const Partition& partition, int rank,
                           Communicator* comm)
    : matrices_(muon_matrices(layout)),
      pieces_(static_cast<size_t>(layout.num_units())),
      received_(matrices_.size()),
      world_(partition.world_size()),
      rank_(rank),
      comm_(comm),
      group_(comm != nullptr ? comm->size() : 1),
      me_(comm != nullptr ? comm->rank() : 0) {
  ZD_CHECK(world_ == 1 || (comm_ != nullptr && group_ == world_),
           "Muon exchange over a partition of {} ranks needs their communicator", world_);
  // Owners: largest Newton-Schulz cost first, each to the least-loaded rank.
  std::vector<size_t> order(matrices_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto cost = [&](size_t i) { return cpu::muon_ns_flops(matrices_[i].rows, matrices_[i].cols, 5); };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost(a) > cost(b); });
  std::vector<double> load(static_cast<size_t>(group_), 0.0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    matrices_[i].owner = static_cast<int>(least - load.begin());
    *least += cost(i);
  }
  // count[r][o]: elements rank r holds of the matrices rank o owns; the pieces in matrix order.
  auto piece_on = [&](const MuonMatrix& m, int r, int64_t* a, int64_t* b) {
    const UnitPartition& up = partition.unit(m.unit);
    *a = std::max(m.begin, up.begin(r));
    *b = std::min(m.end(), up.begin(r) + up.shard);
    return *a < *b;
  };
  std::vector<std::vector<int64_t>> count(static_cast<size_t>(world_),
                                          std::vector<int64_t>(static_cast<size_t>(world_), 0));
  // The block of the local buffer a matrix's pieces go to: its owner's (replicated: the one).
  auto block_of = [&](const MuonMatrix& m) { return world_ == 1 ? 0 : m.owner; };
  std::vector<std::vector<int64_t>> slot_of(matrices_.size());  // per matrix, per rank
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const MuonMatrix& m = matrices_[i];
    slot_of[i].assign(static_cast<size_t>(world_), -1);
    for (int r = 0; r < world_; ++r) {
      int64_t a = 0, b = 0;
      if (!piece_on(m, r, &a, &b)) continue;
      int64_t& c = count[static_cast<size_t>(r)][static_cast<size_t>(block_of(m))];
      slot_of[i][static_cast<size_t>(r)] = c;  // within block `owner` of rank r
      c += b - a;
    }
  }
  for (const auto& row : count)
    for (int64_t c : row) block_ = std::max(block_, c);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const MuonMatrix& m = matrices_[i];
    int64_t a = 0, b = 0;
    if (piece_on(m, rank_, &a, &b)) {
      const int64_t slot = static_cast<int64_t>(block_of(m)) * block_ + slot_of[i][rank_];
      pieces_[static_cast<size_t>(m.unit)].push_back({static_cast<int>(i), a, b, slot});
    }
    if (world_ == 1) {  // every matrix whole here, at slot_of[i][0]
      const int64_t o = static_cast<int64_t>(m.owner);
      if (replicated_.empty()) replicated_.assign(static_cast<size_t>(group_), 0);
      gathered_at_.push_back(replicated_[static_cast<size_t>(o)]);
      replicated_[static_cast<size_t>(o)] += m.rows * m.cols;
    }
    if (m.owner != (world_ == 1 ? me_ : rank_)) continue;
    for (int r = 0; r < world_; ++r) {
      if (!piece_on(m, r, &a, &b)) continue;
      const int64_t at = world_ == 1 ? slot_of[i][0] : r * block_ + slot_of[i][r];
      received_[i].push_back({at, a, b});
    }
  }
  if (!matrices_.empty()) {
    first_unit_ = matrices_.front().unit;
    last_unit_ = matrices_.back().unit;
  }
  local_.assign(static_cast<size_t>(world_ * block_), 0.0f);
  if (world_ > 1) recv_.assign(local_.size(), 0.0f);
  for (int64_t n : replicated_) gather_block_ = std::max(gather_block_, n);
  if (world_ == 1 && group_ > 1) {
    gathered_.assign(static_cast<size_t>(group_ * gather_block_), 0.0f);
  }
}

float* MuonExchange::scratch(int64_t n) {
  if (static_cast<int64_t>(scratch_.size()) < n) scratch_.resize(static_cast<size_t>(n));
  return scratch_.data();
}

void MuonExchange::orthogonalise(const cpu::MuonNs& ns) {
  // World 1: the local buffer is the one "received".
  float* in = local_.data();
  if (world_ > 1) {
    comm_->all_to_all(local_.data(), recv_.data(), block_, CommType::kF32);
    in = recv_.data();
  }
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (received_[i].empty()) continue;
    const MuonMatrix& m = matrices_[i];
    const int64_t n = m.rows * m.cols;
    if (static_cast<int64_t>(matrix_.size()) < n) matrix_.resize(static_cast<size_t>(n));
    const int64_t w = cpu::muon_ns_work_floats(m.rows, m.cols);
    if (static_cast<int64_t>(work_.size()) < w) work_.resize(static_cast<size_t>(w));
    for (const Received& p : received_[i])
      std::copy(in + p.at, in + p.at + (p.end - p.begin), matrix_.data() + (p.begin - m.begin));
    cpu::newton_schulz(matrix_.data(), m.rows, m.cols, ns, work_.data());
    for (const Received& p : received_[i]) {
      const float* from = matrix_.data() + (p.begin - m.begin);
      std::copy(from, from + (p.end - p.begin), in + p.at);
    }
  }
  if (world_ > 1) comm_->all_to_all(recv_.data(), local_.data(), block_, CommType::kF32);
  if (world_ == 1 && group_ > 1) share_replicated();
}

// Stage 0: each rank orthogonalised its own matrices in place; one all_gather of every rank's
// results (matrix order, padded to the largest) and each copies the others' into place.
void MuonExchange::share_replicated() {
  float* mine = gathered_.data() + static_cast<int64_t>(me_) * gather_block_;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (matrices_[i].owner != me_) continue;
    const int64_t n = matrices_[i].rows * matrices_[i].cols, at = received_[i].front().at;
    std::copy(local_.data() + at, local_.data() + at + n, mine + gathered_at_[i]);
  }
  comm_->all_gather(mine, gathered_.data(), gather_block_, CommType::kF32);
  for (int u = 0; u < static_cast<int>(pieces_.size()); ++u) {
    for (const MuonPiece& p : pieces_[static_cast<size_t>(u)]) {
      const MuonMatrix& m = matrices_[static_cast<size_t>(p.matrix)];
      if (m.owner == me_) continue;
      const float* from = gathered_.data() + static_cast<int64_t>(m.owner) * gather_block_ +
                          gathered_at_[static_cast<size_t>(p.matrix)];
      std::copy(from, from + (p.end - p.begin), local_.data() + p.slot);
    }
  }
}

}  // namespace zerod
