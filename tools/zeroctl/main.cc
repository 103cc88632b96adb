// zeroctl: the zerod command-line client.
//
//   zeroctl [--addr unix:PATH|HOST:PORT] [--token-file F] [--tls-ca F] COMMAND
//     submit JOB.json [--resume latest|TAG]
//     status [--watch] [--json]
//     checkpoint save [--tag T [--overwrite]] | checkpoint list [--json]
//     resume [--tag T]
//     stop [--checkpoint] [--timeout S | --no-wait]
//     export CKPT_DIR [--tag T] --out DIR|model.safetensors [--dtype fp32|bf16]
//            [--max-shard-size 5GB] [--force]
//     plan --model gpt2-1.5b|N_PARAMS|JOB.json --world N [--gpu-mem 80GiB] [--cpu-mem B]
//          [--offload none|cpu|nvme] [--micro-batch B] [--seq T] [--dtype bf16|fp16|fp32]
//          [--activation-checkpointing] [--ranks-per-node R] [--tensor T] [--sequence-parallel]
//          [--expert E]
//
// Exit codes: 0 ok, 1 internal error (or the job failed: status --watch, stop), 2 bad usage, bad
// input or a request the daemon rejected, 3 the daemon cannot be reached, 4 unauthenticated,
// 5 stop: the job had not stopped within --timeout.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/checkpoint/export.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "engine/plan/planner.h"
#ifdef ZEROD_HAVE_GRPC
#include "tools/zeroctl/control_client.h"
#endif

