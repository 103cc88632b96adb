// A plain TCP stream between two endpoints on 127.0.0.1: the baseline the collectives'
// bandwidth is compared with (zerod_comm_bench, zerod_zero_bench). Endpoint 0 listens on an
// ephemeral port published in a store, endpoint 1 connects; the endpoints may be two processes
// (a FileStore) or two threads of one process (a MemoryStore). Large blocking writes with
// TCP_NODELAY; a sender thread per endpoint for the two-direction measurement.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "bench_timing.h"
#include "comm/store.h"

namespace zerod::bench {

class TcpStream {
 public:
  // `rank` 0 or 1; `key`: the store key of the port (distinct per stream sharing a store).
  TcpStream(int rank, Store& store, const std::string& key = "tcp_port");
  ~TcpStream();
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  // Both endpoints exchange one byte, so that a measurement starts together.
  void sync();
  // "1-dir": transfers of `bytes` from endpoint 0 to endpoint 1, each acknowledged by one byte.
  Timing one_direction(const char* src, char* dst, size_t bytes, int iters);
  // "2-dir": exchanges of `bytes` in each direction at once (rate per direction = bytes / time).
  Timing two_directions(const char* src, char* dst, size_t bytes, int iters);

 private:
  void sender_main();

  int rank_;
  int fd_ = -1;
  std::thread sender_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  const char* src_ = nullptr;
  size_t bytes_ = 0;
  int64_t requested_ = 0;
  int64_t sent_ = 0;
};

}  // namespace zerod::bench
