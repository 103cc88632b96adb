// safetensors files (Hugging Face's tensor file format), written as a stream and read by random
// access. A file is: an 8-byte little-endian header length N; N bytes of JSON,
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8; then the tensors' bytes, row-major, little-endian,
// contiguous in offset order with no gaps (offsets count from the first byte after the header).
// Checkpoint shards, the consolidated model.safetensors and Hugging Face exports use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace zerod {

// The element types of the format (its names: "F32", "BF16", ...). The sub-byte types (F4, F6_*)
// are known so their files validate, but only whole-byte types can be read by element.
enum class StDType : uint8_t {
  kBool,
  kF4,
  kF6_E2M3,
  kF6_E3M2,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64
};
std::string_view st_dtype_name(StDType t);  // "F32"
std::optional<StDType> parse_st_dtype(std::string_view name);
int st_dtype_bits(StDType t);  // 32 for F32, 4 for F4
StDType to_st_dtype(DType t);  // kF32 -> F32, kBF16 -> BF16, kF16 -> F16

struct StTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;  // empty: a scalar (one element)
  uint64_t begin = 0;          // byte offsets in the data section: [begin, end)
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

using StMetadata = std::map<std::string, std::string>;

// Size and CRC32C of a whole file.
struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Streams a whole file through CRC32C (4 MiB reads). Throws InputError naming the file when it
// cannot be opened, Error on a read failure.
FileChecksum file_crc32c(const std::string& path);

// Writes one safetensors file as a stream. The constructor takes every tensor (name, dtype,
// shape; offsets are assigned in the given order) and the metadata, creates (truncates) the file
// and writes the header; then each tensor's bytes arrive through write(), in the given order, in
// as many chunks as the caller likes. finish() checks that every tensor got exactly its bytes,
// flushes and fsyncs the file (fsyncing the directory is the caller's job). Small chunks are
// gathered in a 4 MiB buffer; large ones are written straight from the caller's memory. The file
// size and the CRC32C of the whole file (header included) are tracked as the bytes go out, so
// they equal file_crc32c(path) without re-reading. A write failure throws naming the file, the
// offset and the system error: InputError (exit 2) for a full disk or quota (ENOSPC, EDQUOT:
// the environment, with the bytes the file needs and the bytes free), Error otherwise (EIO...).
// Destroying an unfinished writer closes the file and leaves it incomplete (a reader rejects it:
// its size does not match its header).
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    StDType dtype = StDType::kF32;
    std::vector<int64_t> shape;
  };

  // direct: write with O_DIRECT (through an aligned staging buffer, bypassing the page cache:
  // little CPU and no page-cache growth, for large files written once); falls back to buffered
  // writes where the file system refuses O_DIRECT.
  SafetensorsWriter(std::string path, const std::vector<Entry>& tensors,
                    const StMetadata& metadata = {}, bool direct = false);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends `bytes` bytes of tensor `name`, which must be the tensor being written (the first
  // one not yet complete); a chunk may not run past the tensor's end. Throws Error otherwise.
  void write(std::string_view name, const void* data, size_t bytes);
  // Flushes, checks completeness, fsyncs and closes. Call once.
  void finish();

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  uint64_t header_bytes() const { return 8 + header_len_; }  // where the data section starts
  uint64_t total_bytes() const { return total_; }            // the file size once finished
  uint64_t bytes_written() const { return written_; }        // header + data so far
  uint32_t crc32c() const { return crc_; }                   // of bytes_written() bytes
  bool finished() const { return finished_; }
  bool direct() const { return direct_; }  // writing with O_DIRECT

 private:
  void append(const void* data, size_t bytes);
  void flush_buffer();
  void write_all(const void* data, size_t bytes);
  // Throws for a failed write/fsync (`what`) with errno err: InputError for ENOSPC/EDQUOT.
  [[noreturn]] void fail_io(const std::string& what, int err) const;
  void skip_complete();

  std::string path_;
  int fd_ = -1;
  std::vector<StTensor> tensors_;
  uint64_t header_len_ = 0;
  uint64_t total_ = 0;
  uint64_t written_ = 0;  // bytes handed to append() (header + data)
  uint64_t on_disk_ = 0;  // bytes handed to the kernel
  uint32_t crc_ = 0;
  size_t current_ = 0;  // the tensor being written
  uint64_t current_done_ = 0;
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::unique_ptr<char[], FreeDeleter> buffer_;  // 4 KiB aligned (O_DIRECT)
  size_t buffer_size_ = 0;
  size_t buffered_ = 0;
  bool direct_ = false;
  size_t padding_ = 0;  // O_DIRECT: zero bytes past the end written with the last block
  bool finished_ = false;
};

// Opens and validates a safetensors file: header length sane (<= 100 MB, inside the file), JSON
// that parses to an object, metadata a map of strings, every tensor with a known dtype,
// non-negative shape, shape x dtype size == its offsets' span, offsets contiguous from 0 in
// offset order, and the file exactly as long as the header says. Every problem is an InputError
// naming the file and what is wrong. read() uses pread on the open file, so it may be called
// from several threads at once.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }  // in offset order
  const StMetadata& metadata() const { return metadata_; }
  const StTensor* find(std::string_view name) const;  // nullptr when absent
  const StTensor& at(std::string_view name) const;    // InputError naming the file when absent
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t data_start() const { return data_start_; }  // 8 + header length

  // Reads elements [elem_offset, elem_offset + elem_count) of tensor `name` (flat, row-major)
  // into out (elem_count x dtype size bytes), reading only those bytes. InputError when the
  // tensor is absent, the range lies outside it, or the file is shorter than at open.
  void read(std::string_view name, int64_t elem_offset, int64_t elem_count, void* out) const;
  // The same by byte range of a tensor.
  void read_bytes(const StTensor& t, uint64_t byte_offset, uint64_t bytes, void* out) const;

 private:
  void parse_header(const std::string& json);
  void pread_all(uint64_t pos, uint64_t bytes, void* out, std::string_view what) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  StMetadata metadata_;
};

}  // namespace zerod