namespace {

constexpr const char* kVersion = "0.1.0";

struct ExportFlags {
  std::string dir;
  std::string tag = "latest";
  std::string out;
  std::string dtype = "fp32";
  std::string max_shard_size = "5GB";
  bool force = false;
};

int run_export(const ExportFlags& f) {
  zerod::Stopwatch sw;
  const int64_t max_shard = zerod::parse_bytes(f.max_shard_size, "--max-shard-size");
  const zerod::ExportReport r = zerod::export_checkpoint(
      f.dir, f.tag, f.out, zerod::parse_dtype(f.dtype), f.force, max_shard);
  for (const std::string& s : r.skipped) spdlog::warn("passed over {}", s);
  const double secs = sw.seconds();
  if (r.files.size() == 1 && r.files[0] == f.out) {
    std::printf(
        "exported %s/%s (global step %lld, %lld parameters) to %s: %s, %.1f MB, crc32c %08x, "
        "%.2f s (%.0f MB/s)\n",
        f.dir.c_str(), r.tag.c_str(), static_cast<long long>(r.global_step),
        static_cast<long long>(r.parameters), f.out.c_str(), f.dtype.c_str(),
        static_cast<double>(r.file.bytes) / 1e6, r.file.crc32c, secs,
        static_cast<double>(r.file.bytes) / 1e6 / std::max(secs, 1e-9));
  } else {
    std::printf(
        "exported %s/%s (global step %lld, %lld parameters) to the Hugging Face directory %s: "
        "%s, %zu weight file%s, %.1f MB, %.2f s (%.0f MB/s)\n",
        f.dir.c_str(), r.tag.c_str(), static_cast<long long>(r.global_step),
        static_cast<long long>(r.parameters), f.out.c_str(), f.dtype.c_str(), r.files.size(),
        r.files.size() == 1 ? "" : "s", static_cast<double>(r.file.bytes) / 1e6, secs,
        static_cast<double>(r.file.bytes) / 1e6 / std::max(secs, 1e-9));
  }
  return 0;
}

struct PlanFlags {
  std::string model;
  int world = 1, micro_batch = 1, seq = 1024, ranks_per_node = 8;
  int tensor = 1;  // parallelism.tensor (a job file's unless --tensor is given)
  int expert = 1;  // parallelism.expert (likewise)
  std::string gpu_mem, cpu_mem, offload, dtype = "bf16";
  bool act_ckpt = false;
  bool sequence_parallel = false;  // parallelism.sequence_parallel (likewise)
};

int run_plan(const PlanFlags& f, CLI::App& cmd) {
  zerod::PlanRequest r;
  r.world = f.world;
  r.tensor = f.tensor;
  r.expert = f.expert;
  r.sequence_parallel = f.sequence_parallel;
  r.micro_batch = f.micro_batch;
  r.seq = f.seq;
  r.activation_checkpointing = f.act_ckpt;
  r.ranks_per_node = std::min(f.ranks_per_node, f.world);
  r.offload = f.offload;
  r.compute_bytes = f.dtype == "fp32" ? 4 : 2;
  if (!f.gpu_mem.empty()) r.device_bytes = zerod::parse_bytes(f.gpu_mem, "--gpu-mem");
  if (!f.cpu_mem.empty()) r.host_bytes = zerod::parse_bytes(f.cpu_mem, "--cpu-mem");
  std::string source = f.model;
  if (auto preset = zerod::model_preset(f.model)) {
    r.spec = *preset;
    r.spec->seq_len = std::max(r.spec->seq_len, f.seq);
  } else if (f.model.size() > 5 && f.model.substr(f.model.size() - 5) == ".json") {
    zerod::ParsedJob job = zerod::load_job_file(f.model);
    // The job's parallelism section, unless the command line overrides it: resolving checks that
    // tensor x context divides the world and sizes the micro-batch for the data-parallel ranks.
    if (cmd.get_option("--tensor")->count()) job.config.parallelism.tensor = f.tensor;
    if (cmd.get_option("--sequence-parallel")->count())
      job.config.parallelism.sequence_parallel = f.sequence_parallel;
    if (cmd.get_option("--expert")->count()) job.config.parallelism.expert = f.expert;
    zerod::resolve_job(job.config, f.world);
    const zerod::JobConfig& c = job.config;
    r.context = c.parallelism.context;
    r.context_impl = c.parallelism.context_impl;
    r.tensor = c.parallelism.tensor;
    r.expert = c.parallelism.expert;
    r.sequence_parallel = c.parallelism.sequence_parallel;
    r.spec = zerod::model_spec(c.model);
    if (!cmd.get_option("--micro-batch")->count())
      r.micro_batch = static_cast<int>(c.micro_batch());
    if (!cmd.get_option("--seq")->count()) r.seq = c.model.seq_len;
    if (!cmd.get_option("--dtype")->count())
      r.compute_bytes = c.compute_dtype() == zerod::DType::kF32 ? 4 : 2;
    if (!cmd.get_option("--activation-checkpointing")->count())
      r.activation_checkpointing = c.model.activation_checkpointing;
  } else {
    char* end = nullptr;
    const double n = std::strtod(f.model.c_str(), &end);
    double mult = 1;
    if (end && (*end == 'B' || *end == 'b'))
      mult = 1e9, ++end;
    else if (end && (*end == 'M' || *end == 'm'))
      mult = 1e6, ++end;
    if (end == f.model.c_str() || *end != '\0' || !(n > 0)) {
      ZD_THROW_INPUT(
          "--model {}: expected gpt2, gpt2-medium, gpt2-large, gpt2-xl (gpt2-1.5b), a "
          "parameter count (1.5e9, 1.5B, 350M) or a job file (.json)",
          f.model);
    }
    r.params = static_cast<int64_t>(n * mult);
    source = fmt::format("{} parameters (no shape: activations not counted)", r.params);
  }
  const zerod::Plan plan = zerod::make_plan(r);
  std::printf(
      "model %s: %.3fB parameters (%.3fB as laid out%s), world %d = tensor %d x %sdata-parallel "
      "%d%s, %s, micro-batch %d x %d%s\n",
      source.c_str(), static_cast<double>(plan.parameters) / 1e9,
      static_cast<double>(plan.padded_parameters) / 1e9,
      plan.tensor_parallel > 1 ? " per tensor-parallel rank"
      : r.expert > 1           ? " per rank"
                               : "",
      f.world, plan.tensor_parallel,
      r.context > 1 ? fmt::format("context {} ({}) x ", r.context, r.context_impl).c_str() : "",
      plan.data_parallel,
      (std::string(r.sequence_parallel && plan.tensor_parallel > 1 ? " (sequence parallel)" : "") +
       (r.expert > 1
            ? fmt::format(", expert {} (each rank stores 1/{} of the experts)", r.expert, r.expert)
            : ""))
          .c_str(),
      r.compute_bytes == 4 ? "fp32" : "16-bit weights + fp32 master and Adam", r.micro_batch, r.seq,
      r.activation_checkpointing ? ", activation checkpointing" : "");
  std::printf("per rank: device %s, host %s per node (%d ranks)\n\n",
              f.gpu_mem.empty() ? "unlimited" : f.gpu_mem.c_str(),
              f.cpu_mem.empty() ? "unchecked" : f.cpu_mem.c_str(), r.ranks_per_node);
  std::printf("  %-44s %11s %11s %11s %11s %11s %11s  %s\n", "choice", "weights", "grads",
              "optimizer", "activations", "device", "host/disk", "fits");
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const zerod::PlanRow& row = plan.rows[i];
    std::printf(
        "%s %-44s %11s %11s %11s %11s %11s %11s  %s\n",
        static_cast<int>(i) == plan.recommended ? "*" : " ", row.name.c_str(),
        zerod::format_bytes(row.weights).c_str(), zerod::format_bytes(row.gradients).c_str(),
        zerod::format_bytes(row.optimizer).c_str(),
        zerod::format_bytes(row.activations + row.buffers).c_str(),
        zerod::format_bytes(row.device).c_str(), zerod::format_bytes(row.host + row.disk).c_str(),
        row.fits ? "yes" : ("no: " + row.why).c_str());
  }
  if (plan.recommended < 0) {
    std::printf(
        "\nnothing fits: more ranks, activation checkpointing, a smaller micro-batch, or "
        "offload to NVMe\n");
    return 2;
  }
  const zerod::PlanRow& best = plan.rows[static_cast<size_t>(plan.recommended)];
  std::printf("\nrecommended: %s (the fastest choice that fits)\n", best.name.c_str());
  std::printf("  \"zero_optimization\": {\"stage\": %d", best.stage);
  if (best.offload_optimizer != "none")
    std::printf(", \"offload_optimizer\": {\"device\": \"%s\"}", best.offload_optimizer.c_str());
  if (best.offload_param != "none")
    std::printf(", \"offload_param\": {\"device\": \"%s\"}", best.offload_param.c_str());
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zerod::log::init();
  CLI::App app{"zeroctl: the zerod command-line client"};
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);

