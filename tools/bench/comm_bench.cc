// zerod_comm_bench: bandwidth of the Gloo backend's all-reduce, reduce-scatter and all-gather
// between 2 processes on 127.0.0.1, next to a plain TCP stream between the same two processes.
//
// Started without --rank it makes a temporary directory for a FileStore, starts itself again as
// rank 1 and runs rank 0. Sizes are the collective's buffer in bytes, as nccl-tests counts them:
// the all-reduce buffer, the reduce-scatter input, the all-gather output. Bandwidths follow
// nccl-tests: algbw = size / time; busbw = algbw * 2(n-1)/n for all-reduce and (n-1)/n for
// reduce-scatter and all-gather, i.e. what each rank sends per second.
//
// The TCP stream is a socket this program opens itself. "1-dir": rank 0 sends `size` bytes,
// rank 1 answers one byte when it has them all. "2-dir": both ranks send `size` bytes to each
// other at once (a sender and a receiver thread in each process), rate per direction. The
// collectives are compared with 2-dir: in each of them both ranks send and receive the same
// number of bytes at the same time, which is exactly what busbw counts, so 2-dir is the most
// a collective could reach on this link and CPU.
//
// "send": a point-to-point message (Communicator::send / recv) of `size` bytes from rank 0 to
// rank 1, which answers with an empty message once it has it: the 1-dir stream's pattern, so its
// % is of tcp 1-dir.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "collective_bw.h"
#include "comm/communicator.h"
#include "comm/file_store.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store.h"
#include "core/error.h"
#include "tcp_stream.h"

extern char** environ;

