// The 1-bit compressed all-reduce of DeepSpeed's 1-bit Adam / 0/1 Adam / 1-bit LAMB
// (deepspeed/runtime/comm/nccl.py, compressed_allreduce), built from two collectives of any
// Communicator: the average over ranks of a float tensor, sent as sign bits plus one scale, with
// error feedback on both sides so that the compression errors are not lost but carried into the
// next call.
//
// A tensor x of n elements, on `world` ranks:
//   pad     x to P = padded_elems(n, world) elements (zeros), a multiple of world * lcm(world, 8),
//           so each of the world chunks of C = P / world elements packs into whole bytes;
//   worker  y = x + worker_error; s = ||y|| / sqrt(P); worker_error = y - s * sign(y);
//           (sign(v) = +1 for v >= 0 and -0, -1 below: DeepSpeed's sign().add_(1).bool())
//   phase 1 all_to_all: chunk r of the signs, with s, goes to rank r (its server);
//   server  z = sum over ranks q of sign_q * (s_q * (1 / world)) + server_error (rank order);
//           t = ||z|| / sqrt(C); server_error = z - t * sign(z);
//   phase 2 all_gather: every server's chunk signs and t;
//   result  x[chunk r] = sign_r * t_r (the first n elements).
// One worker scale per tensor and one server scale per chunk, as DeepSpeed. The bytes moved per
// rank are about P/8 through the all-to-all and P/8 through the all-gather (32x fewer than the P
// floats of an all-reduce; 16x by NCCL's size convention, which counts an all-reduce once).
//
// Buffers are host memory (the Gloo communicator; a GPU's momentum goes through a host copy).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace zerod {

// The sign bits of y (n elements, n a multiple of 8): bit 7 - (i % 8) of byte i / 8 is set where
// y[i] >= 0 or y[i] is -0 or NaN (+1), clear where y[i] < 0 (-1) (numpy's packbits order).
void pack_signs(const float* y, int64_t n, uint8_t* bits);
// +1 / -1 of element i of packed signs.
inline float unpacked_sign(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (7 - (i & 7))) & 1 ? 1.0f : -1.0f;
}
// ||y|| / sqrt(n): the scale of a compressed tensor (the sum of squares in double).
float compression_scale(const float* y, int64_t n);
// Compresses y (n) in place of its error: returns s = compression_scale(y), writes the signs to
// `bits`, and leaves error[i] = y[i] - s * sign(y[i]) (error may alias y).
float compress_with_error(const float* y, int64_t n, uint8_t* bits, float* error);

class CompressedAllReduce {
 public:
  explicit CompressedAllReduce(Communicator& comm);

  // The worker error's elements for a tensor of n (n rounded up to world * lcm(world, 8)); the
  // server error has padded_elems / world.
  static int64_t padded_elems(int64_t n, int world);
  int64_t padded_elems(int64_t n) const { return padded_elems(n, comm_.size()); }

  // data (n floats) = the compressed average of every rank's data; worker_error
  // (padded_elems(n)) and server_error (padded_elems(n) / world) are updated. Collective: every
  // rank calls it with the same n.
  void run(float* data, int64_t n, float* worker_error, float* server_error);

 private:
  Communicator& comm_;
  std::vector<float> y_;              // the padded, compensated tensor (P)
  std::vector<float> z_;              // the server's chunk (C)
  std::vector<uint8_t> send_, recv_;  // world records of C/8 sign bytes + a 4-byte scale
};

}  // namespace zerod
