#include "zero/muon_exchange.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/shard.h"

namespace zerod {

std::vector<MuonMatrix> muon_matrices(const ParamLayout& layout, MuonUnits which) {
  std::vector<MuonMatrix> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    if (u == layout.embedding_unit() || u == layout.final_unit()) continue;  // embeddings, head
    if (which != MuonUnits::kAll && layout.unit(u).experts != (which == MuonUnits::kExperts))
      continue;
    const std::vector<TensorInfo>& tensors = layout.unit(u).tensors;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = tensors[i];
      if (t.shape.size() != 2) continue;  // norms, biases
      MuonMatrix m{.unit = u,
                   .tensor = static_cast<int>(i),
                   .begin = t.offset,
                   .rows = t.shape[0],
                   .cols = t.shape[1]};
      if (t.split == Split::kRows || t.split == Split::kColumns) {
        ZD_CHECK(t.global_shape.size() == 2, "{}: a split matrix without its global shape", t.name);
        m.split = t.split;
      }
      m.global_rows = m.split == Split::kReplicated ? m.rows : t.global_shape[0];
      m.global_cols = m.split == Split::kReplicated ? m.cols : t.global_shape[1];
      out.push_back(m);
    }
  }
  return out;
}

MuonExchange::MuonExchange(const ParamLayout& layout, const Partition& partition, int rank,
                           Communicator* comm, Communicator* tensor, MuonUnits which, int world)
    : matrices_(muon_matrices(layout, which)),
      pieces_(static_cast<size_t>(layout.num_units())),
      received_(matrices_.size()),
      world_(world > 0 ? world : partition.world_size()),
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
  for (const MuonMatrix& m : matrices_)
    tensors_.push_back(layout.unit(m.unit).tensors[static_cast<size_t>(m.tensor)]);
  setup_tensor(tensor);
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
  // Matrix i's pieces (of the slice at `slice`) back where they were received.
  auto put_back = [&](size_t i, const float* slice) {
    for (const Received& p : received_[i]) {
      const float* from = slice + (p.begin - matrices_[i].begin);
      std::copy(from, from + (p.end - p.begin), in + p.at);
    }
  };
  // This rank's matrices (its slices of them), assembled from the pieces: in matrix_ one at a
  // time, or for the tensor exchange in its send buffer, all at once.
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (received_[i].empty()) continue;
    const MuonMatrix& m = matrices_[i];
    float* slice = matrix_.data();
    if (tp_owner_[i] >= 0) {
      slice = tsend_.data() + tp_owner_[i] * tensor_block_ + tp_at_[i];
    } else if (static_cast<int64_t>(matrix_.size()) < m.rows * m.cols) {
      matrix_.resize(static_cast<size_t>(m.rows * m.cols));
      slice = matrix_.data();
    }
    for (const Received& p : received_[i])
      std::copy(in + p.at, in + p.at + (p.end - p.begin), slice + (p.begin - m.begin));
    if (tp_owner_[i] >= 0) continue;
    newton_schulz(slice, m.rows, m.cols, ns);
    put_back(i, slice);
  }
  if (tensor_block_ > 0) {
    orthogonalise_split(ns);
    for (size_t i = 0; i < matrices_.size(); ++i)
      if (!received_[i].empty() && tp_owner_[i] >= 0)
        put_back(i, tsend_.data() + tp_owner_[i] * tensor_block_ + tp_at_[i]);
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

void MuonExchange::newton_schulz(float* x, int64_t rows, int64_t cols, const cpu::MuonNs& ns) {
  const int64_t w = cpu::muon_ns_work_floats(rows, cols);
  if (static_cast<int64_t>(work_.size()) < w) work_.resize(static_cast<size_t>(w));
  cpu::newton_schulz(x, rows, cols, ns, work_.data());
}

// The tensor group: the split matrices this rank owns, each to a tensor owner (greedy by the
// whole matrix's cost; the group's ranks own the same matrices, so they agree), their slices at
// tp_at_ in the owner's block.
void MuonExchange::setup_tensor(Communicator* tensor) {
  tp_owner_.assign(matrices_.size(), -1);
  tp_at_.assign(matrices_.size(), 0);
  if (tensor == nullptr || tensor->size() == 1) return;
  tensor_ = tensor;
  tp_ = tensor->size();
  tp_rank_ = tensor->rank();
  std::vector<size_t> order;
  for (size_t i = 0; i < matrices_.size(); ++i)
    if (!received_[i].empty() && matrices_[i].split != Split::kReplicated) order.push_back(i);
  auto cost = [&](size_t i) {
    return cpu::muon_ns_flops(matrices_[i].global_rows, matrices_[i].global_cols, 5);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost(a) > cost(b); });
  std::vector<double> load(static_cast<size_t>(tp_), 0.0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    tp_owner_[i] = static_cast<int>(least - load.begin());
    *least += cost(i);
  }
  std::vector<int64_t> used(static_cast<size_t>(tp_), 0);
  for (size_t i = 0; i < matrices_.size(); ++i) {  // matrix order within each block
    if (tp_owner_[i] < 0) continue;
    int64_t& u = used[static_cast<size_t>(tp_owner_[i])];
    tp_at_[i] = u;
    u += matrices_[i].rows * matrices_[i].cols;
  }
  tensor_block_ = *std::max_element(used.begin(), used.end());
  tsend_.assign(static_cast<size_t>(tp_ * tensor_block_), 0.0f);
  trecv_.assign(tsend_.size(), 0.0f);
}

// Every slice to its matrix's tensor owner, which orthogonalises the whole matrix; each rank's
// slices back where they were sent from (tsend_).
void MuonExchange::orthogonalise_split(const cpu::MuonNs& ns) {
  tensor_->all_to_all(tsend_.data(), trecv_.data(), tensor_block_, CommType::kF32);
  std::vector<float*> slices(static_cast<size_t>(tp_));
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (tp_owner_[i] != tp_rank_) continue;
    const MuonMatrix& m = matrices_[i];
    for (int t = 0; t < tp_; ++t)
      slices[static_cast<size_t>(t)] = trecv_.data() + t * tensor_block_ + tp_at_[i];
    const int64_t n = m.global_rows * m.global_cols;
    if (static_cast<int64_t>(whole_.size()) < n) whole_.resize(static_cast<size_t>(n));
    gather_whole(i, slices, whole_.data(), /*to_whole=*/true);
    newton_schulz(whole_.data(), m.global_rows, m.global_cols, ns);
    gather_whole(i, slices, whole_.data(), /*to_whole=*/false);
  }
  tensor_->all_to_all(trecv_.data(), tsend_.data(), tensor_block_, CommType::kF32);
}

// The whole matrix (global_rows x global_cols, row-major) from the T slices, each at its place
// in the single rank's element order (model/shard.h's runs), or (to_whole false) the slices from
// it.
void MuonExchange::gather_whole(size_t i, const std::vector<float*>& slices, float* whole,
                                bool to_whole) const {
  for (int t = 0; t < tp_; ++t) {
    TensorShard shard;
    shard.rank = t;
    shard.size = tp_;
    float* slice = slices[static_cast<size_t>(t)];
    for_each_run(tensors_[i], shard, [&](int64_t local, int64_t global, int64_t n) {
      if (to_whole) {
        std::copy(slice + local, slice + local + n, whole + global);
      } else {
        std::copy(whole + global, whole + global + n, slice + local);
      }
    });
  }
}

}  // namespace zerod
