// zeroctl: the zerod command-line client.
//
//   zeroctl [--addr HOST:PORT] [--token-file F] [--tls-ca F] COMMAND
//     submit JOB.json [--resume latest|TAG]
//     status [--watch] [--json]
//     checkpoint save [--tag T] | checkpoint list [--json]
//     resume [--tag T]
//     stop [--checkpoint]
//     export CKPT_DIR [--tag T] --out model.safetensors [--dtype fp32|bf16] [--force]
//
// Exit codes: 0 ok, 1 internal error, 2 bad usage, bad input or a request the daemon rejected,
// 3 the daemon cannot be reached, 4 unauthenticated.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/checkpoint/export.h"
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
  bool force = false;
};

int run_export(const ExportFlags& f) {
  zerod::Stopwatch sw;
  const zerod::ExportReport r =
      zerod::export_checkpoint(f.dir, f.tag, f.out, zerod::parse_dtype(f.dtype), f.force);
  for (const std::string& s : r.skipped) spdlog::warn("passed over {}", s);
  const double secs = sw.seconds();
  std::printf(
      "exported %s/%s (global step %lld, %lld parameters) to %s: %s, %.1f MB, crc32c %08x, "
      "%.2f s (%.0f MB/s)\n",
      f.dir.c_str(), r.tag.c_str(), static_cast<long long>(r.global_step),
      static_cast<long long>(r.parameters), f.out.c_str(), f.dtype.c_str(),
      static_cast<double>(r.file.bytes) / 1e6, r.file.crc32c, secs,
      static_cast<double>(r.file.bytes) / 1e6 / std::max(secs, 1e-9));
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
    std::string addr = "127.0.0.1:50051", token_file, tls_ca;
    double timeout_s = 30;
  } conn;
#endif
  app.add_option("--addr", conn.addr, "HOST:PORT of the zerod daemon")->capture_default_str();
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
  auto* ck_save = checkpoint->add_subcommand(
      "save", "Save a checkpoint at the next step boundary; returns when it is committed");
  ck_save->add_option("--tag", save_tag, "tag ([A-Za-z0-9._-]{1,128}; default global_step<N>)");
  bool list_json = false;
  auto* ck_list = checkpoint->add_subcommand("list", "The job's checkpoints, newest first");
  ck_list->add_flag("--json", list_json, "JSON output");
  std::string resume_tag = "latest";
  auto* resume = app.add_subcommand("resume", "Run the last job again from a checkpoint");
  resume->add_option("--tag", resume_tag, "checkpoint tag, or latest")->capture_default_str();
  bool stop_checkpoint = false;
  auto* stop = app.add_subcommand("stop", "Stop the running job at its next step boundary");
  stop->add_flag("--checkpoint", stop_checkpoint, "save a checkpoint first");

  ExportFlags ef;
  auto* exp = app.add_subcommand(
      "export",
      "Write a checkpoint as one Hugging Face GPT-2 safetensors file, streamed unit by unit");
  exp->add_option("checkpoint_dir", ef.dir, "the job's train.checkpoint_dir")->required();
  exp->add_option("--tag", ef.tag, "checkpoint tag, or latest")->capture_default_str();
  exp->add_option("--out", ef.out, "output .safetensors file")->required();
  exp->add_option("--dtype", ef.dtype, "element type of the output")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  exp->add_flag("--force", ef.force, "replace an existing output file");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*exp) return run_export(ef);
#ifdef ZEROD_HAVE_GRPC
    if (*submit) return zeroctl::submit(conn, job_path, submit_resume);
    if (*status) return zeroctl::status(conn, watch, json);
    if (*ck_save) return zeroctl::checkpoint_save(conn, save_tag);
    if (*ck_list) return zeroctl::checkpoint_list(conn, list_json);
    if (*resume) return zeroctl::resume(conn, resume_tag);
    if (*stop) return zeroctl::stop(conn, stop_checkpoint);
#else
    ZD_THROW_INPUT("this zeroctl was built without gRPC: only `export` is available");
#endif
  } catch (...) {
    return zerod::report_current_exception("zeroctl");
  }
  return 0;
}
