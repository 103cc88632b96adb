// zerod: the per-node training engine.
//
//   zerod train [JOB.json] [--steps N] [--demo-dir DIR] [--nproc-per-node N]
//               [--nnodes N [--node-rank R] --master HOST:PORT] [--resume latest|TAG]
//               [--nnodes MIN:MAX [--node-rank R] --master HOST:PORT [--max-restarts K]
//                [--settle SECONDS]]   (elastic: an agent per node, docs/elastic.md)
//               [--listen unix:PATH|ADDR:PORT [--token-file F | --insecure-loopback]
//                [--tls-cert C --tls-key K]]
//   zerod check JOB.json [--world-size N] [--config-only]
//   zerod eval JOB.json [--from CKPT_DIR|HF_DIR] [--tokens N]
//   zerod generate --from CKPT_DIR|HF_DIR (--prompt-tokens 1,2,3 | --prompt TEXT)
//                  [--tokenizer PATH] [--max-new-tokens N]
//                  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--eos-token ID]
//   zerod serve [--listen unix:PATH|ADDR:PORT] [--token-file F | --insecure-loopback]
//               [--tls-cert C --tls-key K] [--state-dir DIR] [--max-watchers N]
//               [--nproc-per-node N] [--nnodes M [--node-rank R --master ADDR:PORT]
//               [--rendezvous-port P]]
//
// Exit codes: 0 ok, 1 internal error, 2 bad input (job file, data, flags), 3 lost peer.
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include <unistd.h>

#include "core/cpu_info.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/config/elasticity.h"
#include "engine/config/json_reader.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "engine/elastic_train.h"
#include "engine/plan/pipeline_plan.h"
#include "engine/plan/planner.h"
#include "engine/runtime/launch.h"
#include "engine/runtime/local_session.h"
#include "engine/runtime/signals.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/train/demo.h"
#include "engine/train/eval_job.h"
#include "engine/train/generate.h"
#include "engine/train/job_environment.h"
#include "engine/train/job_tokenizer.h"
#include "engine/train/run_job.h"
#ifdef ZEROD_HAVE_PROMETHEUS
#include "engine/metrics/prometheus_exporter.h"
#endif
#ifdef ZEROD_HAVE_GRPC
#include "engine/control/daemon.h"
#include "engine/control/grpc/control_server.h"
#include "engine/control/grpc/follower.h"
#include "engine/runtime/grpc/auth.h"
#include "engine/runtime/grpc/endpoint.h"
#include "engine/runtime/grpc/node_session_grpc.h"
#endif
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"

namespace {

constexpr const char* kVersion = "0.1.0";

struct TrainFlags {
  std::string job;
  int metrics_port = -1;  // >= 0: serve /metrics on 127.0.0.1 (0: any free port)
  zerod::LaunchFlags launch;
  std::string resume;
  // --listen: the control plane of this one job (zerod serve's rules: a Unix socket, or TCP
  // with a token or --insecure-loopback on loopback).
  std::string listen;
  std::string token_file, tls_cert, tls_key;
  bool insecure_loopback = false;
  std::string demo_dir = "zerod-demo";
  int64_t steps = 0;         // > 0: overrides train.steps
  std::string memory_limit;  // "20GiB": overrides train.memory_limit
  // --nnodes MIN:MAX (docs/elastic.md): this process is an elastic agent.
  std::optional<zerod::ElasticFlags> elastic;
  std::vector<std::string> global_args;  // for the agent's workers: --log-level
};

// --metrics-port: the Prometheus endpoint, or a clear refusal without prometheus-cpp.
// With a token (zerod serve --token-file) a scrape must carry it as a bearer token.
std::unique_ptr<zerod::MetricsSink> start_metrics(int port, const std::string& token = {}) {
  if (port < 0) return nullptr;
#ifdef ZEROD_HAVE_PROMETHEUS
  auto exporter =
      std::make_unique<zerod::PrometheusExporter>(fmt::format("127.0.0.1:{}", port), token);
  spdlog::info("metrics: http://127.0.0.1:{}/metrics{}", exporter->port(),
               token.empty() ? "" : " (Authorization: Bearer, the --token-file's token)");
  zerod::publish_elastic_gauges(*exporter);
  return exporter;
#else
  (void)token;
  ZD_THROW_INPUT("--metrics-port {}: this zerod was built without prometheus-cpp", port);
#endif
}

void print_warnings(const zerod::ParsedJob& job) {
  for (const auto& w : job.warnings) spdlog::warn("{}: {}", job.config.source, w);
}

// The node's membership: a local session for one node, the gRPC rendezvous for several.
std::unique_ptr<zerod::NodeSession> start_session(const zerod::LaunchSpec& spec,
                                                  const zerod::JobConfig& cfg) {
  if (spec.nnodes == 1) return zerod::start_local_session(spec);
#ifdef ZEROD_HAVE_GRPC
  zerod::SessionOptions so;
  so.job_hash = zerod::job_hash(cfg);
  so.rendezvous_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(cfg.train.rendezvous_timeout * 1000));
  spdlog::info("rendezvous: node {} of {} joining {} (timeout {:g} s)",
               spec.node_rank < 0 ? std::string("?") : std::to_string(spec.node_rank), spec.nnodes,
               spec.master_address(), cfg.train.rendezvous_timeout);
  return zerod::start_node_session(spec, so);
#else
  ZD_THROW_INPUT("--nnodes {}: this zerod was built without gRPC, which multi-node training needs",
                 spec.nnodes);
#endif
}

