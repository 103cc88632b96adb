// write_file_synced / write_file_atomically: the bytes land, a replacement is whole, and a
// failure names the file and leaves no temporary behind.
#include "core/file_write.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(FileWrite, WritesReplacesAndNamesTheFileOnFailure) {
  const fs::path dir =
      fs::temp_directory_path() / ("zerod_file_write_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "m.json").string();
  const std::string binary("a\0b\nc", 5);
  write_file_synced(path, binary);
  EXPECT_EQ(slurp(path), binary);
  write_file_atomically(path, "{\"v\": 2}\n");
  EXPECT_EQ(slurp(path), "{\"v\": 2}\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const std::string missing = (dir / "no" / "such" / "m.json").string();
  try {
    write_file_atomically(missing, "x");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(missing + ".tmp"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(missing + ".tmp"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zerod
