// TensorBoard event files read back by a reader written here from the format's description
// (TFRecord framing with masked CRC32C, tensorflow.Event / Summary protobuf fields), sharing no
// code with the writer: lengths, both checksums of every record, and the scalars of each step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "train_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t masked(const std::string& s) {
  const uint32_t c = crc32c_bitwise(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct Reader {  // protobuf wire format over a string
  const std::string& b;
  size_t pos = 0;
  bool done() const { return pos >= b.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto byte = static_cast<unsigned char>(b.at(pos++));
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
  }
  std::string bytes(size_t n) {
    std::string s = b.substr(pos, n);
    EXPECT_EQ(s.size(), n);
    pos += n;
    return s;
  }
};

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> scalars;
};

Event decode_event(const std::string& data) {
  Event e;
  Reader r{data};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 1) {
      const std::string b = r.bytes(8);
      std::memcpy(&e.wall_time, b.data(), 8);
    } else if (field == 2 && wire == 0) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == 2) {
      e.file_version = r.bytes(r.varint());
    } else if (field == 5 && wire == 2) {
      const std::string summary = r.bytes(r.varint());
      Reader s{summary};
      while (!s.done()) {
        EXPECT_EQ(s.varint(), (1u << 3) | 2u);  // Summary.value
        const std::string value = s.bytes(s.varint());
        Reader v{value};
        std::string tag;
        float x = 0;
        while (!v.done()) {
          const uint64_t k = v.varint();
          if (k == ((1u << 3) | 2u)) {
            tag = v.bytes(v.varint());
          } else if (k == ((2u << 3) | 5u)) {
            const std::string f = v.bytes(4);
            std::memcpy(&x, f.data(), 4);
          } else {
            ADD_FAILURE() << "unexpected Value field key " << k;
            return e;
          }
        }
        e.scalars[tag] = x;
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field << " wire " << wire;
      return e;
    }
  }
  return e;
}

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  std::vector<Event> events;
  size_t pos = 0;
  while (pos < all.size()) {
    if (all.size() - pos < 12) {
      ADD_FAILURE() << "torn record header at " << pos;
      break;
    }
    const std::string len_bytes = all.substr(pos, 8);
    uint64_t len = 0;
    std::memcpy(&len, len_bytes.data(), 8);
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len_crc, all.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, masked(len_bytes)) << "length checksum of the record at " << pos;
    if (all.size() - pos < 16 + len) {
      ADD_FAILURE() << "torn record at " << pos;
      break;
    }
    const std::string data = all.substr(pos + 12, len);
    std::memcpy(&data_crc, all.data() + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(data)) << "data checksum of the record at " << pos;
    events.push_back(decode_event(data));
    pos += 16 + len;
  }
  return events;
}

TEST(TensorBoard, EventsHoldEveryStepsScalarsWithValidFraming) {
  testing::TempCorpus corpus("zerod_tb_corpus");
  const fs::path out = fs::temp_directory_path() / ("zerod_tb_" + std::to_string(::getpid()));
  fs::remove_all(out);
  JobConfig cfg = testing::tiny_job(corpus, 1, 0, 1, 6,
                                    R"(, "tensorboard": {"enabled": true, "output_path": ")" +
                                        out.string() + R"(", "job_name": "run1"})");
  cfg.data.val_fraction = 0.1;  // validation every 3 steps: val/loss on those
  cfg.train.eval_interval = 3;
  cfg.train.eval_batches = 2;
  Trainer t(cfg, testing::quiet_trainer());
  const TrainResult res = t.run();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(out / "run1")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);

  const std::vector<Event> events = read_events(files[0].string());
  ASSERT_EQ(events.size(), 1 + res.steps.size());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.7e9);
  for (size_t i = 0; i < res.steps.size(); ++i) {
    const Event& e = events[i + 1];
    const StepMetrics& m = res.steps[i];
    EXPECT_EQ(e.step, m.step);
    EXPECT_GE(e.wall_time, events[0].wall_time);
    EXPECT_EQ(e.scalars.at("train/loss"), static_cast<float>(m.loss)) << "step " << m.step;
    EXPECT_EQ(e.scalars.at("train/lr"), static_cast<float>(m.lr));
    EXPECT_EQ(e.scalars.at("train/grad_norm"), static_cast<float>(m.grad_norm));
    EXPECT_EQ(e.scalars.at("perf/tokens_per_s"), static_cast<float>(m.tokens_per_s));
    EXPECT_GT(e.scalars.at("memory/rank0_mib"), 0.0f);
    EXPECT_EQ(e.scalars.count("val/loss"), m.val_loss ? 1u : 0u) << "step " << m.step;
    if (m.val_loss) {
      EXPECT_EQ(e.scalars.at("val/loss"), static_cast<float>(*m.val_loss));
    }
  }
  EXPECT_TRUE(res.steps[2].val_loss.has_value());  // eval_interval 3
  fs::remove_all(out);
}

}  // namespace
}  // namespace zerod
