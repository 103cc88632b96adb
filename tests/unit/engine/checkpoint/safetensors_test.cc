#include "engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/error.h"
#include "tests/unit/engine/checkpoint/raw_safetensors.h"

namespace zerod {
namespace {

using testing::le_bytes;
using testing::read_file;
using testing::safetensors_bytes;
using testing::write_file;

class Safetensors : public testing::TempDirTest {};

// Runs f, expects an InputError whose message contains every fragment.
template <class F>
void expect_input_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << fragments.front();
  } catch (const InputError& e) {
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << frag;
  }
}

TEST_F(Safetensors, ReadsAHandWrittenFile) {
  // JSON order differs from offset order; a scalar, an empty tensor, metadata.
  const std::string header = R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
                             R"("__metadata__":{"k":"v","format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("s":{"dtype":"I64","shape":[],"data_offsets":[14,22]},)"
                             R"("e":{"dtype":"F16","shape":[0,4],"data_offsets":[22,22]}})";
  const std::string data = std::string("\x00\x00\x80\x3f\x00\x00\x20\xc0", 8) +  // 1, -2.5
                           std::string("\x80\x3f\x00\x40\x40\xc0", 6) +          // 1, 2, -3
                           std::string("\xf9\xff\xff\xff\xff\xff\xff\xff", 8);   // -7
  const std::string file = path("hand.safetensors");
  write_file(file, safetensors_bytes(header, data));

  SafetensorsReader r(file);
  ASSERT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.tensors()[0].name, "a");
  EXPECT_EQ(r.tensors()[1].name, "b");
  EXPECT_EQ(r.tensors()[2].name, "s");
  EXPECT_EQ(r.tensors()[3].name, "e");
  EXPECT_EQ(r.metadata().at("k"), "v");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.data_start(), 8 + (header.size() + 7) / 8 * 8);
  EXPECT_EQ(r.file_bytes(), r.data_start() + 22);

  const StTensor& b = r.at("b");
  EXPECT_EQ(b.dtype, StDType::kBF16);
  EXPECT_EQ(b.shape, std::vector<int64_t>{3});
  EXPECT_EQ(b.begin, 8u);
  EXPECT_EQ(r.at("s").numel(), 1);
  EXPECT_EQ(r.at("e").numel(), 0);
  EXPECT_EQ(r.find("nope"), nullptr);

  float a[2];
  r.read("a", 0, 2, a);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -2.5f);
  uint16_t bb[3] = {0, 0, 0};
  r.read("b", 1, 1, bb);  // only the middle element
  EXPECT_EQ(bf16_bits_to_f32(bb[0]), 2.0f);
  r.read("b", 0, 3, bb);
  EXPECT_EQ(bf16_bits_to_f32(bb[0]), 1.0f);
  EXPECT_EQ(bf16_bits_to_f32(bb[2]), -3.0f);
  int64_t s = 0;
  r.read("s", 0, 1, &s);
  EXPECT_EQ(s, -7);
  r.read("e", 0, 0, nullptr);  // an empty read of an empty tensor is fine

  expect_input_error([&] { r.read("b", 2, 2, bb); }, {file, "tensor b has 3 elements"});
  expect_input_error([&] { r.read("b", -1, 1, bb); }, {"tensor b"});
  expect_input_error([&] { r.at("zz"); }, {file, "no tensor zz"});
}

TEST_F(Safetensors, ReadsTheReferenceLibrarysBytes) {
  // Output of the Python safetensors library for torch.ones((2,2), bfloat16) with [0][0] = 2.25
  // (from its test suite).
  const std::string bytes = std::string("@\0\0\0\0\0\0\0", 8) +
                            R"({"test":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}    )" +
                            std::string("\x10@\x80?\x80?\x80?", 8);
  const std::string file = path("ref.safetensors");
  write_file(file, bytes);
  SafetensorsReader r(file);
  ASSERT_EQ(r.tensors().size(), 1u);
  EXPECT_EQ(r.at("test").shape, (std::vector<int64_t>{2, 2}));
  uint16_t v[4];
  r.read("test", 0, 4, v);
  EXPECT_EQ(bf16_bits_to_f32(v[0]), 2.25f);
  EXPECT_EQ(bf16_bits_to_f32(v[3]), 1.0f);
  EXPECT_TRUE(r.metadata().empty());
}

