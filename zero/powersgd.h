// PowerSGD gradient compression (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank
// Gradient Compression for Distributed Optimization", 2019; PyTorch's DDP hook
// torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py) for stage-0 data parallelism.
//
// Each 2-D+ tensor of the layout is a matrix M (n = shape[0], m = numel / n); one worth
// compressing ((n + m) r * min_compression_rate < n m, r = min(rank, n, m)) is replaced by a
// rank-r approximation of the mean over ranks, per step:
//   M += E                      error feedback (E: this rank's residual of the last step)
//   Q  = orthogonalise(Q)       warm start: last step's Q; else (and the first time) N(0, 1)
//   P  = M Q                    (n, r); all-reduce P (sum); P = orthogonalise(P)
//   Q  = M^T P                  (m, r); all-reduce Q (sum); Q /= world
//   A  = P Q^T                  (n, m), the approximate mean
//   E  = M - A;  M = world * A  (the reducer's result is a sum over ranks)
// orthogonalise: Gram-Schmidt on the columns, col /= |col| (+ orthogonalization_epsilon), later
// columns minus their projection on it (PyTorch's _orthogonalize_gram_schmidt). Vectors
// (biases, norms) and matrices not worth compressing are all-reduced as they are, packed into
// one buffer. Before start_iter steps every step is the plain all-reduce. Unlike PyTorch's hook,
// which keeps a residual for the whole bucket, E covers the compressed matrices only (the
// uncompressed tensors' residuals there are local deviations that sum to zero over ranks and
// never change the result).
//
// P and Q pass through host memory for the orthogonalisation ((n + m) r elements per matrix per
// step; the matmuls run on the backend: OpenBLAS on the CPU, cuBLAS on a GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "engine/config/job_config.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "zero/grad_compression.h"
#include "zero/partition.h"

namespace zerod {

// communication_compression {"type": "powersgd", ...}: PowerSGDState's arguments.
using PowerSgdOptions = PowerSgdConfig;

// The state a checkpoint keeps for an exact resume (this rank's: E differs between ranks).
struct PowerSgdState {
  int64_t iteration = 0;     // steps seen (plain and compressed)
  bool q_ready = false;      // q holds a warm-start Q
  std::vector<float> q;      // every compressed matrix's Q (m, r) row-major, back to back
  std::vector<float> error;  // every compressed matrix's E (n, m), back to back
};

// Gram-Schmidt on the columns of a (rows, cols) row-major matrix, in place (PyTorch's
// _orthogonalize_gram_schmidt; a zero column with epsilon 0 becomes zeros).
void orthogonalize_columns(float* a, int64_t rows, int cols, double epsilon);

class PowerSgd : public GradCompression {
 public:
  // A compressed tensor: M (rows, cols) at element `at` of the full buffer, rank r.
  struct Matrix {
    int64_t at = 0;
    int64_t rows = 0, cols = 0;
    int r = 0;
    int64_t p = 0, q = 0, e = 0;  // offsets into the P, Q and E buffers
    // Where its random Q is drawn in the generator's stream: the tensor's global unit (<< 32)
    // plus its offset in the unit, so a matrix draws the same Q whether its rank holds the whole
    // model or a pipeline stage of it.
    int64_t key = 0;
  };
  // `partition`: the world-1 partition the reducer's full buffer follows.
  PowerSgd(const ParamLayout& layout, const Partition& partition, Backend& backend,
           Communicator* comm, const PowerSgdOptions& options, MemoryTracker* tracker);

  bool begin_step() override;
  void reduce(void* full) override;

  PowerSgdState state() const;
  void set_state(const PowerSgdState& s);  // sizes must match this layout's
  // The state as the bytes of this rank's checkpoint file, and back (zero/powersgd_state.cc).
  // deserialize throws InputError naming `what` for a file of another world size, model, rank r
  // or use_error_feedback (the caller then restarts).
  std::string serialize() const;
  void deserialize(const std::string& bytes, const std::string& what);
  // A resume without this rank's state (another world size, a checkpoint from before it was
  // saved): `iteration` steps taken, zero residuals, a fresh Q drawn at the next compressed step.
  void restart_at(int64_t iteration);

  const std::vector<Matrix>& matrices() const { return mats_; }
  // Elements each rank all-reduces per compressed step (P, Q and the uncompressed tensors), and
  // what the plain all-reduce sends (every tensor's elements).
  int64_t compressed_elems() const { return p_elems_ + q_elems_ + plain_elems_; }
  int64_t uncompressed_elems() const { return all_elems_; }
  // The initial Q of a matrix (m, r) before orthogonalisation: N(0, 1) for (seed, iteration),
  // at element offset `offset` of the generator's stream (a Matrix's key; public for the tests'
  // reference).
  static void random_q(float* q, int64_t m, int r, uint64_t seed, int64_t iteration,
                       int64_t offset);

 private:
  struct Plain {
    int64_t at = 0, numel = 0, packed = 0;
  };
  char* el(void* base, int64_t elems) const {
    return static_cast<char*>(base) + elems * static_cast<int64_t>(esz_);
  }
  void to_host(const void* src, float* dst, int64_t n) const;
  void from_host(const float* src, void* dst, int64_t n);

  Backend& be_;
  Communicator* comm_;
  PowerSgdOptions opt_;
  size_t esz_;
  CommType ctype_;
  std::vector<Matrix> mats_;
  std::vector<Plain> plain_;
  int64_t p_elems_ = 0, q_elems_ = 0, e_elems_ = 0, plain_elems_ = 0, all_elems_ = 0;
  int64_t largest_ = 0;                      // the largest compressed matrix's elements
  Buffer p_, qt_, q_, e_, packed_, approx_;  // backend memory (compute dtype)
  std::vector<float> q_host_, p_host_;       // Q (m, r) per matrix (the warm start); P staging
  mutable std::vector<char> staging_;        // host bytes of a compute-dtype transfer
  int64_t iteration_ = 0;
  bool q_ready_ = false;
};

}  // namespace zerod
