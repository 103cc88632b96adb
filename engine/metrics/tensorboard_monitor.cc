#include "engine/metrics/tensorboard_monitor.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/crc32c.h"
#include "core/error.h"

namespace zerod {

namespace {

// Protobuf wire format, the few pieces an Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
template <class T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 stores it
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary). Summary: value = 1 (repeated Value). Value: tag = 1 (string),
// simple_value = 2 (float).
std::string event_header(double wall_time) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_scalars(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, 5);
    put_fixed(v, value);
    put_bytes(summary, 1, v);
  }
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 5, summary);
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ZD_THROW_INPUT("tensorboard.output_path: cannot create '{}': {}", dir, ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  const std::string name =
      fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(t), host, ::getpid());
  for (int n = 0; file_ == nullptr; ++n) {
    path_ = (std::filesystem::path(dir) / (n == 0 ? name : fmt::format("{}.{}", name, n))).string();
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && (errno != EEXIST || n >= 1000)) break;
  }
  if (file_ == nullptr) {
    ZD_THROW_INPUT("tensorboard: cannot create '{}': {}", path_, std::strerror(errno));
  }
  write_record(event_header(t));
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write_record(const std::string& bytes) {
  std::string rec;
  const uint64_t len = bytes.size();
  put_fixed(rec, len);
  put_fixed(rec, masked_crc32c(rec.data(), 8));
  rec += bytes;
  put_fixed(rec, masked_crc32c(bytes.data(), bytes.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size()) {
    ZD_THROW("tensorboard: writing '{}' failed: {}", path_, std::strerror(errno));
  }
}

void EventFileWriter::add_scalars(int64_t step,
                                  const std::vector<std::pair<std::string, float>>& scalars,
                                  double wall_time) {
  write_record(event_scalars(wall_time, step, scalars));
}

void EventFileWriter::flush() {
  std::fflush(file_);
}

TensorBoardMonitor::TensorBoardMonitor(const std::string& dir) : writer_(dir) {}

void TensorBoardMonitor::write(const StepMetrics& m, int64_t memory_bytes) {
  std::vector<std::pair<std::string, float>> s = {
      {"train/loss", static_cast<float>(m.loss)},
      {"train/lr", static_cast<float>(m.lr)},
      {"train/grad_norm", static_cast<float>(m.grad_norm)},
      {"train/loss_scale", static_cast<float>(m.loss_scale)},
      {"perf/tokens_per_s", static_cast<float>(m.tokens_per_s)},
      {"perf/mfu", static_cast<float>(m.mfu)},
      {"memory/rank0_mib", static_cast<float>(static_cast<double>(memory_bytes) / (1 << 20))},
  };
  if (m.val_loss) s.emplace_back("val/loss", static_cast<float>(*m.val_loss));
  if (m.pipeline_bubble)
    s.emplace_back("perf/pipeline_bubble", static_cast<float>(*m.pipeline_bubble));
  if (m.moe) {
    for (auto& kv : moe_scalars(*m.moe)) s.push_back(std::move(kv));
  }
  writer_.add_scalars(m.step, s, now_seconds());
  writer_.flush();
}

}  // namespace zerod
