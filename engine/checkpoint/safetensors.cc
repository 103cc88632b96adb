#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/fault_points.h"
#include "engine/checkpoint/io_error.h"
#include "engine/config/input_limits.h"

namespace zerod {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr size_t kWriteBuffer = size_t{4} << 20;
constexpr size_t kDirectBuffer = size_t{16} << 20;  // O_DIRECT: one write per 16 MiB
constexpr size_t kDirectAlign = 4096;               // O_DIRECT block size (every common disk)
constexpr size_t kCrcPiece = size_t{256} << 10;     // copied then checksummed while in cache
constexpr size_t kReadChunk = size_t{4} << 20;

struct DTypeInfo {
  StDType type;
  std::string_view name;
  int bits;
};
constexpr std::array<DTypeInfo, 22> kDTypes = {{
    {StDType::kBool, "BOOL", 8},
    {StDType::kF4, "F4", 4},
    {StDType::kF6_E2M3, "F6_E2M3", 6},
    {StDType::kF6_E3M2, "F6_E3M2", 6},
    {StDType::kU8, "U8", 8},
    {StDType::kI8, "I8", 8},
    {StDType::kF8_E5M2, "F8_E5M2", 8},
    {StDType::kF8_E4M3, "F8_E4M3", 8},
    {StDType::kF8_E8M0, "F8_E8M0", 8},
    {StDType::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {StDType::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {StDType::kI16, "I16", 16},
    {StDType::kU16, "U16", 16},
    {StDType::kF16, "F16", 16},
    {StDType::kBF16, "BF16", 16},
    {StDType::kI32, "I32", 32},
    {StDType::kU32, "U32", 32},
    {StDType::kF32, "F32", 32},
    {StDType::kC64, "C64", 64},
    {StDType::kF64, "F64", 64},
    {StDType::kI64, "I64", 64},
    {StDType::kU64, "U64", 64},
}};

const DTypeInfo& dtype_info(StDType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d;
  ZD_THROW("unknown safetensors dtype {}", static_cast<int>(t));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Bytes of a tensor, or nullopt on overflow or when the bits do not fill whole bytes.
std::optional<uint64_t> tensor_bytes(StDType dtype, const std::vector<int64_t>& shape) {
  uint64_t bits = static_cast<uint64_t>(st_dtype_bits(dtype));
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bits, static_cast<uint64_t>(d), &bits)) return {};
  }
  if (bits % 8 != 0) return {};
  return bits / 8;
}

std::string errno_string(int err) {
  return std::string(std::strerror(err));
}

}  // namespace

std::string_view st_dtype_name(StDType t) {
  return dtype_info(t).name;
}
int st_dtype_bits(StDType t) {
  return dtype_info(t).bits;
}
std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}
StDType to_st_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return StDType::kF32;
    case DType::kBF16:
      return StDType::kBF16;
    case DType::kF16:
      return StDType::kF16;
  }
  ZD_THROW("unknown DType {}", static_cast<int>(t));
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

