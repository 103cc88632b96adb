// Muon under ZeRO (torch.optim.Muon's step for the hidden matrices, kernels/cpu/muon.h): each
// matrix is orthogonalised whole by one owner rank, while its elements' momentum and master
// weights stay with the shard that holds them.
//
// Which tensors: the 2-D tensors of the transformer blocks (GPT-2's c_attn, attn.c_proj, c_fc,
// mlp.c_proj; Llama's q/k/v/o_proj and gate/up/down_proj, each its own matrix), in zerod's
// storage shape (out, in) = torch.nn.Linear's (the lr adjustment reads it). The embeddings, the
// (tied or untied) head, the norms and the biases take the auxiliary AdamW, as Keller Jordan's
// recipe and DeepSpeed's use_muon tagging do.
//
// Owners: the matrices sorted by Newton-Schulz cost (largest first), each to the rank with the
// least cost so far (the lowest on a tie), so the work spreads over the ranks; every rank
// computes the same assignment from the layout.
//
// One step, on every rank of the data-parallel group (stages 1-3: world W):
//   1. each rank writes the Nesterov blend of its shard's pieces of every matrix into the local
//      buffer, laid out as W blocks of B floats, block o holding (in matrix order) the pieces of
//      the matrices rank o owns; B = the largest such count over every (rank, owner) pair;
//   2. all_to_all: block o goes to rank o, which then holds every piece of each of its matrices;
//   3. the owner assembles each matrix, runs Newton-Schulz in fp32 (sgemm), and writes the
//      result back over the pieces it received;
//   4. all_to_all back: each rank receives the orthogonalised values of exactly its pieces, in
//      the local buffer where it wrote the blend.
// Each element crosses the network twice (to the owner and back) and only when its owner is
// another rank: per rank about 2 x 4 x M (W - 1) / W^2 bytes for M matrix elements, the least any
// exchange moves (an all_gather of the matrices would move W/2 times more), plus the padding of
// blocks to B. At stage 0 (every rank holds every matrix whole) the owners orthogonalise their
// matrices in place and one all_gather shares the results (each rank receives the matrices it
// does not own, (W - 1) / W of them): measured faster than every rank orthogonalising every
// matrix (README, "Muon").
//
// Tensor parallelism (T ranks, each holding a slice of every split matrix: rows or columns,
// GPT-2's c_attn per q/k/v part). The T ranks of a tensor group hold slices of the same shapes,
// so their data-parallel owners agree: the T owners of a matrix's slices are the ranks of one
// tensor group. Between steps 3's assembly and Newton-Schulz, they orthogonalise the whole
// matrix once: each of their matrices has a tensor owner (the same greedy spread by cost over the
// T ranks), one all_to_all over the tensor group brings it every slice, it assembles the matrix
// in the global order (the single rank's element order, so the same bits as one rank computes),
// runs Newton-Schulz, and a second all_to_all returns each rank its slice. Each slice crosses the
// tensor group twice, (T - 1) / T of it off the rank. Replicated 2-D tensors are orthogonalised
// where they are, as without tensor parallelism.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/muon.h"
#include "model/layout.h"
#include "zero/partition.h"

