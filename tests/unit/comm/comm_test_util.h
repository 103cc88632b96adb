// Helpers of the comm tests: ranks as threads of this process, worlds of Gloo communicators over
// a MemoryStore, and rank-dependent test values with their expected reductions.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/peer_monitor.h"
#include "comm/store.h"
#include "core/error.h"

namespace zerod::test {

using Ms = std::chrono::milliseconds;

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs fn, which must throw Error(kPeerLost) (exit code 3); returns its message.
template <class F>
std::string peer_lost_message(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost) << e.what();
    EXPECT_EQ(e.exit_code(), 3);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

// Runs fn(rank) on n threads and joins them; an exception escaping a rank fails the test.
template <class F>
void run_ranks(int n, F&& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[static_cast<size_t>(r)]) continue;
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

struct World {
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<LocalPeerMonitor> monitor;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// n Gloo communicators on 127.0.0.1, created concurrently (each on its rank's thread).
inline World make_world(int n, Ms timeout = Ms(10000),
                        GlooAlgorithm algorithm = GlooAlgorithm::kAuto, size_t segment_bytes = 0,
                        double rate_limit_bits_per_s = 0) {
  World w;
  w.monitor = std::make_shared<LocalPeerMonitor>(n);
  w.comms.resize(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = n;
    o.store = std::make_shared<PrefixStore>("world", w.store);
    o.timeout = timeout;
    o.monitor = w.monitor;
    o.algorithm = algorithm;
    o.segment_bytes = segment_bytes;
    o.rate_limit_bits_per_s = rate_limit_bits_per_s;
    w.comms[static_cast<size_t>(r)] = make_gloo_communicator(o);
  });
  return w;
}

// Rank r's value at element i: small integers (exact in every type and in f32 sums of 4 ranks),
// negative ones for signed types, and u8 values whose sums wrap.
template <typename T>
T value(int r, size_t i) {
  const int64_t v = static_cast<int64_t>((i * 7 + static_cast<size_t>(r) * 13) % 31) - 15;
  if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<uint8_t>((i * 7 + static_cast<size_t>(r) * 101 + 200) % 256);
  } else {
    return static_cast<T>(v * (r % 2 == 0 ? 1 : 3));
  }
}

// op over ranks 0..n-1 of value<T>(r, i), with T's arithmetic (u8 sums wrap mod 256).
template <typename T>
T expected(int n, size_t i, ReduceOp op) {
  T acc = value<T>(0, i);
  for (int r = 1; r < n; ++r) {
    const T v = value<T>(r, i);
    if (op == ReduceOp::kSum) {
      acc = static_cast<T>(acc + v);
    } else {
      acc = v > acc ? v : acc;
    }
  }
  return acc;
}

template <typename T>
constexpr CommType comm_type_of() {
  if constexpr (std::is_same_v<T, float>) return CommType::kF32;
  if constexpr (std::is_same_v<T, double>) return CommType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return CommType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return CommType::kI64;
  if constexpr (std::is_same_v<T, uint8_t>) return CommType::kU8;
}

}  // namespace zerod::test