namespace {

using namespace zerod;
using namespace zerod::bench;

// One message of `bytes` from rank 0 to rank 1 and an empty answer (see the file comment).
void send_and_answer(Communicator& comm, std::vector<float>& a, std::vector<float>& b,
                     size_t bytes) {
  const auto count = static_cast<int64_t>(bytes / sizeof(float));
  if (comm.rank() == 0) {
    comm.send(a.data(), count, CommType::kF32, 1, 0);
    comm.recv(nullptr, 0, CommType::kF32, 1, 1);
  } else {
    comm.recv(b.data(), count, CommType::kF32, 0, 0);
    comm.send(nullptr, 0, CommType::kF32, 0, 1);
  }
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

struct Options {
  std::string sizes = "1K:256M";
  int step = 4;
  std::vector<std::string> algorithms = {"auto"};
  size_t segment_bytes = 0;
  bool check = true;
  int rank = -1;
  std::string dir;
};

std::vector<size_t> size_list(const Options& o) {
  const auto colon = o.sizes.find(':');
  ZD_CHECK_INPUT(colon != std::string::npos, "--sizes '{}': expected MIN:MAX", o.sizes);
  const size_t lo = parse_message_bytes(o.sizes.substr(0, colon), "--sizes");
  const size_t hi = parse_message_bytes(o.sizes.substr(colon + 1), "--sizes");
  ZD_CHECK_INPUT(lo >= 8 && lo <= hi, "--sizes '{}': need 8 <= MIN <= MAX", o.sizes);
  ZD_CHECK_INPUT(o.step >= 2, "--step {}: must be at least 2", o.step);
  std::vector<size_t> out;
  for (size_t s = lo; s <= hi; s *= static_cast<size_t>(o.step)) out.push_back(s);
  return out;
}

int run_rank(const Options& o) {
  constexpr int kRanks = 2;
  auto store = std::make_shared<FileStore>(o.dir);
  const auto sizes = size_list(o);
  const size_t max_bytes = sizes.back();
  std::vector<float> a(max_bytes / sizeof(float) + 1, 1.0f), b(max_bytes / sizeof(float) + 1, 0.0f);

  // The TCP stream is measured right before the collectives of each size, so that both see
  // the same machine (the development VM is shared).
  TcpStream stream(o.rank, *store);
  auto* src = reinterpret_cast<const char*>(a.data());
  auto* dst = reinterpret_cast<char*>(b.data());

  if (o.rank == 0) {
    std::printf(
        "zerod_comm_bench: 2 processes on 127.0.0.1, f32, %s..%s, ~256 MB moved per "
        "measurement (5..1000 iterations, each timed)\n",
        human(sizes.front()).c_str(), human(sizes.back()).c_str());
    std::printf(
        "GB/s (1e9 bytes/s) from the median iteration, the mean in parentheses. tcp 1-dir: "
        "one direction; tcp 2-dir: both directions at once, per direction.\n"
        "Collectives: busbw as nccl-tests, %% = busbw / tcp 2-dir (median to median, mean "
        "to mean).\n");
  }
  for (const auto& name : o.algorithms) {
    GlooOptions g;
    g.rank = o.rank;
    g.size = kRanks;
    g.store = std::make_shared<PrefixStore>("gloo-" + name, store);
    g.timeout = std::chrono::seconds(120);
    g.algorithm = parse_gloo_algorithm(name);
    g.segment_bytes = o.segment_bytes;
    auto comm = make_gloo_communicator(g);
    if (o.rank == 0) {
      std::printf(
          "\nalgorithm: %s%s\n", name.c_str(),
          o.segment_bytes ? fmt::format(", segment {}", human(o.segment_bytes)).c_str() : "");
      std::printf("%5s | %14s | %14s | %22s | %22s | %22s | %22s | %s\n", "size", "tcp 1-dir",
                  "tcp 2-dir", "all_reduce", "reduce_scatter", "all_gather", "send", "check");
    }
    for (size_t s : sizes) {
      stream.one_direction(src, dst, s, 1);  // warm-up
      const Timing one = stream.one_direction(src, dst, s, iterations_for(s));
      stream.two_directions(src, dst, s, 1);
      const Timing two = stream.two_directions(src, dst, s, iterations_for(s));
      auto gbs = [&](double seconds, double factor) { return s / seconds / 1e9 * factor; };
      std::string row =
          fmt::format("{:>5} | {:>6.3f} ({:>5.2f}) | {:>6.3f} ({:>5.2f})", human(s),
                      gbs(one.median, 1), gbs(one.mean, 1), gbs(two.median, 1), gbs(two.mean, 1));
      for (Op op : kCollectives) {
        const Timing t = time_collective(*comm, op, a, b, s, iterations_for(s));
        const double f = bus_factor(op, kRanks);
        row += fmt::format(" | {:>6.3f} {:>3.0f}% ({:>5.2f} {:>3.0f}%)", gbs(t.median, f),
                           100 * gbs(t.median, f) / gbs(two.median, 1), gbs(t.mean, f),
                           100 * gbs(t.mean, f) / gbs(two.mean, 1));
      }
      send_and_answer(*comm, a, b, s);  // warm-up
      const Timing p2p = time_each(iterations_for(s), [&] { send_and_answer(*comm, a, b, s); });
      row += fmt::format(" | {:>6.3f} {:>3.0f}% ({:>5.2f} {:>3.0f}%)", gbs(p2p.median, 1),
                         100 * gbs(p2p.median, 1) / gbs(one.median, 1), gbs(p2p.mean, 1),
                         100 * gbs(p2p.mean, 1) / gbs(one.mean, 1));
      std::string verdict = "-";
      if (o.check) {
        for (Op op : kCollectives) {
          check_collective(*comm, op, a, b, s);
        }
        verdict = "ok";
      }
      if (o.rank == 0) std::printf("%s | %s\n", row.c_str(), verdict.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

// Runs rank 0 here and rank 1 as a child process of this program.
int launch(const Options& o, int argc, char** argv) {
  char tmpl[] = "/tmp/zerod-comm-bench-XXXXXX";
  ZD_CHECK(::mkdtemp(tmpl) != nullptr, "mkdtemp: {}", std::strerror(errno));
  const std::string dir = tmpl;
  std::vector<std::string> args(argv, argv + argc);
  args.insert(args.end(), {"--rank", "1", "--dir", dir});
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  pid_t child = -1;
  const int rc = ::posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ);
  ZD_CHECK(rc == 0, "posix_spawn: {}", std::strerror(rc));
  Options mine = o;
  mine.rank = 0;
  mine.dir = dir;
  int result = 0;
  try {
    result = run_rank(mine);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 0: %s\n", e.what());
    result = 1;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  std::filesystem::remove_all(dir);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "rank 1 failed (status %d)\n", status);
    result = 1;
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zerod_comm_bench: Gloo collectives vs a plain TCP stream, 2 processes on loopback"};
  app.add_option("--sizes", o.sizes, "MIN:MAX buffer bytes (K, M, G suffixes)");
  app.add_option("--step", o.step, "size factor between measurements");
  app.add_option("--algorithm", o.algorithms, "auto | ring | direct | gloo (several allowed)")
      ->check(CLI::IsMember({"auto", "ring", "direct", "gloo"}));
  app.add_option("--segment-bytes", o.segment_bytes, "ring pipeline segment (0: automatic)");
  app.add_flag("!--no-check", o.check, "skip checking the results");
  app.add_option("--rank", o.rank, "internal: run as this rank")->group("");
  app.add_option("--dir", o.dir, "internal: FileStore directory")->group("");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.rank < 0) return launch(o, argc, argv);
    return run_rank(o);
  } catch (const zerod::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}
