// What a communicator did (DeepSpeed's comms_logger and a flight recorder): per operation
// kind, the calls, bytes and time; and the last N collectives, each with its sequence number,
// size and when it was issued, started and ended. On a failure every rank writes its recent
// collectives to the log, so a hang or a lost peer can be read off the ranks' logs.
//
// Bytes are what NCCL's tests call the size of an operation: the buffer each rank reduces
// (all_reduce), the whole gathered / scattered / exchanged buffer (all_gather, reduce_scatter,
// all_to_all), the broadcast buffer, the block sent (send_recv), the message (point-to-point
// "send" and "recv", each counted on the rank that sends or receives it; recorded under negative
// ids, as they take no sequence number). Bus bandwidth = bytes / time x
// (2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for
// broadcast and send_recv), comparable across world sizes.
//
// Bytes sent: what one rank puts on the wire for an operation of that size in the algorithms
// zerod's Gloo communicator and NCCL use (ring all-reduce: a reduce-scatter and an all-gather,
// 2(n-1)/n of the buffer; an all-gather, reduce-scatter or all-to-all: the (n-1)/n of the whole
// buffer that is not the rank's own; a broadcast, send_recv or "send": the buffer; a "recv":
// nothing), i.e. bytes x the bus factor. This is the measure that compares collectives of
// different kinds: by NCCL's size a ring all-reduce of B bytes and an all-to-all plus an
// all-gather of B/32 bytes each (1-bit Adam's compressed all-reduce) stand 16:1, while a rank
// sends 32 times less with the latter.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

struct CollectiveRecord {
  int64_t seq = 0;
  std::string op;      // "all_reduce"
  std::string detail;  // "1001 x f32, sum"
  int64_t bytes = 0;
  double issued = 0, started = -1, ended = -1;  // seconds since the log began; -1: not yet
  bool failed = false;
};

struct CollectiveTotals {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;  // from start to end of each collective
};

class CollectiveLog {
 public:
  CollectiveLog(int world_size, size_t capacity = 64);

  void issued(int64_t seq, const std::string& op, const std::string& detail, int64_t bytes);
  void started(int64_t seq);
  void ended(int64_t seq, bool ok);

  std::vector<CollectiveRecord> recent() const;  // oldest first, at most capacity
  std::map<std::string, CollectiveTotals> totals() const;
  // The last `n` records as lines for a log ("#183 all_reduce 4.0 MB: issued 1.203 s, started
  // 1.204 s, not finished").
  std::string describe_recent(size_t n) const;
  // One line per operation kind (those in `only`, or all when it is empty): calls, bytes (also
  // exact, "64.28 MB (64280599 B)", for tools that difference the totals of two steps),
  // time, algorithm and bus bandwidth; with steps > 0 also the bytes and the bytes sent per
  // training step (the totals over `steps`: the caller says how many steps the log's
  // collectives served).
  std::string describe_totals(const std::vector<std::string>& only = {}, int64_t steps = 0) const;
  double bus_factor(const std::string& op) const;
  // The bytes one rank sends for an operation `op` of `bytes` (NCCL's size), as above.
  double sent_bytes(const std::string& op, double bytes) const;

 private:
  double now() const;
  CollectiveRecord* find(int64_t seq);  // under mu_

  const int world_;
  const size_t capacity_;
  const std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::deque<CollectiveRecord> recent_;
  std::map<std::string, CollectiveTotals> totals_;
};

}  // namespace zerod
