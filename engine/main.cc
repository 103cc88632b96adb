// zerod: the per-node training engine.
//
//   zerod train [JOB.json] [--steps N] [--demo-dir DIR] [--nproc-per-node N]
//               [--nnodes N --node-rank R --master HOST:PORT] [--resume latest|TAG] [--listen
//               ADDR:PORT]
//   zerod check JOB.json [--world-size N]
//
// Exit codes: 0 ok, 1 internal error, 2 bad input (job file, data, flags), 3 lost peer.
#include <omp.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "core/log.h"
#include "engine/config/parse.h"
#include "engine/train/demo.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/gemm.h"

namespace {

constexpr const char* kVersion = "0.1.0";

struct TrainFlags {
  std::string job;
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master;
  std::string resume;
  std::string listen;
  std::string demo_dir = "zerod-demo";
  int64_t steps = 0;  // > 0: overrides train.steps
};

void print_warnings(const zerod::ParsedJob& job) {
  for (const auto& w : job.warnings) spdlog::warn("{}: {}", job.config.source, w);
}

// Flags of features later work builds: recognised, refused with a clear message.
void refuse_unbuilt(const TrainFlags& f) {
  if (f.nproc_per_node != 1)
    ZD_THROW_INPUT("--nproc-per-node {}: multiple ranks are not implemented yet in zerod",
                   f.nproc_per_node);
  if (f.nnodes != 1 || f.node_rank != 0 || !f.master.empty())
    ZD_THROW_INPUT(
        "--nnodes/--node-rank/--master: multi-node training is not implemented yet in zerod");
  if (!f.resume.empty())
    ZD_THROW_INPUT("--resume {}: checkpoints are not implemented yet in zerod", f.resume);
  if (!f.listen.empty())
    ZD_THROW_INPUT("--listen {}: the control plane is not implemented yet in zerod", f.listen);
}

int run_train(const TrainFlags& f) {
  refuse_unbuilt(f);
  zerod::ParsedJob job =
      f.job.empty() ? zerod::prepare_demo_job(f.demo_dir) : zerod::load_job_file(f.job);
  print_warnings(job);
  if (f.steps > 0) job.config.train.steps = f.steps;
  zerod::resolve_job(job.config, 1);
  zerod::check_supported(job.config);
  if (f.job.empty())
    spdlog::info("no job file: training the built-in demo job (data and metrics in ./{}/)",
                 f.demo_dir);
  spdlog::info("zerod {}: {} threads, matmul engine {}", kVersion, omp_get_max_threads(),
               zerod::cpu::gemm_impl_name(zerod::cpu::gemm_impl()));
  zerod::Trainer trainer(std::move(job.config));
  trainer.run();
  return 0;
}

int run_check(const std::string& path, int world_size) {
  zerod::ParsedJob job = zerod::load_job_file(path);
  for (const auto& w : job.warnings)
    std::fprintf(stderr, "zerod: warning: %s: %s\n", path.c_str(), w.c_str());
  zerod::resolve_job(job.config, world_size);
  zerod::check_supported(job.config);
  std::cout << zerod::job_to_json(job.config).dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zerod::log::init();
  CLI::App app{"zerod: a per-node training engine (DeepSpeed-style ZeRO, no Python in the loop)"};
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off");

  TrainFlags tf;
  auto* train = app.add_subcommand("train", "Train a job; with no job file, the built-in demo job");
  train->add_option("job", tf.job, "job file (DeepSpeed ds_config JSON + model/data/train)")
      ->check(CLI::ExistingFile);
  train->add_option("--nproc-per-node", tf.nproc_per_node, "local ranks")
      ->check(CLI::PositiveNumber);
  train->add_option("--nnodes", tf.nnodes, "nodes in the job")->check(CLI::PositiveNumber);
  train->add_option("--node-rank", tf.node_rank, "this node's rank")->check(CLI::NonNegativeNumber);
  train->add_option("--master", tf.master, "HOST:PORT of the rendezvous");
  train->add_option("--resume", tf.resume, "latest or a checkpoint tag");
  train->add_option("--listen", tf.listen, "ADDR:PORT for the control plane");
  train->add_option("--steps", tf.steps, "override train.steps")->check(CLI::PositiveNumber);
  train->add_option("--demo-dir", tf.demo_dir, "where the demo job keeps its data and metrics")
      ->capture_default_str();

  std::string check_path;
  int world_size = 1;
  auto* check = app.add_subcommand("check", "Validate a job file and print the resolved config");
  check->add_option("job", check_path, "job file")->required();
  check->add_option("--world-size", world_size, "ranks to resolve the batch sizes for")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  // The first word that is not an option must name a command.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--log-level") {
      ++i;
      continue;
    }
    if (word.rfind("-", 0) == 0) continue;
    if (word != "train" && word != "check") {
      std::fprintf(stderr,
                   "zerod: unknown command '%s' (commands: train, check; see zerod --help)\n",
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

  try {
    zerod::log::set_level(log_level);
    if (*train) return run_train(tf);
    if (*check) return run_check(check_path, world_size);
  } catch (const zerod::Error& e) {
    if (e.kind() == zerod::ErrorKind::kInternal) {
      std::fprintf(stderr, "zerod: internal error (%s): %s\n", e.where().c_str(), e.what());
    } else {
      std::fprintf(stderr, "zerod: error: %s\n", e.what());
    }
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
