#include "core/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

#include "core/error.h"

namespace zerod::log {

namespace {
thread_local int t_rank = -1;

// %R: "[rank N] " for threads with a rank, nothing otherwise.
class RankFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (t_rank < 0) return;
    fmt::format_to(std::back_inserter(dest), "[rank {}] ", t_rank);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RankFlag>();
  }
};
}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stdout_color_mt("zerod");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<RankFlag>('R').set_pattern("[%H:%M:%S.%e] %^%-5l%$ %R%v");
    logger->set_formatter(std::move(formatter));
    spdlog::set_default_logger(logger);
  });
}

void set_thread_rank(int rank) {
  t_rank = rank;
}
int thread_rank() {
  return t_rank;
}

void set_level(const std::string& name) {
  auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") {
    ZD_THROW_INPUT(
        "--log-level: unknown level '{}' (allowed: trace, debug, info, warn, error, off)", name);
  }
  spdlog::set_level(level);
}

}  // namespace zerod::log