TEST_F(Safetensors, WriterProducesTheReferenceLibrarysBytes) {
  // Expected bytes from the Python safetensors library's test suite.
  {
    const std::string file = path("two.safetensors");
    SafetensorsWriter w(file, {{"test1", StDType::kI32, {2, 2}}, {"test2", StDType::kF16, {2, 2}}});
    const std::vector<int32_t> z32(4, 0);
    const std::vector<uint16_t> z16(4, 0);
    w.write("test1", z32.data(), 16);
    w.write("test2", z16.data(), 8);
    w.finish();
    const std::string want = std::string("\x80\0\0\0\0\0\0\0", 8) +
                             R"({"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("test2":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}})" +
                             "      " + std::string(24, '\0');
    EXPECT_EQ(read_file(file), want);
  }
  {
    const std::string file = path("meta.safetensors");
    SafetensorsWriter w(file, {{"test1", StDType::kI32, {2, 2}}}, {{"framework", "pt"}});
    const std::vector<int32_t> z32(4, 0);
    w.write("test1", z32.data(), 16);
    w.finish();
    const std::string want =
        std::string("`\0\0\0\0\0\0\0", 8) +
        R"({"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],)"
        R"("data_offsets":[0,16]}} )" +
        std::string(16, '\0');
    EXPECT_EQ(read_file(file), want);
  }
}

TEST_F(Safetensors, StreamsChunksAndTracksSizeAndChecksum) {
  // Sizes straddle the 4 MiB write buffer: small tensors are gathered, big ones go straight out.
  // The same with O_DIRECT (16 MiB aligned staging, the last block padded then truncated).
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    std::mt19937 gen(11);
    std::vector<SafetensorsWriter::Entry> entries = {
        {"small", StDType::kF32, {3, 5}},     {"empty", StDType::kBF16, {0}},
        {"big", StDType::kF32, {1500, 1001}},  // 6 MB
        {"half", StDType::kBF16, {777}},      {"mid", StDType::kU8, {3 << 20}},
    };
    std::vector<std::string> payload;
    for (const auto& e : entries) {
      size_t bytes = static_cast<size_t>(st_dtype_bits(e.dtype) / 8);
      for (int64_t d : e.shape) bytes *= static_cast<size_t>(d);
      std::string p(bytes, '\0');
      for (auto& c : p) c = static_cast<char>(gen());
      payload.push_back(std::move(p));
    }
    const std::string file = path(direct ? "direct.safetensors" : "stream.safetensors");
    SafetensorsWriter w(file, entries, {{"step", "42"}}, direct);
    if (direct && !w.direct()) std::printf("note: this file system refuses O_DIRECT: buffered\n");
    for (size_t i = 0; i < entries.size(); ++i) {
      size_t pos = 0;
      while (pos < payload[i].size()) {
        const size_t len = std::min<size_t>(payload[i].size() - pos, 1 + gen() % (5 << 20));
        w.write(entries[i].name, payload[i].data() + pos, len);
        pos += len;
      }
    }
    EXPECT_EQ(w.bytes_written(), w.total_bytes());
    w.finish();

    const std::string on_disk = read_file(file);
    EXPECT_EQ(on_disk.size(), w.total_bytes());
    EXPECT_EQ(w.crc32c(), crc32c(on_disk.data(), on_disk.size()));
    const FileChecksum sum = file_crc32c(file);
    EXPECT_EQ(sum.bytes, on_disk.size());
    EXPECT_EQ(sum.crc32c, w.crc32c());
    EXPECT_EQ(w.header_bytes() % 8, 0u);

    SafetensorsReader r(file);
    EXPECT_EQ(r.metadata().at("step"), "42");
    ASSERT_EQ(r.tensors().size(), entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const StTensor& t = r.tensors()[i];
      EXPECT_EQ(t.name, entries[i].name);  // written in the given order
      EXPECT_EQ(t.dtype, entries[i].dtype);
      EXPECT_EQ(t.shape, entries[i].shape);
      std::string back(payload[i].size(), '\0');
      r.read_bytes(t, 0, back.size(), back.data());
      EXPECT_EQ(back, payload[i]) << t.name;
    }
    // Random access to a slice in the middle of the big tensor.
    std::vector<float> slice(10);
    r.read("big", 700 * 1001 + 3, 10, slice.data());
    EXPECT_EQ(std::memcmp(slice.data(), payload[2].data() + (700 * 1001 + 3) * 4, 40), 0);
  }
}

