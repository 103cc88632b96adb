// zeroctl: the zerod command-line client.
//
//   zeroctl export CKPT_DIR [--tag T] --out model.safetensors [--dtype fp32|bf16] [--force]
//
// Exit codes: 0 ok, 1 internal error, 2 bad usage or bad input (missing checkpoint, unknown tag,
// corrupt file).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/checkpoint/export.h"

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
  } catch (...) {
    return zerod::report_current_exception("zeroctl");
  }
  return 0;
}
