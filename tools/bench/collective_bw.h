// Bus bandwidth of a communicator's all-reduce, reduce-scatter and all-gather as nccl-tests
// count it (zerod_comm_bench between processes, zerod_zero_bench between threads). Sizes are
// the collective's buffer in bytes: the all-reduce buffer, the reduce-scatter input, the
// all-gather output; busbw = size / time * 2(n-1)/n for all-reduce and (n-1)/n for the others,
// i.e. what each rank sends per second.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "comm/communicator.h"

namespace zerod::bench {

enum class Op { kAllReduce, kReduceScatter, kAllGather };
inline constexpr Op kCollectives[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather};
const char* op_name(Op op);  // "all_reduce", "reduce_scatter", "all_gather"
// "4K", "64M", "1G", "1000": a message size in bytes (InputError naming `flag` otherwise).
size_t parse_message_bytes(const std::string& text, const std::string& flag);
// Bus bandwidth factor of nccl-tests for n ranks.
double bus_factor(Op op, int n);

// `iters` collectives of `bytes` on f32 elements of `a` (and `b`: reduce-scatter output,
// all-gather output; both hold at least bytes / 4 elements), after one warm-up and a barrier.
Timing time_collective(Communicator& comm, Op op, std::vector<float>& a, std::vector<float>& b,
                       size_t bytes, int iters);
// One collective of `bytes` with rank-dependent values; throws on a wrong element.
void check_collective(Communicator& comm, Op op, std::vector<float>& a, std::vector<float>& b,
                      size_t bytes);

}  // namespace zerod::bench