FileChecksum file_crc32c(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ZD_THROW_INPUT("{}: cannot open: {}", path, errno_string(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(kReadChunk);
  FileChecksum sum;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ZD_THROW("{}: read at offset {} failed: {}", path, sum.bytes, errno_string(err));
    }
    if (r == 0) break;
    sum.crc32c = crc32c(buf.data(), static_cast<size_t>(r), sum.crc32c);
    sum.bytes += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<Entry>& tensors,
                                     const StMetadata& metadata, bool direct)
    : path_(std::move(path)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  tensors_.reserve(tensors.size());
  for (const Entry& e : tensors) {
    ZD_CHECK(!e.name.empty() && e.name != "__metadata__", "{}: bad tensor name '{}'", path_,
             e.name);
    ZD_CHECK(names.insert(e.name).second, "{}: tensor {} listed twice", path_, e.name);
    const auto bytes = tensor_bytes(e.dtype, e.shape);
    ZD_CHECK(bytes.has_value(), "{}: tensor {} of shape {} and dtype {} has no whole byte size",
             path_, e.name, shape_string(e.shape), st_dtype_name(e.dtype));
    StTensor t{e.name, e.dtype, e.shape, offset, offset + *bytes};
    offset = t.end;
    header[e.name] = {
        {"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {t.begin, t.end}}};
    tensors_.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the reference writer pads to 8 with spaces
  header_len_ = json.size();
  ZD_CHECK(header_len_ <= kMaxHeaderBytes, "{}: header of {} bytes exceeds the format's limit",
           path_, header_len_);
  total_ = 8 + header_len_ + offset;

  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (direct) {
    fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0644);
    direct_ = fd_ >= 0;
  }
  if (fd_ < 0) fd_ = ::open(path_.c_str(), flags, 0644);  // no O_DIRECT here (e.g. tmpfs)
  if (fd_ < 0) ZD_THROW_INPUT("{}: cannot create: {}", path_, errno_string(errno));
  buffer_size_ = direct_ ? kDirectBuffer : kWriteBuffer;
  void* mem = std::aligned_alloc(kDirectAlign, buffer_size_);
  ZD_CHECK(mem != nullptr, "{}: cannot allocate a {} byte write buffer", path_, buffer_size_);
  buffer_.reset(static_cast<char*>(mem));
  std::array<unsigned char, 8> len{};
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header_len_ >> (8 * i));
  append(len.data(), len.size());
  append(json.data(), json.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::skip_complete() {
  while (current_ < tensors_.size() && current_done_ == tensors_[current_].bytes()) {
    ++current_;
    current_done_ = 0;
  }
}

void SafetensorsWriter::write(std::string_view name, const void* data, size_t bytes) {
  ZD_CHECK(!finished_ && fd_ >= 0, "{}: write of tensor {} after finish() or a failure", path_,
           name);
  if (bytes == 0) return;
  skip_complete();
  ZD_CHECK(current_ < tensors_.size(), "{}: {} bytes of tensor {} after every tensor is complete",
           path_, bytes, name);
  const StTensor& t = tensors_[current_];
  ZD_CHECK(name == t.name, "{}: got bytes of tensor {} while tensor {} ({} of {}) has {} of {}",
           path_, name, t.name, current_ + 1, tensors_.size(), current_done_, t.bytes());
  ZD_CHECK(current_done_ + bytes <= t.bytes(),
           "{}: tensor {} has {} bytes; a chunk of {} after {} runs past its end", path_, t.name,
           t.bytes(), bytes, current_done_);
  append(data, bytes);
  current_done_ += bytes;
}

void SafetensorsWriter::FreeDeleter::operator()(char* p) const {
  std::free(p);
}

void SafetensorsWriter::append(const void* data, size_t bytes) {
  written_ += bytes;
  if (!direct_ && buffered_ + bytes > buffer_size_ && bytes >= buffer_size_ / 2) {
    flush_buffer();
    crc_ = zerod::crc32c(data, bytes, crc_);
    write_all(data, bytes);  // large: straight from the caller's memory
    return;
  }
  // Through the staging buffer, a piece at a time: each piece is checksummed right after its
  // copy, while it is still in cache.
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (buffered_ == buffer_size_) flush_buffer();
    const size_t n = std::min({bytes, buffer_size_ - buffered_, kCrcPiece});
    std::memcpy(buffer_.get() + buffered_, p, n);
    crc_ = zerod::crc32c(buffer_.get() + buffered_, n, crc_);
    buffered_ += n;
    p += n;
    bytes -= n;
  }
}

void SafetensorsWriter::flush_buffer() {
  if (buffered_ == 0) return;
  if (direct_ && buffered_ % kDirectAlign != 0) {
    // The end of the file: O_DIRECT writes whole blocks; finish() truncates the padding.
    const size_t padded = (buffered_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(buffer_.get() + buffered_, 0, padded - buffered_);
    write_all(buffer_.get(), padded);
    padding_ = padded - buffered_;
  } else {
    write_all(buffer_.get(), buffered_);
  }
  buffered_ = 0;
}

void SafetensorsWriter::fail_io(const std::string& what, int err) const {
  throw_save_io_error(path_, what, err, total_);
}

void SafetensorsWriter::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const int injected = fault_point("save.write");  // tests: core/fault_points.h
    const ssize_t w = injected != 0 ? -1 : ::write(fd_, p, std::min(bytes, size_t{1} << 30));
    if (injected != 0) errno = injected;
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && direct_) {
      // The file system took O_DIRECT at open but refuses the write: go on buffered.
      const int fl = ::fcntl(fd_, F_GETFL);
      if (fl >= 0 && ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT) == 0) {
        direct_ = false;
        continue;
      }
    }
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      ::close(fd_);
      fd_ = -1;  // no further writes: the file is incomplete
      fail_io(fmt::format("write of {} bytes at offset {}", bytes, on_disk_), err);
    }
    p += w;
    bytes -= static_cast<size_t>(w);
    on_disk_ += static_cast<uint64_t>(w);
  }
}