namespace zerod {

// The Muon matrices of a layout: unit, element range of the unit's flat buffer, shape (this
// rank's: a tensor-parallel slice of the matrix when split is not kReplicated).
struct MuonMatrix {
  int unit = 0;
  int tensor = 0;  // its index among the unit's tensors
  int64_t begin = 0, rows = 0, cols = 0;
  int owner = 0;
  // Tensor parallelism (TensorInfo): how the slice is cut from the whole matrix, of
  // global_rows x global_cols (Newton-Schulz and the lr adjustment see the whole one).
  Split split = Split::kReplicated;
  int64_t global_rows = 0, global_cols = 0;
  int64_t end() const { return begin + rows * cols; }
};

// Elements [begin, end) of a unit's flat buffer on this rank, all of matrix `matrix`; `slot`: the
// piece's first element in the local buffer.
struct MuonPiece {
  int matrix = 0;
  int64_t begin = 0, end = 0, slot = 0;
};

// Which units an exchange serves: every unit, or (expert parallelism, where the experts units
// are partitioned and exchanged over their own expert-data-parallel group) the others or the
// experts units only.
enum class MuonUnits { kAll, kDense, kExperts };

// The hidden matrices of `layout` (the tensors Muon updates) in the units `which`, owners all 0.
std::vector<MuonMatrix> muon_matrices(const ParamLayout& layout, MuonUnits which = MuonUnits::kAll);

class MuonExchange {
 public:
  // partition: the optimizer partition (world 1 at stage 0); rank: this rank's shard in it;
  // comm: the data-parallel group (its size must match the partition's when that is above 1;
  // null or of size 1: no exchange). tensor: the tensor-parallel group when the layout's
  // matrices are slices (null or of size 1: none); see "Tensor parallelism" above. which: the
  // units served; for kExperts, world is their partition's (the expert-data-parallel group's
  // size at stages 1-3, 1 at stage 0), comm that group and rank this rank's index in it.
  MuonExchange(const ParamLayout& layout, const Partition& partition, int rank, Communicator* comm,
               Communicator* tensor = nullptr, MuonUnits which = MuonUnits::kAll, int world = 0);

  const std::vector<MuonMatrix>& matrices() const { return matrices_; }
  // This rank's pieces of unit u, by begin.
  const std::vector<MuonPiece>& pieces(int u) const { return pieces_.at(static_cast<size_t>(u)); }
  // Units [first_unit(), last_unit()] hold every matrix (first > last when there is none).
  int first_unit() const { return first_unit_; }
  int last_unit() const { return last_unit_; }
  // The local buffer (world x block floats): the blend before orthogonalise(), the
  // orthogonalised update of the same elements after.
  float* local() { return local_.data(); }
  // Steps 2-4 (collective over comm when the world is above 1).
  void orthogonalise(const cpu::MuonNs& ns);
  // A host buffer of at least n floats (the gradients of a piece on a GPU).
  float* scratch(int64_t n);

  int64_t block_floats() const { return block_; }

 private:
  struct Received {              // a piece of one of this rank's matrices in the received buffer
    int64_t at = 0;              // offset in recv_
    int64_t begin = 0, end = 0;  // elements of the unit
  };
  std::vector<MuonMatrix> matrices_;
  std::vector<std::vector<MuonPiece>> pieces_;   // per unit
  std::vector<std::vector<Received>> received_;  // per matrix this rank owns (else empty)
  // Stage 0 (a partition of one, a group of several): the results of each rank's matrices are
  // all-gathered (share_replicated).
  void share_replicated();
  void newton_schulz(float* x, int64_t rows, int64_t cols, const cpu::MuonNs& ns);
  // Tensor parallelism: the owners and block offsets of the split matrices; the exchange over
  // the tensor group (the slices in tsend_ before and after); a whole matrix from its T slices
  // (slices[t]: rank t's) or, to_whole false, the slices from it.
  void setup_tensor(Communicator* tensor);
  void orthogonalise_split(const cpu::MuonNs& ns);
  void gather_whole(size_t i, const std::vector<float*>& slices, float* whole, bool to_whole) const;
  std::vector<TensorInfo> tensors_;  // per matrix, its tensor (the split)
  int world_, rank_;  // of the partition
  Communicator* tensor_ = nullptr;  // null: no tensor parallelism
  int tp_ = 1, tp_rank_ = 0;
  // Per matrix: its tensor owner, and its slice's offset in that owner's block (tensor_block_
  // floats a block, the same on every rank of the group); -1: not exchanged.
  std::vector<int> tp_owner_;
  std::vector<int64_t> tp_at_;
  int64_t tensor_block_ = 0;
  std::vector<float> tsend_, trecv_, whole_;
  Communicator* comm_;
  int group_, me_;  // the communicator's size and rank (owners are spread over them)
  int first_unit_ = 0, last_unit_ = -1;
  int64_t block_ = 0;
  std::vector<float> local_, recv_, matrix_, work_, scratch_;
  // Stage 0: per owner, the elements of its matrices; per matrix, its offset in its owner's block
  // of gathered_ (group x gather_block_ floats).
  std::vector<int64_t> replicated_, gathered_at_;
  int64_t gather_block_ = 0;
  std::vector<float> gathered_;
};

}  // namespace zerod
