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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/file_store.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store.h"
#include "core/error.h"

extern char** environ;

namespace {

using namespace zerod;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Iterations per measurement: about 256 MB moved, at least 5 and at most 1000.
int iterations(size_t bytes) {
  return static_cast<int>(
      std::clamp<size_t>((size_t(256) << 20) / std::max<size_t>(bytes, 1), 5, 1000));
}

// Seconds per iteration: the median (what the code does; robust to the scheduling stalls of a
// shared 2-core VM) and the mean (what a user sees on this machine, stalls included).
struct Timing {
  double median = 0;
  double mean = 0;
};

Timing summarize(std::vector<double> t) {
  Timing out;
  for (double x : t) out.mean += x / t.size();
  std::sort(t.begin(), t.end());
  out.median = t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
  return out;
}

// Times `iters` calls of `one` individually.
template <class F>
Timing time_each(int iters, F&& one) {
  std::vector<double> t;
  t.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    one();
    t.push_back(seconds_since(t0));
  }
  return summarize(std::move(t));
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  size_t v = std::stoull(s, &pos);
  std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  if (unit == "G" || unit == "g") return v << 30;
  ZD_CHECK_INPUT(unit.empty(), "bad size '{}': expected a number with an optional K, M or G", s);
  return v;
}

// ---------------------------------------------------------------------------------------------
// The plain TCP stream
// ---------------------------------------------------------------------------------------------

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    ZD_CHECK(w > 0, "tcp send: {}", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    ZD_CHECK(r > 0, "tcp recv: {}", r == 0 ? "closed by peer" : std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// A connected TCP socket between rank 0 (listens on an ephemeral port, published in the store)
// and rank 1, with a sender thread for the 2-direction measurement.
class TcpStream {
 public:
  TcpStream(int rank, Store& store) : rank_(rank) {
    if (rank == 0) {
      int l = ::socket(AF_INET, SOCK_STREAM, 0);
      ZD_CHECK(l >= 0, "socket: {}", std::strerror(errno));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ZD_CHECK(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "bind: {}",
               std::strerror(errno));
      ZD_CHECK(::listen(l, 1) == 0, "listen: {}", std::strerror(errno));
      socklen_t len = sizeof(a);
      ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
      const std::string port = std::to_string(ntohs(a.sin_port));
      store.set("tcp_port", Bytes(port.begin(), port.end()));
      fd_ = ::accept(l, nullptr, nullptr);
      ::close(l);
      ZD_CHECK(fd_ >= 0, "accept: {}", std::strerror(errno));
    } else {
      Bytes port = store.get("tcp_port", std::chrono::seconds(60));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(std::stoi(std::string(port.begin(), port.end()))));
      fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
      ZD_CHECK(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "connect: {}",
               std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sender_ = std::thread([this] { sender_main(); });
  }

  ~TcpStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    sender_.join();
    ::close(fd_);
  }

  // Both ranks exchange one byte, so that a measurement starts together.
  void sync() {
    char c = 's';
    send_all(fd_, &c, 1);
    recv_all(fd_, &c, 1);
  }

  // Transfers of `bytes` from rank 0 to rank 1, each acknowledged by one byte.
  Timing one_direction(const char* src, char* dst, size_t bytes, int iters) {
    sync();
    char ack = 'a';
    return time_each(iters, [&] {
      if (rank_ == 0) {
        send_all(fd_, src, bytes);
        recv_all(fd_, &ack, 1);
      } else {
        recv_all(fd_, dst, bytes);
        send_all(fd_, &ack, 1);
      }
    });
  }

  // Exchanges of `bytes` in each direction at once.
  Timing two_directions(const char* src, char* dst, size_t bytes, int iters) {
    sync();
    return time_each(iters, [&] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        src_ = src;
        bytes_ = bytes;
        ++requested_;
      }
      cv_.notify_all();
      recv_all(fd_, dst, bytes);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return sent_ == requested_; });
    });
  }

 private:
  void sender_main() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || sent_ < requested_; });
      if (quit_) return;
      const char* src = src_;
      const size_t bytes = bytes_;
      lock.unlock();
      send_all(fd_, src, bytes);
      lock.lock();
      ++sent_;
      cv_.notify_all();
    }
  }

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

// ---------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------

enum class Op { kAllReduce, kReduceScatter, kAllGather };
// Bus bandwidth factor of nccl-tests for n ranks.
double bus_factor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

// Collectives of `bytes` (buffer size as nccl-tests counts it), f32 elements.
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

// Checks one collective of `bytes` with rank-dependent values; throws on a wrong element.
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
  const size_t lo = parse_size(o.sizes.substr(0, colon));
  const size_t hi = parse_size(o.sizes.substr(colon + 1));
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
      std::printf("%5s | %14s | %14s | %22s | %22s | %22s | %s\n", "size", "tcp 1-dir", "tcp 2-dir",
                  "all_reduce", "reduce_scatter", "all_gather", "check");
    }
    for (size_t s : sizes) {
      stream.one_direction(src, dst, s, 1);  // warm-up
      const Timing one = stream.one_direction(src, dst, s, iterations(s));
      stream.two_directions(src, dst, s, 1);
      const Timing two = stream.two_directions(src, dst, s, iterations(s));
      auto gbs = [&](double seconds, double factor) { return s / seconds / 1e9 * factor; };
      std::string row =
          fmt::format("{:>5} | {:>6.3f} ({:>5.2f}) | {:>6.3f} ({:>5.2f})", human(s),
                      gbs(one.median, 1), gbs(one.mean, 1), gbs(two.median, 1), gbs(two.mean, 1));
      for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
        const Timing t = time_collective(*comm, op, a, b, s, iterations(s));
        const double f = bus_factor(op, kRanks);
        row += fmt::format(" | {:>6.3f} {:>3.0f}% ({:>5.2f} {:>3.0f}%)", gbs(t.median, f),
                           100 * gbs(t.median, f) / gbs(two.median, 1), gbs(t.mean, f),
                           100 * gbs(t.mean, f) / gbs(two.mean, 1));
      }
      std::string verdict = "-";
      if (o.check) {
        for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
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
