#include "comm/compressed_allreduce.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace zerod {

void pack_signs(const float* y, int64_t n, uint8_t* bits) {
  for (int64_t b = 0; b < n / 8; ++b) {
    uint8_t v = 0;
    for (int k = 0; k < 8; ++k) v = static_cast<uint8_t>((v << 1) | (y[b * 8 + k] < 0.0f ? 0 : 1));
    bits[b] = v;
  }
}

float compression_scale(const float* y, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(y[i]) * y[i];
  return static_cast<float>(std::sqrt(ss) / std::sqrt(static_cast<double>(n)));
}

float compress_with_error(const float* y, int64_t n, uint8_t* bits, float* error) {
  const float s = compression_scale(y, n);
  pack_signs(y, n, bits);
  for (int64_t i = 0; i < n; ++i) error[i] = y[i] - (y[i] < 0.0f ? -s : s);
  return s;
}

CompressedAllReduce::CompressedAllReduce(Communicator& comm) : comm_(comm) {}

int64_t CompressedAllReduce::padded_elems(int64_t n, int world) {
  const int64_t lcm = std::lcm<int64_t>(world, 8);
  const int64_t unit = world * lcm;
  return (n + unit - 1) / unit * unit;
}

void CompressedAllReduce::run(float* data, int64_t n, float* worker_error, float* server_error) {
  const int world = comm_.size(), rank = comm_.rank();
  const int64_t P = padded_elems(n), C = P / world, cb = C / 8;
  const int64_t record = cb + static_cast<int64_t>(sizeof(float));
  ZD_CHECK(n > 0, "compressed all-reduce of {} elements", n);
  y_.assign(static_cast<size_t>(P), 0.0f);
  std::memcpy(y_.data(), data, static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < P; ++i) y_[static_cast<size_t>(i)] += worker_error[i];

  // Worker: one scale for the whole tensor; chunk r's signs (with the scale) go to server r.
  send_.resize(static_cast<size_t>(world * record));
  recv_.resize(static_cast<size_t>(world * record));
  const float s = compress_with_error(y_.data(), P, send_.data(), worker_error);
  // The signs were packed contiguously (chunk r at byte r * cb): spread them into records.
  for (int r = world - 1; r >= 0; --r) {
    uint8_t* rec = send_.data() + r * record;
    std::memmove(rec, send_.data() + r * cb, static_cast<size_t>(cb));
  }
  for (int r = 0; r < world; ++r) std::memcpy(send_.data() + r * record + cb, &s, sizeof(float));
  comm_.all_to_all(send_.data(), recv_.data(), record, CommType::kU8);

  // Server of chunk `rank`: average the decompressed chunks, add the server error, recompress.
  z_.assign(static_cast<size_t>(C), 0.0f);
  const float inv_world = 1.0f / static_cast<float>(world);
  for (int q = 0; q < world; ++q) {
    const uint8_t* rec = recv_.data() + q * record;
    float sq;
    std::memcpy(&sq, rec + cb, sizeof(float));
    const float w = sq * inv_world;
    for (int64_t i = 0; i < C; ++i) z_[static_cast<size_t>(i)] += unpacked_sign(rec, i) * w;
  }
  for (int64_t i = 0; i < C; ++i) z_[static_cast<size_t>(i)] += server_error[i];
  uint8_t* mine = send_.data();  // (phase 1's send buffer is free again)
  const float t = compress_with_error(z_.data(), C, mine, server_error);
  std::memcpy(mine + cb, &t, sizeof(float));
  comm_.all_gather(mine, recv_.data(), record, CommType::kU8);

  // Every server's chunk, decompressed; the padding is dropped.
  (void)rank;
  for (int r = 0; r < world; ++r) {
    const uint8_t* rec = recv_.data() + r * record;
    float tr;
    std::memcpy(&tr, rec + cb, sizeof(float));
    const int64_t base = r * C, end = std::min<int64_t>(C, n - base);
    for (int64_t i = 0; i < end; ++i) data[base + i] = unpacked_sign(rec, i) * tr;
  }
}

}  // namespace zerod