// zerod train --listen: the job runs under a one-off daemon that serves the control plane
// (status, watch, checkpoint save/list, stop) on --listen until the job ends; the exit code is
// the job's, as without --listen.
int run_train_listening(const TrainFlags& f, const zerod::LaunchSpec& spec, zerod::JobConfig cfg,
                        int threads) {
#ifdef ZEROD_HAVE_GRPC
  zerod::ControlServerOptions so;
  so.listen = f.listen;
  so.security.tls_cert = f.tls_cert;
  so.security.tls_key = f.tls_key;
  so.security.insecure_loopback = f.insecure_loopback;
  if (!f.token_file.empty()) so.security.token = zerod::read_token_file(f.token_file);
  if (so.security.insecure_loopback && so.security.token.empty()) {
    spdlog::warn(
        "--insecure-loopback: any local user can drive this job on {} without a token, and it "
        "reads and writes files as this user",
        f.listen);
  }
  const std::unique_ptr<zerod::MetricsSink> metrics =
      start_metrics(f.metrics_port, so.security.token);
  zerod::DaemonOptions dopt;
  dopt.spec = spec;
  dopt.one_off = true;
  dopt.threads_per_rank = threads;
  dopt.metrics = metrics.get();
  dopt.start_session = [](const zerod::LaunchSpec& s, const zerod::JobConfig& c) {
    return start_session(s, c);
  };
  zerod::Daemon daemon(dopt);
  zerod::ControlServer server(daemon, so);  // checks the listen policy, then binds
  spdlog::info("zerod {} train: control plane listening on {} ({}{})", kVersion, server.address(),
               !so.security.token.empty()         ? "token required"
               : zerod::is_unix_address(f.listen) ? "this user only"
                                                  : "no token: any local user",
               so.security.tls_cert.empty() ? "" : ", TLS");
  daemon.start_job(std::move(cfg), f.resume, f.job.empty() ? "the demo job" : f.job);
  // A stop signal reaches the job at its next step boundary (the trainer checks it itself).
  while (!daemon.wait_idle(std::chrono::seconds(1))) {
  }
  // The final status stays up a moment for a client polling it (zeroctl stop waits for it).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  server.shutdown();
  daemon.rethrow_failure();
  return 0;
#else
  (void)spec, (void)cfg, (void)threads;
  ZD_THROW_INPUT("--listen {}: this zerod was built without gRPC, which the control plane needs",
                 f.listen);
#endif
}

// zerod train --nnodes MIN:MAX: this process is the node's elastic agent (docs/elastic.md).
int run_train_elastic(const TrainFlags& f, const zerod::LaunchSpec& spec, zerod::ParsedJob job) {
  const zerod::ElasticFlags& e = *f.elastic;
  if (!f.listen.empty()) {
    ZD_THROW_INPUT(
        "--listen {}: an elastic job (--nnodes {}:{}) serves its status on --master "
        "(zeroctl --addr MASTER status), not on --listen",
        f.listen, e.min_nodes, e.max_nodes);
  }
  if (f.job.empty()) {
    ZD_THROW_INPUT(
        "--nnodes {}:{}: an elastic job needs a job file with train.checkpoint_dir and "
        "train.save_interval (the demo job has none)",
        e.min_nodes, e.max_nodes);
  }
  zerod::ElasticLaunch l;
  l.flags = e;
  l.spec = spec;
  l.job = std::move(job);
  l.job_path = f.job;
  l.resume = f.resume;
  l.global_args = f.global_args;
  l.worker_args = {"train", f.job};
  if (f.steps > 0) l.worker_args.insert(l.worker_args.end(), {"--steps", std::to_string(f.steps)});
  if (!f.memory_limit.empty())
    l.worker_args.insert(l.worker_args.end(), {"--memory-limit", f.memory_limit});
  if (f.metrics_port >= 0)
    l.worker_args.insert(l.worker_args.end(), {"--metrics-port", std::to_string(f.metrics_port)});
  return zerod::run_elastic_train(std::move(l));
}