TEST_F(Safetensors, WriterRefusesBytesThatDoNotFit) {
  const std::string file = path("misuse.safetensors");
  const std::vector<float> v(8, 1.0f);
  {
    SafetensorsWriter w(file, {{"a", StDType::kF32, {2}}, {"b", StDType::kF32, {2}}});
    EXPECT_THROW(w.write("b", v.data(), 8), Error);   // out of order
    EXPECT_THROW(w.write("a", v.data(), 12), Error);  // longer than the tensor
    w.write("a", v.data(), 4);
    EXPECT_THROW(w.write("b", v.data(), 4), Error);  // a is not complete yet
    EXPECT_THROW(w.finish(), Error);                 // incomplete
  }
  {
    SafetensorsWriter w(file, {{"a", StDType::kF32, {2}}});
    w.write("a", v.data(), 8);
    EXPECT_THROW(w.write("a", v.data(), 4), Error);  // after every tensor is complete
    w.finish();
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_THROW(SafetensorsWriter(file, {{"a", StDType::kF32, {2}}, {"a", StDType::kF32, {1}}}),
               Error);
  EXPECT_THROW(SafetensorsWriter(file, {{"a", StDType::kF32, {-1}}}), Error);
  // An unfinished file does not pass as a safetensors file.
  {
    SafetensorsWriter w(file, {{"a", StDType::kF32, {2}}});
    w.write("a", v.data(), 4);
  }
  EXPECT_THROW(SafetensorsReader{file}, InputError);
}

// A full disk is the environment, not a bug: InputError (exit 2) naming the file, the offset,
// the system error and the bytes the file needs.
TEST_F(Safetensors, FullDiskIsAnEnvironmentErrorNamingTheFileAndOffset) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  std::vector<char> big(size_t{5} << 20, 'x');  // larger than the buffer: written at once
  try {
    SafetensorsWriter w("/dev/full", {{"a", StDType::kU8, {static_cast<int64_t>(big.size())}}});
    w.write("a", big.data(), big.size());
    w.finish();
    ADD_FAILURE() << "writing to /dev/full succeeded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/dev/full"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at offset 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
    EXPECT_NE(msg.find("the file needs"), std::string::npos) << msg;
  }
}

TEST_F(Safetensors, MissingFileIsBadInput) {
  expect_input_error([&] { SafetensorsReader r(path("absent.safetensors")); },
                     {"absent.safetensors", "cannot open"});
  expect_input_error([&] { file_crc32c(path("absent.safetensors")); }, {"cannot open"});
}

struct BadCase {
  const char* what;
  std::string bytes;
  std::string expect;  // fragment of the message
};

