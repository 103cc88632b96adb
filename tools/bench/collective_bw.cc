#include "collective_bw.h"

#include <cstdint>
#include <exception>

#include "core/error.h"

namespace zerod::bench {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllGather:
      return "all_gather";
  }
  return "?";
}

size_t parse_message_bytes(const std::string& text, const std::string& flag) {
  size_t pos = 0, v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    ZD_THROW_INPUT("{} '{}': expected a number with an optional K, M or G", flag, text);
  }
  const std::string unit = text.substr(pos);
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  if (unit == "G" || unit == "g") return v << 30;
  ZD_CHECK_INPUT(unit.empty(), "{} '{}': expected a number with an optional K, M or G", flag, text);
  return v;
}

double bus_factor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

Timing time_collective(Communicator& comm, Op op, std::vector<float>& a, std::vector<float>& b,
                       size_t bytes, int iters) {
  const int n = comm.size();
  const int64_t count = static_cast<int64_t>(bytes / sizeof(float));
  auto run = [&] {
    switch (op) {
      case Op::kAllReduce:
        comm.all_reduce(a.data(), count, CommType::kF32, ReduceOp::kSum);
        break;
      case Op::kReduceScatter:
        comm.reduce_scatter(a.data(), b.data(), count / n, CommType::kF32, ReduceOp::kSum);
        break;
      case Op::kAllGather:
        comm.all_gather(a.data(), b.data(), count / n, CommType::kF32);
        break;
    }
  };
  run();           // warm-up (page faults, socket buffers)
  comm.barrier();  // start together
  return time_each(iters, run);
}

void check_collective(Communicator& comm, Op op, std::vector<float>& a, std::vector<float>& b,
                      size_t bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t count = bytes / sizeof(float);
  const size_t per = count / n;
  switch (op) {
    case Op::kAllReduce:
      for (size_t i = 0; i < count; ++i) a[i] = float((i % 1000) * (r + 1));
      comm.all_reduce(a.data(), int64_t(count), CommType::kF32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        ZD_CHECK(a[i] == float((i % 1000) * n * (n + 1) / 2), "all_reduce element {}", i);
      }
      break;
    case Op::kReduceScatter:
      for (size_t i = 0; i < per * n; ++i) a[i] = float((i % 1000) * (r + 1));
      comm.reduce_scatter(a.data(), b.data(), int64_t(per), CommType::kF32, ReduceOp::kSum);
      for (size_t i = 0; i < per; ++i) {
        ZD_CHECK(b[i] == float(((r * per + i) % 1000) * n * (n + 1) / 2), "reduce_scatter {}", i);
      }
      break;
    case Op::kAllGather:
      for (size_t i = 0; i < per; ++i) a[i] = float(r * 1000 + i % 1000);
      comm.all_gather(a.data(), b.data(), int64_t(per), CommType::kF32);
      for (size_t i = 0; i < per * n; ++i) {
        ZD_CHECK(b[i] == float((i / per) * 1000 + (i % per) % 1000), "all_gather element {}", i);
      }
      break;
  }
}

}  // namespace zerod::bench
