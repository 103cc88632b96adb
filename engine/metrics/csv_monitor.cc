#include "engine/metrics/csv_monitor.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHeader =
    "step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss\n";

// Writes the header and `rows` to `path` (`append`: after what the file holds, the header only
// when the file is new).
void write_rows(const fs::path& path, const std::string& header,
                const std::vector<std::string>& rows, bool append) {
  std::error_code ec;
  const bool fresh = !append || !fs::exists(path, ec);
  std::ofstream out(path, append ? std::ios::app : std::ios::trunc);
  if (fresh) out << header;
  for (const std::string& row : rows) out << row << '\n';
  out.flush();
  if (!out)
    ZD_THROW_INPUT("csv_monitor: cannot write '{}': {}", path.string(), std::strerror(errno));
}

}  // namespace

std::string monitor_dir(const MonitorConfig& config) {
  return (fs::path(config.output_path.empty() ? "." : config.output_path) / config.job_name)
      .string();
}

std::string monitor_run_dir(const MonitorConfig& config, int64_t run) {
  const std::string base = monitor_dir(config);
  return run == 0 ? base : base + "_" + std::to_string(run);
}

int64_t next_monitor_run(const MonitorConfig& config) {
  for (int64_t run = 0;; ++run) {
    const fs::path dir = monitor_run_dir(config, run);
    std::error_code ec;
    if (!fs::exists(dir, ec) || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) return run;
  }
}

namespace {

// Opens DIR/NAME.csv as CsvMonitor's constructor describes (header: the first line, with its
// newline).
std::FILE* open_csv(const fs::path& dir, const std::string& name, const std::string& header,
                    int64_t resume_step) {
  const std::string path = (dir / (name + ".csv")).string();
  std::error_code ec;
  std::FILE* file = nullptr;
  if (resume_step > 0 && fs::exists(path, ec)) {
    // Resumed: the rows up to the checkpoint stay; those of the steps trained again move aside.
    std::vector<std::string> kept, replaced;
    {
      std::ifstream in(path);
      std::string line;
      std::getline(in, line);  // header
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        const long long step = std::atoll(line.c_str());
        (step >= 1 && step <= resume_step ? kept : replaced).push_back(line);
      }
    }
    if (!replaced.empty()) {
      write_rows(dir / fmt::format("{}.replaced-after-step{}.csv", name, resume_step), header,
                 replaced, /*append=*/true);
    }
    // Rewritten whole (a torn last line of a killed run is not appended to), then appended to.
    const fs::path tmp = path + ".tmp";
    write_rows(tmp, header, kept, /*append=*/false);
    fs::rename(tmp, path, ec);
    if (ec) ZD_THROW_INPUT("csv_monitor: cannot replace '{}': {}", path, ec.message());
    file = std::fopen(path.c_str(), "a");
  } else {
    // A fresh run's file is new: an earlier run's metrics are never truncated.
    file = std::fopen(path.c_str(), "wx");
    if (file == nullptr && errno == EEXIST) {
      ZD_THROW_INPUT("csv_monitor: '{}' already holds an earlier run's metrics; not overwriting it",
                     path);
    }
    if (file != nullptr) std::fputs(header.c_str(), file);
  }
  if (file == nullptr) {
    ZD_THROW_INPUT("csv_monitor: cannot open '{}' for writing: {}", path, std::strerror(errno));
  }
  std::fflush(file);
  return file;
}

}  // namespace

CsvMonitor::CsvMonitor(const std::string& dir_name, int64_t resume_step, int moe_experts) {
  const fs::path dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    ZD_THROW_INPUT("csv_monitor.output_path: cannot create directory '{}': {}", dir.string(),
                   ec.message());
  }
  path_ = (dir / "metrics.csv").string();
  file_ = open_csv(dir, "metrics", kHeader, resume_step);
  if (moe_experts > 0) moe_file_ = open_csv(dir, "moe", moe_csv_header(moe_experts), resume_step);
}

CsvMonitor::~CsvMonitor() {
  if (file_) std::fclose(file_);
  if (moe_file_) std::fclose(moe_file_);
}

void CsvMonitor::write(const StepMetrics& m) {
  std::string val = m.val_loss ? fmt::format("{:.9g}", *m.val_loss) : std::string();
  fmt::print(file_, "{},{:.9g},{:.9g},{:.9g},{:.9g},{:.6g},{:.6g},{},{}\n", m.step, m.loss, m.lr,
             m.grad_norm, m.loss_scale, m.tokens_per_s, m.mfu, m.skipped ? 1 : 0, val);
  std::fflush(file_);
  if (moe_file_ != nullptr && m.moe) {
    for (const std::string& row : moe_csv_rows(m.step, *m.moe)) fmt::print(moe_file_, "{}\n", row);
    std::fflush(moe_file_);
  }
}

}  // namespace zerod