void SafetensorsWriter::finish() {
  ZD_CHECK(!finished_ && fd_ >= 0, "{}: finish() twice or after a failure", path_);
  skip_complete();
  if (current_ < tensors_.size()) {
    const StTensor& t = tensors_[current_];
    ZD_THROW("{}: finish() with tensor {} ({} of {}) at {} of {} bytes", path_, t.name,
             current_ + 1, tensors_.size(), current_done_, t.bytes());
  }
  flush_buffer();
  ZD_CHECK(on_disk_ == total_ + padding_, "{}: wrote {} bytes, expected {}", path_,
           on_disk_ - padding_, total_);
  if (padding_ > 0 && ::ftruncate(fd_, static_cast<off_t>(total_)) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    ZD_THROW("{}: truncating to {} bytes failed: {}", path_, total_, errno_string(err));
  }
  const int injected = fault_point("save.fsync");
  if (injected != 0 || ::fsync(fd_) != 0) {
    const int err = injected != 0 ? injected : errno;
    ::close(fd_);
    fd_ = -1;
    fail_io(fmt::format("fsync after {} bytes", on_disk_), err);
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) ZD_THROW("{}: close failed: {}", path_, errno_string(errno));
  buffer_.reset();
  finished_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) ZD_THROW_INPUT("{}: cannot open: {}", path_, errno_string(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) ZD_THROW("{}: fstat failed: {}", path_, errno_string(errno));
    file_bytes_ = static_cast<uint64_t>(st.st_size);
    if (file_bytes_ < 8)
      ZD_THROW_INPUT("{}: not a safetensors file: {} bytes, shorter than the 8-byte header length",
                     path_, file_bytes_);
    std::array<unsigned char, 8> len{};
    pread_all(0, 8, len.data(), "the header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
    // The length read is not quoted: those 8 bytes may be any file's content (input_limits.h).
    if (n > kMaxHeaderBytes)
      ZD_THROW_INPUT(
          "{}: not a safetensors file: its header length (the first 8 bytes) exceeds the format's "
          "limit of {} bytes",
          path_, kMaxHeaderBytes);
    if (8 + n > file_bytes_)
      ZD_THROW_INPUT(
          "{}: not a safetensors file, or a truncated one: its header length (the first 8 bytes) "
          "runs past the end of the {}-byte file",
          path_, file_bytes_);
    std::string json(n, '\0');
    pread_all(8, n, json.data(), "the header");
    data_start_ = 8 + n;
    parse_header(json);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::parse_header(const std::string& text) {
  nlohmann::json header;
  if (std::string deep = config::json_depth_problem(text); !deep.empty())
    ZD_THROW_INPUT("{}: the header is not valid: {}", path_, deep);
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ZD_THROW_INPUT("{}: the header is not valid JSON: {}", path_,
                   config::json_error_without_input(e.what()));
  }
  if (!header.is_object())
    ZD_THROW_INPUT("{}: the header is JSON {}, expected an object", path_, header.type_name());

  const auto as_u64 = [&](const nlohmann::json& v, std::string_view what, const std::string& name) {
    if (!v.is_number_unsigned())  // nlohmann parses non-negative integers as unsigned
      ZD_THROW_INPUT("{}: tensor {}: {} holds {}, expected a non-negative integer", path_, name,
                     what, v.dump());
    return v.get<uint64_t>();
  };

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object())
        ZD_THROW_INPUT("{}: __metadata__ is JSON {}, expected an object of strings", path_,
                       value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          ZD_THROW_INPUT("{}: __metadata__ entry {} is {}, expected a string", path_, mk,
                         mv.dump());
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!value.is_object())
      ZD_THROW_INPUT(
          "{}: tensor {}: entry is JSON {}, expected an object with dtype, shape and "
          "data_offsets",
          path_, key, value.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) ZD_THROW_INPUT("{}: tensor {}: no {}", path_, key, field);
    StTensor t;
    t.name = key;
    const auto& dt = value["dtype"];
    if (!dt.is_string()) ZD_THROW_INPUT("{}: tensor {}: dtype is {}", path_, key, dt.dump());
    const auto parsed = parse_st_dtype(dt.get<std::string>());
    if (!parsed)
      ZD_THROW_INPUT("{}: tensor {}: unknown dtype {} (known: F32, BF16, F16, F64, I64, ...)",
                     path_, key, dt.dump());
    t.dtype = *parsed;
    const auto& shape = value["shape"];
    if (!shape.is_array())
      ZD_THROW_INPUT("{}: tensor {}: shape is {}, expected an array", path_, key, shape.dump());
    for (const auto& d : shape) {
      const uint64_t v = as_u64(d, "shape", key);
      if (v > static_cast<uint64_t>(INT64_MAX))
        ZD_THROW_INPUT("{}: tensor {}: dimension {} is too large", path_, key, v);
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = value["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      ZD_THROW_INPUT("{}: tensor {}: data_offsets is {}, expected [begin, end]", path_, key,
                     off.dump());
    t.begin = as_u64(off[0], "data_offsets", key);
    t.end = as_u64(off[1], "data_offsets", key);
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StTensor& t = tensors_[i];
    if (t.end < t.begin)
      ZD_THROW_INPUT("{}: tensor {}: data_offsets [{}, {}] end before they begin", path_, t.name,
                     t.begin, t.end);
    if (t.begin != pos) {
      if (i == 0)
        ZD_THROW_INPUT("{}: tensor {}: data_offsets [{}, {}]: the first tensor must begin at 0",
                       path_, t.name, t.begin, t.end);
      ZD_THROW_INPUT("{}: tensor {}: data_offsets [{}, {}] {} tensor {}, which ends at {}", path_,
                     t.name, t.begin, t.end, t.begin < pos ? "overlap" : "leave a gap after",
                     tensors_[i - 1].name, pos);
    }
    const auto bytes = tensor_bytes(t.dtype, t.shape);
    if (!bytes)
      ZD_THROW_INPUT("{}: tensor {}: shape {} of {} does not fill whole bytes or overflows", path_,
                     t.name, shape_string(t.shape), st_dtype_name(t.dtype));
    if (*bytes != t.bytes())
      ZD_THROW_INPUT(
          "{}: tensor {}: shape {} of {} needs {} bytes but data_offsets [{}, {}] span "
          "{}",
          path_, t.name, shape_string(t.shape), st_dtype_name(t.dtype), *bytes, t.begin, t.end,
          t.bytes());
    pos = t.end;
    index_.emplace(t.name, i);
  }
  const uint64_t expected = data_start_ + pos;
  if (expected > file_bytes_)
    ZD_THROW_INPUT("{}: truncated: the header says the file is {} bytes, it has {}", path_,
                   expected, file_bytes_);
  if (expected < file_bytes_)
    ZD_THROW_INPUT(
        "{}: {} bytes after the last tensor (the header says the file is {} bytes, it "
        "has {})",
        path_, file_bytes_ - expected, expected, file_bytes_);
}