int run_train(const TrainFlags& f) {
  // Ctrl-C does what SIGTERM does: save at the next step boundary (with a checkpoint dir) and
  // exit 0, saying so on stderr; a second Ctrl-C exits at once.
  zerod::install_stop_signals(/*sigint=*/true);
  if (f.listen.empty() && (f.insecure_loopback || !f.tls_cert.empty() || !f.tls_key.empty())) {
    ZD_THROW_INPUT(
        "--insecure-loopback, --tls-cert and --tls-key are for the control plane: give --listen "
        "too");
  }
  const zerod::LaunchSpec spec = zerod::resolve_launch(f.launch, zerod::from_process_env());
  // --token-file guards --listen's control plane and, for a job of several nodes, its
  // rendezvous: every node sends the token and node 0's Rendezvous service requires it.
  if (!f.token_file.empty()) {
    if (f.elastic) {
      ZD_THROW_INPUT(
          "--token-file with --nnodes {}:{}: the elastic rendezvous does not check tokens yet "
          "(a job of a fixed --nnodes N does)",
          f.elastic->min_nodes, f.elastic->max_nodes);
    }
    if (f.listen.empty() && spec.nnodes == 1) {
      ZD_THROW_INPUT(
          "--token-file guards --listen's control plane or the rendezvous of a job of several "
          "nodes (--nnodes N); this job has neither");
    }
    if (spec.nnodes > 1) zerod::set_client_token(zerod::read_token_file(f.token_file));
  }
  zerod::ParsedJob job =
      f.job.empty() ? zerod::prepare_demo_job(f.demo_dir) : zerod::load_job_file(f.job);
  print_warnings(job);
  if (f.steps > 0) job.config.train.steps = f.steps;
  if (!f.memory_limit.empty())
    job.config.train.memory_limit = zerod::parse_bytes(f.memory_limit, "--memory-limit");
  if (f.elastic) return run_train_elastic(f, spec, std::move(job));
  zerod::resolve_job(job.config, spec.world_size());
  zerod::check_supported(job.config);
  if (job.config.elasticity.enabled) {
    if (const char* scheduler = std::getenv("DEEPSPEED_ELASTICITY_CONFIG"))
      zerod::check_scheduler_elastic_config(job.config.elasticity, scheduler);
    spdlog::info("{}", zerod::elastic_summary(job.config));
  }
  // What the job needs from this machine (data, init_from, GPU, nvme_path, checkpoint_dir),
  // before the rendezvous makes other nodes wait for it.
  zerod::check_job_environment(job.config, {.local_ranks = spec.nproc_per_node});
  if (f.job.empty())
    spdlog::info("no job file: training the built-in demo job (data and metrics in ./{}/)",
                 f.demo_dir);
  const int threads = zerod::threads_per_rank(spec, zerod::cpu_info().cores,
                                              static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  if (!f.listen.empty()) {
    // Commands reach the ranks through global rank 0's step agreement, so one control plane
    // per job: not yet for the nodes of a job of several.
    if (spec.nnodes > 1) {
      ZD_THROW_INPUT(
          "--listen {}: a job of several nodes (--nnodes {}) cannot serve a control plane yet; "
          "run it under `zerod serve --nnodes {}` daemons, or without --listen",
          f.listen, spec.nnodes, spec.nnodes);
    }
    spdlog::info("zerod {}: {} local rank{}, {} threads per rank, matmul engine {}", kVersion,
                 spec.nproc_per_node, spec.nproc_per_node == 1 ? "" : "s", threads,
                 zerod::cpu::gemm_impl_name(zerod::cpu::gemm_impl()));
    return run_train_listening(f, spec, std::move(job.config), threads);
  }
  auto session = start_session(spec, job.config);
  const zerod::NodeInfo& info = session->info();
  spdlog::info(
      "zerod {}: node {} of {}, ranks {}..{} of {} (topology from {}{}), {} threads per rank, "
      "matmul engine {}",
      kVersion, info.node_rank, info.nnodes, info.first_rank,
      info.first_rank + info.nproc_per_node - 1, info.world_size, spec.source,
      spec.local_processes > 1 ? fmt::format(", process {} of {} on this machine",
                                             spec.local_process, spec.local_processes)
                               : "",
      threads, zerod::cpu::gemm_impl_name(zerod::cpu::gemm_impl()));
  if (zerod::is_elastic_worker()) spdlog::info("{}", zerod::elastic_worker_summary());
  const std::unique_ptr<zerod::MetricsSink> metrics = start_metrics(f.metrics_port);
  zerod::RunJobOptions ro;
  ro.resume = f.resume;
  ro.metrics = metrics.get();
  ro.threads_per_rank = threads;
  ro.local_processes = spec.local_processes;
  ro.local_process = spec.local_process;
  try {
    const zerod::JobOutcome outcome = zerod::run_job(job.config, *session, ro);
    if (outcome.stopped) {
      session->leave("");
      // Under an elastic agent a stop is not the job's end: the agent rejoins or exits.
      return zerod::is_elastic_worker() ? 10 : 0;
    }
  } catch (const zerod::Error& e) {
    if (e.kind() != zerod::ErrorKind::kPeerLost) throw;
    // A broken connection is often seen a moment before the rendezvous learns which node died:
    // give it a second, then say both.
    for (int i = 0; i < 100 && !session->world_failed(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!session->world_failed()) throw;
    throw zerod::Error(zerod::ErrorKind::kPeerLost,
                       fmt::format("{}\n  cause: {}", e.what(), session->failure_reason()));
  }
  session->leave("");
  return 0;
}

struct ServeFlags {
  std::string listen;  // empty: the private Unix socket (engine/runtime/grpc/endpoint.h)
  bool insecure_loopback = false;
  std::string state_dir;  // empty: $XDG_STATE_HOME/zerod or ~/.local/state/zerod
  std::string token_file, tls_cert, tls_key, tls_ca;
  int nproc_per_node = 1, nnodes = 1, node_rank = 0, rendezvous_port = 29500;
  std::string master;  // node daemons: the master daemon's --listen
  int metrics_port = -1;
  int max_watchers = 256;  // ControlService::kDefaultMaxWatchers
};

int run_serve(const ServeFlags& f) {
#ifdef ZEROD_HAVE_GRPC
  zerod::install_stop_signals(/*sigint=*/true);
  zerod::LaunchSpec spec;
  spec.nnodes = f.nnodes;
  spec.node_rank = f.node_rank;
  spec.nproc_per_node = f.nproc_per_node;
  spec.source = "flags";
  if (f.node_rank >= f.nnodes) {
    ZD_THROW_INPUT("--node-rank {}: must be below --nnodes {}", f.node_rank, f.nnodes);
  }
  if (f.node_rank > 0 && f.master.empty()) {
    ZD_THROW_INPUT("--node-rank {}: a node daemon needs --master (the master daemon's --listen)",
                   f.node_rank);
  }
  std::string listen = f.listen;
  if (listen.empty()) {
    if (f.nnodes > 1 && f.node_rank == 0) {
      ZD_THROW_INPUT(
          "--nnodes {}: node daemons reach the master over TCP: give the master --listen "
          "HOST:PORT and --token-file (or, all on one machine, --listen 127.0.0.1:PORT "
          "--insecure-loopback)",
          f.nnodes);
    }
    listen = zerod::default_control_address();
  } else if (f.nnodes > 1 && f.node_rank == 0 && zerod::is_unix_address(listen)) {
    ZD_THROW_INPUT(
        "--listen {}: the master of --nnodes {} must listen on TCP (HOST:PORT), where "
        "node daemons can reach it",
        listen, f.nnodes);
  }
  zerod::ControlServerOptions so;
  so.listen = listen;
  so.max_watchers = f.max_watchers;
  so.security.tls_cert = f.tls_cert;
  so.security.tls_key = f.tls_key;
  so.security.insecure_loopback = f.insecure_loopback;
  if (!f.token_file.empty()) so.security.token = zerod::read_token_file(f.token_file);
  // The address's policy before anything is made (the server checks it again when it binds).
  zerod::check_listen_policy(listen,
                             zerod::is_unix_address(listen)
                                 ? ""
                                 : zerod::parse_host_port(listen, "--listen", /*min_port=*/0).first,
                             so.security);
  if (so.security.insecure_loopback && so.security.token.empty()) {
    spdlog::warn(
        "--insecure-loopback: any local user can drive this daemon on {} without a token, and "
        "its jobs read and write files as this user",
        listen);
  }
  if (f.listen.empty()) {
    zerod::ensure_private_dir(zerod::default_socket_dir(), "the control socket's directory");
  }
  zerod::set_client_token(so.security.token);
  // A job's client may not be able to read the files the job makes the daemon read: their values
  // are not quoted in its errors (the job file's own are).
  zerod::config::set_quote_file_values(false);
  // The jobs' Rendezvous service carries the same token: with TLS on the control plane it is
  // served over TLS too (the master's certificate), and the clients trust --tls-ca (the master,
  // without one: its own certificate, as a self-signed one is).
  if (f.nnodes > 1) {
    const bool hosts = f.node_rank == 0;
    const std::string ca = !f.tls_ca.empty() ? f.tls_ca : (hosts ? f.tls_cert : "");
    zerod::set_rendezvous_tls(hosts ? f.tls_cert : "", hosts ? f.tls_key : "", ca);
  }
  zerod::DaemonOptions dopt;
  dopt.spec = spec;
  dopt.master_control = f.master;
  if (f.nnodes > 1 && f.node_rank == 0) {
    dopt.rendezvous = zerod::join_host_port(
        zerod::parse_host_port(listen, "--listen", /*min_port=*/0).first, f.rendezvous_port);
  }
  dopt.start_session = [](const zerod::LaunchSpec& s, const zerod::JobConfig& cfg) {
    return start_session(s, cfg);
  };
  // The journal: one daemon per state directory; a job it ran before a kill is interrupted now.
  zerod::StateDir state(f.state_dir.empty() ? zerod::default_state_dir() : f.state_dir);
  dopt.state = &state;
  const std::unique_ptr<zerod::MetricsSink> metrics =
      start_metrics(f.metrics_port, so.security.token);
  dopt.metrics = metrics.get();
  zerod::Daemon daemon(dopt);
  zerod::ControlServer server(daemon, so);
  std::unique_ptr<zerod::Follower> follower;
  if (f.node_rank > 0) {
    zerod::ClientSecurity cs;
    cs.token = so.security.token;
    cs.tls_ca = f.tls_ca;
    follower = std::make_unique<zerod::Follower>(daemon, f.master, cs, f.node_rank, f.nnodes,
                                                 f.nproc_per_node);
  }
  spdlog::info(
      "zerod {} serve: control plane listening on {} ({}{}), {} local rank{} per job, state in {}",
      kVersion, server.address(),
      !so.security.token.empty()       ? "token required"
      : zerod::is_unix_address(listen) ? "this user only"
                                       : "no token: any local user",
      so.security.tls_cert.empty() ? "" : ", TLS", spec.nproc_per_node,
      spec.nproc_per_node == 1 ? "" : "s", state.dir());
  while (!zerod::stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The running job sees the same request at its next step boundary: it checkpoints (when it
  // has a checkpoint dir) and stops.
  spdlog::info("stop signal {}: {}", zerod::stop_signal(),
               daemon.busy() ? "checkpointing the running job, then exiting" : "exiting");
  daemon.wait_idle(std::chrono::hours(24));
  follower.reset();
  server.shutdown();
  const zerod::DaemonStatus st = daemon.status();
  if (!st.job_id.empty()) {
    spdlog::info("{}: {}{}", st.job_id, zerod::job_state_name(st.state),
                 st.progress.last_checkpoint.empty()
                     ? ""
                     : ", last checkpoint " + st.progress.last_checkpoint);
  }
  return 0;
#else
  (void)f;
  ZD_THROW_INPUT("zerod serve: this zerod was built without gRPC, which the control plane needs");
#endif
}

int run_check(const std::string& path, int world_size, bool config_only) {
  zerod::ParsedJob job = zerod::load_job_file(path);
  for (const auto& w : job.warnings)
    std::fprintf(stderr, "zerod: warning: %s: %s\n", path.c_str(), w.c_str());
  zerod::resolve_job(job.config, world_size);
  zerod::check_supported(job.config, /*running=*/false);
  // A mixture-of-experts model's MoE blocks, experts and their parameters.
  if (job.config.model.moe.num_experts > 0) {
    std::fprintf(stderr, "zerod: %s\n",
                 zerod::describe_moe(zerod::model_spec(job.config.model)).c_str());
  }
  // A pipeline's stages and schedule (the job cannot run yet: check_supported refuses it then).
  if (job.config.parallelism.pipeline > 1)
    std::fputs(zerod::format_pipeline_plan(zerod::make_pipeline_plan(job.config)).c_str(), stderr);
  // Elasticity: the valid world sizes and the batch triangle of each.
  if (job.config.elasticity.enabled)
    std::fputs(zerod::format_elastic_plan(job.config).c_str(), stderr);
  // What `zerod train` checks at the start on this machine (nothing is created).
  if (!config_only) zerod::check_job_environment(job.config);
  // What bf16 computes with on this machine's CPU (the backend logs the same line at the start).
  if (!config_only && job.config.train.device == zerod::TrainDevice::kCpu &&
      job.config.compute_dtype() == zerod::DType::kBF16) {
    std::fprintf(stderr, "zerod: %s\n", zerod::cpu::bf16_products_note().c_str());
  }
  std::cout << zerod::job_to_json(job.config).dump(2) << std::endl;
  return 0;
}

int run_eval(const std::string& path, zerod::EvalOptions o) {
  zerod::ParsedJob job = zerod::load_job_file(path);
  print_warnings(job);
  // The sample's tokenizer: the job's data.tokenizer, else the one the weights' directory
  // carries (--from, or the job's own checkpoint dir). Without one there is no sample.
  std::shared_ptr<const zerod::tokenizer::Tokenizer> tok;
  if (std::optional<zerod::JobTokenizer> jt = zerod::load_job_tokenizer(job.config)) {
    tok = jt->tokenizer;
  } else {
    std::error_code ec;
    const std::string& ckpt = job.config.train.checkpoint_dir;
    const std::string from =
        !o.from.empty() ? o.from
        : (!ckpt.empty() && std::filesystem::exists(std::filesystem::path(ckpt) / "latest", ec))
            ? ckpt
            : std::string();
    tok = zerod::load_source_tokenizer(from, "latest");
  }
  if (!tok) o.sample_tokens = 0;
  const zerod::EvalResult r = zerod::evaluate_job(job.config, o);
  std::printf("val loss %.6f | perplexity %.4f | %lld tokens | %s\n", r.loss, r.perplexity,
              static_cast<long long>(r.tokens), r.source.c_str());
  if (r.sample && tok) {
    // The first validation sample's start, then what the model writes after it (greedy).
    std::printf("sample (%s): %s[[%s]]\n", tok->describe().c_str(),
                tok->decode(r.sample->prompt).c_str(), tok->decode(r.sample->generated).c_str());
  }
  return 0;
}

struct GenerateFlags {
  zerod::GenerateOptions options;
  std::string prompt_tokens, prompt_text, tokenizer;
  int64_t eos = -1;
};

// The tokenizer of a generate call: --tokenizer, else the --from directory's own (a Hugging Face
// directory holding one this binary loads, or the tokenizer a checkpoint's job had), else none.
std::unique_ptr<zerod::tokenizer::Tokenizer> generate_tokenizer(const GenerateFlags& f) {
  if (!f.tokenizer.empty()) return zerod::tokenizer::load_tokenizer(f.tokenizer);
  return zerod::load_source_tokenizer(f.options.from, f.options.tag);
}

int run_generate(GenerateFlags& f) {
  if (f.prompt_text.empty() && f.prompt_tokens.empty()) {
    ZD_THROW_INPUT(
        "give the prompt: --prompt \"text\" (with a tokenizer) or --prompt-tokens 1,2,3");
  }
  if (!f.prompt_text.empty() && !f.prompt_tokens.empty()) {
    ZD_THROW_INPUT("give the prompt once: --prompt or --prompt-tokens, not both");
  }
  const std::unique_ptr<zerod::tokenizer::Tokenizer> tok = generate_tokenizer(f);
  if (!f.prompt_text.empty()) {
    ZD_CHECK_INPUT(tok != nullptr,
                   "--prompt \"...\" needs a tokenizer: give --tokenizer PATH (tokenizer.json, "
                   "vocab.json + merges.txt, or the directory holding them), or --from a Hugging "
                   "Face directory that holds one, or the prompt as token ids with "
                   "--prompt-tokens 1,2,3");
    f.options.prompt = tok->encode_with_specials(f.prompt_text);
    ZD_CHECK_INPUT(!f.options.prompt.empty(), "--prompt: the text encodes to no tokens");
  }
  size_t start = 0;
  while (!f.prompt_tokens.empty() && start <= f.prompt_tokens.size()) {
    const size_t comma = f.prompt_tokens.find(',', start);
    const std::string item = f.prompt_tokens.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || end == item.c_str() || *end != '\0' || errno != 0 || v < 0 ||
        v > INT32_MAX) {
      ZD_THROW_INPUT("--prompt-tokens: \"{}\" is not a token id (comma-separated integers >= 0)",
                     item.size() > 32 ? item.substr(0, 32) + "..." : item);
    }
    f.options.prompt.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (f.eos >= 0) {
    f.options.eos_token = static_cast<int32_t>(f.eos);
  } else if (tok != nullptr && tok->eos_id()) {
    f.options.eos_token = *tok->eos_id();  // the tokenizer's end of text
  }
  const zerod::GenerateResult r = zerod::generate(f.options);
  std::string ids;
  for (int32_t t : r.tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
  if (tok != nullptr) {
    // With a tokenizer: the new text on stdout, the ids on stderr.
    std::printf("%s\n", tok->decode(r.tokens).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "zerod: tokenizer %s; prompt ids %zu, new ids: %s\n",
                 tok->describe().c_str(), f.options.prompt.size(), ids.c_str());
  } else {
    std::printf("%s\n", ids.c_str());
    std::fflush(stdout);
  }
  const double per = r.tokens.size() > 1 ? r.decode_seconds / (r.tokens.size() - 1) : 0;
  std::fprintf(stderr,
               "zerod: %zu prompt tokens, %zu new from %s | load %.2f s | prefill %.1f ms | "
               "decode %.2f ms/token\n",
               f.options.prompt.size(), r.tokens.size(), r.model.c_str(), r.load_seconds,
               r.prefill_seconds * 1e3, per * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A peer that dies closes sockets we may be writing to: that must be an error to handle
  // (exit code 3 naming the peer), not a silent death by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  zerod::log::init();
  zerod::install_stop_signals();
  CLI::App app{"zerod: a per-node training engine (DeepSpeed-style ZeRO, no Python in the loop)"};
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off");

  TrainFlags tf;
  auto* train = app.add_subcommand("train", "Train a job; with no job file, the built-in demo job");
  train->add_option("job", tf.job, "job file (DeepSpeed ds_config JSON + model/data/train)")
      ->check(CLI::ExistingFile);
  int nproc = 1, node_rank = 0;
  std::string master, nnodes_text;
  auto* nproc_opt = train->add_option("--nproc-per-node", nproc, "local ranks (threads)")
                        ->check(CLI::PositiveNumber);
  auto* nnodes_opt = train->add_option(
      "--nnodes", nnodes_text,
      "nodes (zerod processes) in the job; MIN:MAX: elastic (nodes may leave and join, "
      "docs/elastic.md)");
  zerod::ElasticFlags elastic_flags;
  auto* max_restarts_opt =
      train
          ->add_option("--max-restarts", elastic_flags.max_restarts,
                       "with --nnodes MIN:MAX: failures the job survives before it ends")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
  auto* settle_opt = train
                         ->add_option("--settle", elastic_flags.settle_seconds,
                                      "with --nnodes MIN:MAX: seconds the first round waits for "
                                      "more nodes once MIN are there")
                         ->check(CLI::NonNegativeNumber)
                         ->capture_default_str();
  auto* node_rank_opt =
      train->add_option("--node-rank", node_rank, "this node's rank (default: assigned at join)")
          ->check(CLI::NonNegativeNumber);
  auto* master_opt =
      train->add_option("--master", master, "HOST:PORT of the rendezvous (node 0 serves it)");
  train->add_option("--resume", tf.resume,
                    "continue from a checkpoint of train.checkpoint_dir: latest, auto (latest if "
                    "there is one, else start fresh) or a tag");
  train->add_option("--listen", tf.listen,
                    "unix:PATH or ADDR:PORT: serve this job's control plane (zeroctl status, "
                    "checkpoint, stop) until it ends, with zerod serve's rules (TCP needs "
                    "--token-file, or --insecure-loopback on 127.0.0.1)");
  train->add_option(
      "--token-file", tf.token_file,
      "file whose first line is the bearer token: every RPC of --listen's control plane, and "
      "of the rendezvous of a job of several nodes (--nnodes N), must carry it");
  train->add_flag("--insecure-loopback", tf.insecure_loopback,
                  "with --listen 127.0.0.1:PORT: no token (any local user can drive the job)");
  train->add_option("--tls-cert", tf.tls_cert, "with --listen: PEM certificate (serve TLS)");
  train->add_option("--tls-key", tf.tls_key, "with --listen: PEM private key of --tls-cert");
  train->add_option("--steps", tf.steps, "override train.steps")->check(CLI::PositiveNumber);
  train->add_option("--memory-limit", tf.memory_limit,
                    "host memory this process may use (e.g. 20GiB; default: what is available)");
  train
      ->add_option("--metrics-port", tf.metrics_port,
                   "serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any port)")
      ->check(CLI::Range(0, 65535));
  train->add_option("--demo-dir", tf.demo_dir, "where the demo job keeps its data and metrics")
      ->capture_default_str();

  std::string check_path;
  int world_size = 1;
  auto* check = app.add_subcommand("check", "Validate a job file and print the resolved config");
  check->add_option("job", check_path, "job file")->required();
  check->add_option("--world-size", world_size, "ranks to resolve the batch sizes for")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bool config_only = false;
  check->add_flag("--config-only", config_only,
                  "check the file alone, not this machine (data files, init_from, GPU, "
                  "nvme_path, checkpoint_dir)");

  std::string eval_path;
  zerod::EvalOptions eo;
  auto* eval = app.add_subcommand(
      "eval", "Validation loss and perplexity of a checkpoint or Hugging Face model");
  eval->add_option("job", eval_path, "job file (its model and validation data)")->required();
  eval->add_option("--from", eo.from,
                   "a checkpoint dir (newest complete checkpoint) or a Hugging Face directory "
                   "(default: the job's train.checkpoint_dir, else its initial weights)");
  eval->add_option("--tokens", eo.tokens, "evaluate about N tokens (default: all)")
      ->check(CLI::PositiveNumber);
  eval->add_option("--sample-tokens", eo.sample_tokens,
                   "with a tokenizer (data.tokenizer, or the --from directory's): print the first "
                   "validation sample's start and the model's greedy continuation of N tokens "
                   "(0: no sample)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));

  GenerateFlags gf;
  auto* gen = app.add_subcommand(
      "generate", "Generate tokens from a checkpoint or Hugging Face model (KV cache)");
  gen->add_option("--from", gf.options.from, "checkpoint dir or Hugging Face directory")
      ->required();
  gen->add_option("--tag", gf.options.tag, "checkpoint tag (checkpoint dirs)")
      ->capture_default_str();
  gen->add_option("--prompt-tokens", gf.prompt_tokens, "prompt token ids: 1,2,3");
  gen->add_option("--prompt", gf.prompt_text,
                  "prompt text, encoded with the tokenizer (the new text is printed, its ids go "
                  "to stderr)");
  gen->add_option("--tokenizer", gf.tokenizer,
                  "tokenizer.json, vocab.json + merges.txt or their directory (default: the "
                  "--from directory's, if it holds one)");
  gen->add_option("--max-new-tokens", gf.options.max_new_tokens, "tokens to generate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  gen->add_option("--temperature", gf.options.temperature, "0: greedy; > 0: sample")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  gen->add_option("--top-k", gf.options.top_k, "sample among the K most likely (0: all)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--top-p", gf.options.top_p, "nucleus sampling threshold (1: off)")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--seed", gf.options.seed, "sampling seed")->capture_default_str();
  gen->add_option("--eos-token", gf.eos, "stop after this token id")->check(CLI::NonNegativeNumber);

  ServeFlags sf;
  auto* serve = app.add_subcommand(
      "serve", "Run the daemon: jobs are submitted and controlled over gRPC (zeroctl)");
  serve->add_option(
      "--listen", sf.listen,
      "unix:PATH or ADDR:PORT of the control plane (default: the private Unix "
      "socket $XDG_RUNTIME_DIR/zerod/zerod.sock, else /run/user/UID/zerod/zerod.sock, "
      "else ~/.cache/zerod/zerod.sock; a TCP address needs --token-file)");
  serve->add_option("--token-file", sf.token_file,
                    "file whose first line is the bearer token every RPC must carry (required "
                    "to listen on TCP)");
  serve->add_flag("--insecure-loopback", sf.insecure_loopback,
                  "allow --listen 127.0.0.1:PORT without a token: any local user can then drive "
                  "the daemon (logged as a warning)");
  serve->add_option("--state-dir", sf.state_dir,
                    "where the daemon keeps its journal (the current job, the job count); one "
                    "daemon per directory (default $XDG_STATE_HOME/zerod, else "
                    "~/.local/state/zerod)");
  serve->add_option("--tls-cert", sf.tls_cert, "PEM certificate (serve TLS)");
  serve->add_option("--tls-key", sf.tls_key, "PEM private key of --tls-cert");
  serve->add_option("--tls-ca", sf.tls_ca, "node daemons: PEM certificate the master serves");
  serve
      ->add_option("--metrics-port", sf.metrics_port,
                   "serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any port)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--nproc-per-node", sf.nproc_per_node, "local ranks (threads) of every job")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--nnodes", sf.nnodes, "daemons (one per node) that run every job together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve
      ->add_option("--node-rank", sf.node_rank,
                   "0: the master (jobs are submitted to it); R > 0: a node daemon")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve->add_option("--master", sf.master, "node daemons: the master daemon's --listen address");
  serve
      ->add_option("--max-watchers", sf.max_watchers,
                   "WatchStatus streams (zeroctl status --watch) open at once; one more is "
                   "refused with RESOURCE_EXHAUSTED")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  serve
      ->add_option("--rendezvous-port", sf.rendezvous_port,
                   "master of several nodes: the port (on its --listen host) of each job's "
                   "Rendezvous service")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();

  // The first word that is not an option must name a command.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--log-level") {
      ++i;
      continue;
    }
    if (word.rfind("-", 0) == 0) continue;
    if (word != "train" && word != "check" && word != "serve" && word != "eval" &&
        word != "generate") {
      std::fprintf(stderr,
                   "zerod: unknown command '%s' (commands: train, check, eval, generate, serve; "
                   "see zerod --help)\n",
                   word.c_str());
      return 2;
    }
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help/version (code 0) or the error
    return code == 0 ? 0 : 2;
  }

  // Launch flags not given stay unset: the launcher's environment (torchrun, Slurm, Open MPI)
  // fills them in.
  if (nproc_opt->count()) tf.launch.nproc_per_node = nproc;
  if (nnodes_opt->count()) {
    try {
      if (const auto range = zerod::parse_nnodes_range(nnodes_text)) {
        elastic_flags.min_nodes = range->first;
        elastic_flags.max_nodes = range->second;
        tf.elastic = elastic_flags;
        tf.launch.nnodes = range->second;  // node ranks below MAX
      } else {
        size_t used = 0;
        int n = 0;
        try {
          n = std::stoi(nnodes_text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != nnodes_text.size() || n < 1)
          ZD_THROW_INPUT("--nnodes {}: a positive node count, or MIN:MAX", nnodes_text);
        tf.launch.nnodes = n;
      }
    } catch (...) {
      return zerod::report_current_exception("zerod");
    }
  }
  if (!tf.elastic && (max_restarts_opt->count() || settle_opt->count())) {
    std::fprintf(stderr,
                 "zerod: --max-restarts and --settle are for elastic jobs (--nnodes MIN:MAX)\n");
    return 2;
  }
  if (log_level != "info") tf.global_args = {"--log-level", log_level};
  if (node_rank_opt->count()) tf.launch.node_rank = node_rank;
  if (master_opt->count()) tf.launch.master = master;

  try {
    zerod::log::set_level(log_level);
    if (*train) return run_train(tf);
    if (*check) return run_check(check_path, world_size, config_only);
    if (*eval) return run_eval(eval_path, eo);
    if (*gen) return run_generate(gf);
    if (*serve) return run_serve(sf);
  } catch (...) {
    return zerod::report_current_exception("zerod");
  }
  return 0;
}
