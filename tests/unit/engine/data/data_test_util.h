// Helpers shared by the engine/data tests: a per-test temporary directory, raw file writing,
// and a check that a call throws InputError with given message fragments.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/data/shard.h"

namespace zerod::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = fmt::format("zerod_data_{}_{}_{}_{}", ::getpid(), counter++,
                                   info ? info->test_suite_name() : "x", info ? info->name() : "x");
    for (char& c : name)
      if (c == '/') c = '_';  // parameterized test names
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A uint16 shard `name` in dir whose n tokens are s*1000 + i, so a token tells its shard and
// position; returns its path.
inline std::string make_shard(const TempDir& dir, const std::string& name, int s, int n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(s * 1000 + i);
  const std::string path = dir.file(name);
  write_shard(path, tokens);
  return path;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A shard file built by hand (header fields and payload chosen freely), independent of
// write_shard, so the reader is tested against the format rather than against our writer.
inline std::vector<uint8_t> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                        const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> bytes(1024, 0);
  auto put32 = [&](size_t at, int32_t v) {
    const auto u = static_cast<uint32_t>(v);
    for (int b = 0; b < 4; ++b) bytes[at + b] = static_cast<uint8_t>(u >> (8 * b));
  };
  put32(0, magic);
  put32(4, version);
  put32(8, count);
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<uint8_t>(t & 0xff));
    bytes.push_back(static_cast<uint8_t>(t >> 8));
  }
  return bytes;
}

// The same with uint32 tokens (llm.c's Llama 3 layout: magic 20240801, version 7).
inline std::vector<uint8_t> shard_bytes32(int32_t magic, int32_t version, int32_t count,
                                          const std::vector<uint32_t>& tokens) {
  std::vector<uint8_t> bytes = shard_bytes(magic, version, count, {});
  for (uint32_t t : tokens)
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<uint8_t>(t >> (8 * b)));
  return bytes;
}

// Expects fn() to throw InputError (exit code 2) whose message contains every fragment.
inline void expect_input_error(const std::function<void()>& fn,
                               const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message lacks \"" << f << "\": " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected InputError, nothing was thrown";
}

}  // namespace zerod::testing
