// Control-plane benchmark: while a job trains in a daemon (in this process, behind its real
// gRPC server on 127.0.0.1), N clients call GetStatus as fast as they can; prints requests/s and
// p50/p99 latency, and the job's tokens/s against the same job run with no clients.
//
//   zerod_control_bench [--clients 8] [--rate R] [--steps 30] [shape flags; default 4 x 256]
//
// With --rate 0 the clients call back to back: on a machine with few cores they then compete
// with training for the CPU, which is what the slowdown measures; --rate paces them like
// monitoring tools (R calls per second each).
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <thread>

#include "bench_job.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/config/parse.h"
#include "engine/control/grpc/control_server.h"
#include "engine/runtime/local_session.h"
#include "zerod.grpc.pb.h"

using namespace zerod;

namespace {

struct JobRun {
  double seconds = 0;  // training time: first step to last (from the daemon's status)
  int64_t steps = 0;
};

// Submits the job and waits for it to finish; returns its step-time total.
JobRun run_job_once(Daemon& d, const std::string& text) {
  d.submit(text, "bench job");
  while (d.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const DaemonStatus s = d.status();
  if (s.state != JobState::kFinished) {
    fmt::print(stderr, "the job ended {}: {}\n", job_state_name(s.state), s.reason);
    std::exit(1);
  }
  return {s.elapsed_seconds, s.progress.step};
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod control-plane benchmark"};
  int clients = 8;
  int64_t steps = 30;
  bench::BenchShape shape;
  double rate = 0;
  app.add_option("--clients", clients, "concurrent GetStatus callers")->capture_default_str();
  app.add_option("--rate", rate, "calls per second per client (0: as fast as they can)")
      ->capture_default_str();
  app.add_option("--steps", steps, "steps of the job (each run)")->capture_default_str();
  shape.add_options(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  const bench::SyntheticData data(shape, int64_t{shape.batch} * 64);
  const JobConfig cfg = bench::bench_job(shape, data, steps, 1);
  const std::string text = job_to_json(cfg).dump();

  DaemonOptions dopt;
  dopt.log_steps = false;
  dopt.start_session = [](const LaunchSpec& s, const JobConfig&) { return start_local_session(s); };
  Daemon daemon(dopt);
  ControlServerOptions so;
  so.listen = "127.0.0.1:0";
  so.security.insecure_loopback = true;  // this process's own clients, for the benchmark's time
  ControlServer server(daemon, so);

  // Without clients (twice: the first run warms memory up), then with them.
  run_job_once(daemon, text);
  const JobRun quiet = run_job_once(daemon, text);

  std::atomic<bool> go{true};
  std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  std::atomic<int64_t> errors{0};
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
      auto stub = v1::Control::NewStub(channel);
      auto next = std::chrono::steady_clock::now();
      while (go) {
        if (rate > 0) {
          next += std::chrono::microseconds(static_cast<int64_t>(1e6 / rate));
          std::this_thread::sleep_until(next);
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::JobStatus s;
        Stopwatch sw;
        const grpc::Status st = stub->GetStatus(&ctx, {}, &s);
        if (!st.ok()) ++errors;
        lat[static_cast<size_t>(c)].push_back(sw.seconds());
      }
    });
  }
  Stopwatch window;
  const JobRun busy = run_job_once(daemon, text);
  go = false;
  const double wall = window.seconds();
  for (auto& t : threads) t.join();

  std::vector<double> all;
  for (const auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  const double tokens = static_cast<double>(steps) * cfg.global_batch() * cfg.model.seq_len;
  const double tps_quiet = tokens / quiet.seconds, tps_busy = tokens / busy.seconds;
  fmt::print(
      "control benchmark: job {} layers x {} wide, seq {}, micro-batch {}, {} steps; {} clients, "
      "{}\n",
      shape.layers, shape.embd, shape.seq, shape.batch, steps, clients,
      rate > 0 ? fmt::format("{:g} calls/s each", rate) : std::string("back to back"));
  fmt::print(
      "GetStatus: {} calls in {:.1f} s = {:.0f} requests/s, p50 {:.3f} ms, p99 {:.3f} ms, max "
      "{:.3f} ms, {} errors\n",
      all.size(), wall, static_cast<double>(all.size()) / wall, 1e3 * pct(0.50), 1e3 * pct(0.99),
      all.empty() ? 0.0 : 1e3 * all.back(), errors.load());
  fmt::print("training: {:.0f} tokens/s with clients vs {:.0f} without: slowed by {:.1f}%\n",
             tps_busy, tps_quiet, 100.0 * (1.0 - tps_busy / tps_quiet));
  server.shutdown();
  return 0;
}
