// Counter-based random numbers (Philox4x32-10). A value is a pure function of (seed, stream,
// index), so a tensor can be initialised in any order, in pieces, on any rank, and come out the
// same; a sequential generator is just (seed, stream, counter), which makes its state trivial
// to save and restore.
#pragma once

#include <array>
#include <cstdint>

namespace zerod {

// One Philox4x32-10 block: 4 random 32-bit words for a 128-bit counter under a 64-bit key.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// out[i] = mean + stddev * N(0,1) drawn for element (offset + i) of stream `stream` of `seed`.
void fill_normal(float* out, int64_t n, float mean, float stddev, uint64_t seed, uint64_t stream,
                 int64_t offset = 0);

// A sequential generator over Philox; its whole state is (seed, stream, counter).
class Rng {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t stream = 0;
    uint64_t counter = 0;
  };

  explicit Rng(uint64_t seed = 0, uint64_t stream = 0) : state_{seed, stream, 0} {}
  explicit Rng(State s) : state_(s) {}

  uint64_t next_u64();
  // Uniform in [0, bound) without modulo bias; bound > 0.
  uint64_t uniform(uint64_t bound);
  // Uniform in [0, 1).
  double uniform01() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  State state() const { return state_; }
  void set_state(State s) { state_ = s; }

 private:
  State state_;
};

}  // namespace zerod