#ifdef ZEROD_HAVE_GRPC
  zeroctl::Connection conn;
#else
  struct {
    std::string addr, token_file, tls_ca;
    double timeout_s = 30;
  } conn;
#endif
  app.add_option("--addr", conn.addr,
                 "unix:PATH or HOST:PORT of the zerod daemon (default: the Unix socket `zerod "
                 "serve` listens on without --listen: $XDG_RUNTIME_DIR/zerod/zerod.sock, else "
                 "/run/user/UID/zerod/zerod.sock, else ~/.cache/zerod/zerod.sock)");
  app.add_option("--token-file", conn.token_file, "file whose first line is the bearer token");
  app.add_option("--tls-ca", conn.tls_ca, "PEM certificate to trust (the daemon serves TLS)");
  app.add_option("--timeout", conn.timeout_s, "seconds per call (not for status --watch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  std::string job_path, submit_resume;
  auto* submit = app.add_subcommand("submit", "Submit a job file to the daemon; prints the job id");
  submit->add_option("job", job_path, "job file")->required()->check(CLI::ExistingFile);
  submit->add_option("--resume", submit_resume, "start from a checkpoint: latest, auto or a tag");
  bool watch = false, json = false;
  auto* status = app.add_subcommand("status", "The daemon's job: state, step, loss, speed, ETA");
  status->add_flag("--watch", watch, "follow the job until it ends (a live line on a terminal)");
  status->add_flag("--json", json, "one JSON object per status, for programs");
  auto* checkpoint = app.add_subcommand("checkpoint", "Save or list the running job's checkpoints");
  checkpoint->require_subcommand(1);
  std::string save_tag;
  bool save_overwrite = false;
  auto* ck_save = checkpoint->add_subcommand(
      "save", "Save a checkpoint at the next step boundary; returns when it is committed");
  ck_save->add_option("--tag", save_tag, "tag ([A-Za-z0-9._-]{1,128}; default global_step<N>)");
  ck_save->add_flag("--overwrite", save_overwrite,
                    "replace a checkpoint of the same tag (refused otherwise: ALREADY_EXISTS)");
  bool list_json = false;
  auto* ck_list = checkpoint->add_subcommand("list", "The job's checkpoints, newest first");
  ck_list->add_flag("--json", list_json, "JSON output");
  std::string resume_tag = "latest";
  auto* resume = app.add_subcommand("resume", "Run the last job again from a checkpoint");
  resume->add_option("--tag", resume_tag, "checkpoint tag, or latest")->capture_default_str();
  bool stop_checkpoint = false, stop_no_wait = false;
  double stop_wait_s = 600;
  auto* stop = app.add_subcommand(
      "stop", "Stop the running job at its next step boundary; returns once it is down");
  stop->add_flag("--checkpoint", stop_checkpoint, "save a checkpoint first");
  auto* stop_timeout =
      stop->add_option("--timeout", stop_wait_s,
                       "seconds to wait for the job to be down (then exit 5, the stop still "
                       "requested)")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  stop->add_flag("--no-wait", stop_no_wait, "return once the stop is requested")
      ->excludes(stop_timeout);

  PlanFlags pf;
  auto* plan = app.add_subcommand(
      "plan", "Per-rank memory of each ZeRO stage and offload choice, and the fastest that fits");
  plan->add_option("--model", pf.model,
                   "gpt2, gpt2-medium, gpt2-large, gpt2-xl/gpt2-1.5b, llama2-7b, llama3-8b, "
                   "llama3-70b, mistral-7b, qwen2-0.5b, qwen2-7b, a parameter count (1.5B, "
                   "350M) or a job file")
      ->required();
  plan->add_option("--world", pf.world, "ranks")->check(CLI::PositiveNumber)->capture_default_str();
  plan->add_option("--gpu-mem", pf.gpu_mem, "device memory per rank (80GiB)");
  plan->add_option("--cpu-mem", pf.cpu_mem, "host memory per node");
  plan->add_option("--offload", pf.offload, "consider only: none, cpu or nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  plan->add_option("--micro-batch", pf.micro_batch, "sequences per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  plan->add_option("--seq", pf.seq, "tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  plan->add_option("--dtype", pf.dtype, "compute dtype")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  plan->add_flag("--activation-checkpointing", pf.act_ckpt, "keep only block inputs");
  plan->add_option("--ranks-per-node", pf.ranks_per_node, "ranks sharing a node's host memory")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  plan->add_option("--tensor", pf.tensor,
                   "tensor-parallel size T (world = T x data-parallel; default: a job file's "
                   "parallelism.tensor, else 1)")
      ->check(CLI::PositiveNumber);
  plan->add_flag("--sequence-parallel", pf.sequence_parallel,
                 "with --tensor > 1: the norm and residual activations split T ways too "
                 "(default: a job file's parallelism.sequence_parallel)");
  plan->add_option("--expert", pf.expert,
                   "expert-parallel size E for a model with experts: each rank stores 1/E of "
                   "them (default: a job file's parallelism.expert, else 1)")
      ->check(CLI::PositiveNumber);

  ExportFlags ef;
  auto* exp = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face model directory (or one .safetensors file), streamed "
      "unit by unit");
  exp->add_option("checkpoint_dir", ef.dir, "the job's train.checkpoint_dir")->required();
  exp->add_option("--tag", ef.tag, "checkpoint tag, or latest")->capture_default_str();
  exp->add_option("--out", ef.out,
                  "output directory (config.json, generation_config.json, weights) or, ending "
                  "in .safetensors, one weights file")
      ->required();
  exp->add_option("--max-shard-size", ef.max_shard_size,
                  "largest weight file of a directory, e.g. 5GB, 500MB (transformers' default "
                  "5GB)")
      ->capture_default_str();
  exp->add_option("--dtype", ef.dtype, "element type of the output")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  exp->add_flag("--force", ef.force, "replace an existing output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*exp) return run_export(ef);
    if (*plan) return run_plan(pf, *plan);
#ifdef ZEROD_HAVE_GRPC
    if (*submit) return zeroctl::submit(conn, job_path, submit_resume);
    if (*status) return zeroctl::status(conn, watch, json);
    if (*ck_save) return zeroctl::checkpoint_save(conn, save_tag, save_overwrite);
    if (*ck_list) return zeroctl::checkpoint_list(conn, list_json);
    if (*resume) return zeroctl::resume(conn, resume_tag);
    if (*stop) return zeroctl::stop(conn, stop_checkpoint, !stop_no_wait, stop_wait_s);
#else
    ZD_THROW_INPUT("this zeroctl was built without gRPC: only `export` is available");
#endif
  } catch (...) {
    return zerod::report_current_exception("zeroctl");
  }
  return 0;
}