TEST_F(Safetensors, EveryBadFileGivesAClearError) {
  const auto t = [](const char* name, const char* dtype, const char* shape, int b, int e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                       shape, b, e);
  };
  const std::string good =
      "{" + t("x", "F32", "[2]", 0, 8) + "," + t("y", "F16", "[2]", 8, 12) + "}";
  const std::string data12(12, '\x01');
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32
  std::string past_end = safetensors_bytes(good, data12);
  past_end[0] = static_cast<char>(200);  // header length 200 in a shorter file

  const std::vector<BadCase> cases = {
      {"empty file", "", "shorter than the 8-byte header length"},
      {"7 bytes", std::string(7, '\0'), "shorter than the 8-byte header length"},
      {"huge header length", huge_len + good, "exceeds the format's limit"},
      {"header length past the end", past_end, "runs past the end"},
      {"bad JSON", safetensors_bytes(R"({"x":{"dtype":"F32",)", data12), "not valid JSON"},
      {"JSON array", safetensors_bytes("[1,2]", ""), "expected an object"},
      {"unknown dtype", safetensors_bytes("{" + t("x", "F33", "[2]", 0, 8) + "}", data12.substr(4)),
       "unknown dtype \"F33\""},
      {"shape and span disagree",
       safetensors_bytes("{" + t("x", "F32", "[3]", 0, 8) + "}", data12.substr(4)),
       "needs 12 bytes but data_offsets [0, 8] span 8"},
      {"overlap",
       safetensors_bytes("{" + t("x", "F32", "[2]", 0, 8) + "," + t("y", "F16", "[2]", 6, 10) + "}",
                         data12.substr(2)),
       "overlap tensor x"},
      {"gap",
       safetensors_bytes(
           "{" + t("x", "F32", "[2]", 0, 8) + "," + t("y", "F16", "[2]", 10, 14) + "}",
           data12 + "ab"),
       "leave a gap after tensor x"},
      {"first not at 0", safetensors_bytes("{" + t("x", "F32", "[2]", 4, 12) + "}", data12),
       "must begin at 0"},
      {"end before begin", safetensors_bytes("{" + t("x", "F32", "[0]", 8, 0) + "}", ""),
       "end before they begin"},
      {"truncated data", safetensors_bytes(good, data12.substr(0, 10)), "truncated"},
      {"trailing bytes", safetensors_bytes(good, data12 + "zz"), "2 bytes after the last tensor"},
      {"negative dimension", safetensors_bytes("{" + t("x", "F32", "[-2]", 0, 8) + "}", data12),
       "expected a non-negative integer"},
      {"fractional offset",
       safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", data12),
       "expected a non-negative integer"},
      {"missing field", safetensors_bytes(R"({"x":{"dtype":"F32","shape":[2]}})", ""),
       "tensor x: no data_offsets"},
      {"metadata not strings",
       safetensors_bytes(R"({"__metadata__":{"step":3},)" + good.substr(1), data12),
       "__metadata__ entry step"},
      {"tensor entry not an object", safetensors_bytes(R"({"x":[1]})", ""), "tensor x"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string file = path("bad.safetensors");
    write_file(file, c.bytes);
    expect_input_error([&] { SafetensorsReader r(file); }, {file, c.expect});
  }
  // The good file the cases were derived from is accepted.
  write_file(path("good.safetensors"), safetensors_bytes(good, data12));
  EXPECT_NO_THROW(SafetensorsReader{path("good.safetensors")});
}

// A file that is not safetensors (model.init_from: /etc/shadow, read by a daemon running as root
// for a client who could not read it): the message names the file and what was expected, never
// its bytes, not even as the header length they make.
TEST_F(Safetensors, ErrorsNeverQuoteTheFilesContent) {
  const std::string secret = "root:$6$Xy7/secret.hash:19000:0:99999:7:::\n";
  uint64_t as_length = 0;
  std::memcpy(&as_length, secret.data(), 8);
  const std::vector<std::pair<const char*, std::string>> files = {
      {"text", secret + secret},
      {"a header length that fits, then not JSON", std::string("\x20\0\0\0\0\0\0\0", 8) +
                                                       "{\"a\": secretvalue-not-json, \"b\": 1}" +
                                                       std::string(8, ' ')},
  };
  for (const auto& [what, bytes] : files) {
    SCOPED_TRACE(what);
    const std::string file = path("s.safetensors");
    write_file(file, bytes);
    try {
      SafetensorsReader r(file);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      std::string m = e.what();
      m.erase(0, m.find(file) == 0 ? file.size() : 0);
      for (const std::string& piece :
           {std::string("root"), std::string("$6$"), std::string("secret"),
            std::to_string(as_length), std::to_string(as_length & 0xFFFFFFFF)}) {
        EXPECT_EQ(m.find(piece), std::string::npos) << piece << " in: " << m;
      }
    }
  }
}

}  // namespace
}  // namespace zerod
