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

std::string monitor_dir(const MonitorConfig& config) {
  return (std::filesystem::path(config.output_path.empty() ? "." : config.output_path) /
          config.job_name)
      .string();
}

CsvMonitor::CsvMonitor(const MonitorConfig& config, int64_t resume_step) {
  namespace fs = std::filesystem;
  const fs::path dir = monitor_dir(config);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    ZD_THROW_INPUT("csv_monitor.output_path: cannot create directory '{}': {}", dir.string(),
                   ec.message());
  }
  path_ = (dir / "metrics.csv").string();
  std::vector<std::string> kept;  // rows of the steps before a resume
  if (resume_step > 0) {
    std::ifstream in(path_);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const long long step = std::atoll(line.c_str());
      if (step >= 1 && step <= resume_step) kept.push_back(line);
    }
  }
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    ZD_THROW_INPUT("csv_monitor: cannot open '{}' for writing: {}", path_, std::strerror(errno));
  }
  std::fputs("step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss\n", file_);
  for (const auto& line : kept) fmt::print(file_, "{}\n", line);
  std::fflush(file_);
}

CsvMonitor::~CsvMonitor() {
  if (file_) std::fclose(file_);
}

void CsvMonitor::write(const StepMetrics& m) {
  std::string val = m.val_loss ? fmt::format("{:.9g}", *m.val_loss) : std::string();
  fmt::print(file_, "{},{:.9g},{:.9g},{:.9g},{:.9g},{:.6g},{:.6g},{},{}\n", m.step, m.loss, m.lr,
             m.grad_norm, m.loss_scale, m.tokens_per_s, m.mfu, m.skipped ? 1 : 0, val);
  std::fflush(file_);
}

}  // namespace zerod