const StTensor* SafetensorsReader::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const StTensor& SafetensorsReader::at(std::string_view name) const {
  const StTensor* t = find(name);
  if (!t) ZD_THROW_INPUT("{}: no tensor {}", path_, name);
  return *t;
}

void SafetensorsReader::read(std::string_view name, int64_t elem_offset, int64_t elem_count,
                             void* out) const {
  const StTensor& t = at(name);
  const int bits = st_dtype_bits(t.dtype);
  ZD_CHECK(bits % 8 == 0, "{}: tensor {} of {} cannot be read by element", path_, t.name,
           st_dtype_name(t.dtype));
  const int64_t numel = t.numel();
  if (elem_offset < 0 || elem_count < 0 || elem_offset > numel || elem_count > numel - elem_offset)
    ZD_THROW_INPUT("{}: tensor {} has {} elements; cannot read [{}, {})", path_, t.name, numel,
                   elem_offset, elem_offset + elem_count);
  const uint64_t es = static_cast<uint64_t>(bits / 8);
  read_bytes(t, static_cast<uint64_t>(elem_offset) * es, static_cast<uint64_t>(elem_count) * es,
             out);
}

void SafetensorsReader::read_bytes(const StTensor& t, uint64_t byte_offset, uint64_t bytes,
                                   void* out) const {
  ZD_CHECK(byte_offset <= t.bytes() && bytes <= t.bytes() - byte_offset,
           "{}: bytes [{}, +{}) outside tensor {} ({} bytes)", path_, byte_offset, bytes, t.name,
           t.bytes());
  pread_all(data_start_ + t.begin + byte_offset, bytes, out, "tensor " + t.name);
}

void SafetensorsReader::pread_all(uint64_t pos, uint64_t bytes, void* out,
                                  std::string_view what) const {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t r =
        ::pread(fd_, p, std::min<uint64_t>(bytes, uint64_t{1} << 30), static_cast<off_t>(pos));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ZD_THROW("{}: read at offset {} failed: {}", path_, pos, errno_string(errno));
    if (r == 0)
      ZD_THROW_INPUT(
          "{}: the file ends at byte {} while reading {} (truncated since it was "
          "opened?)",
          path_, pos, what);
    p += r;
    pos += static_cast<uint64_t>(r);
    bytes -= static_cast<uint64_t>(r);
  }
}

}  // namespace zerod
