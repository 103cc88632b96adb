#include "engine/checkpoint/shard_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>

#include "core/crc32c.h"
#include "core/error.h"

namespace zerod {

std::string rank_file_name(int rank) {
  return fmt::format("rank_{:05d}.safetensors", rank);
}

CheckpointFile write_rank_file(const std::string& dir, int rank,
                               const std::vector<ShardData>& shards, ShardSource* source) {
  CheckpointFile out;
  out.rank = rank;
  if (shards.empty()) return out;
  out.name = rank_file_name(rank);
  std::vector<SafetensorsWriter::Entry> entries;
  StMetadata meta{{"format", "zerod-optimizer-shard"}, {"rank", std::to_string(rank)}};
  for (const ShardData& s : shards) {
    const std::vector<int64_t> shape{s.end - s.begin};
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
      entries.push_back({s.unit_name + "." + kind, StDType::kF32, shape});
    }
    meta[s.unit_name + ".slice"] = fmt::format("{}:{}", s.begin, s.end);
    out.slices.push_back({s.file_unit >= 0 ? s.file_unit : s.unit, s.begin, s.end});
  }
  const std::string path = (std::filesystem::path(dir) / out.name).string();
  SafetensorsWriter w(path, entries, meta, /*direct=*/true);
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardData s = source ? source->acquire(i) : shards[i];
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * sizeof(float);
    w.write(s.unit_name + ".master", s.master, bytes);
    w.write(s.unit_name + ".exp_avg", s.exp_avg, bytes);
    w.write(s.unit_name + ".exp_avg_sq", s.exp_avg_sq, bytes);
    if (source) source->release(i);
  }
  w.finish();
  out.bytes = static_cast<int64_t>(w.total_bytes());
  out.crc32c = w.crc32c();
  return out;
}

namespace {

constexpr size_t kLoadChunk = size_t{16} << 20;
constexpr size_t kLoadAlign = 4096;

// Bytes of a file to copy to memory.
struct Segment {
  uint64_t offset = 0;  // in the file
  uint64_t bytes = 0;
  char* dst = nullptr;
};

struct AlignedChunk {
  explicit AlignedChunk(size_t n) : p(static_cast<char*>(std::aligned_alloc(kLoadAlign, n))) {
    ZD_CHECK(p != nullptr, "cannot allocate a {} byte read buffer", n);
  }
  ~AlignedChunk() { std::free(p); }
  AlignedChunk(const AlignedChunk&) = delete;
  AlignedChunk& operator=(const AlignedChunk&) = delete;
  char* p;
};

// Reads up to n bytes at offset (a multiple of kLoadAlign) into buf; fewer only at the end.
ssize_t read_chunk(int fd, char* buf, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (got % kLoadAlign != 0) break;  // a short read that is not block-sized: the end
  }
  return static_cast<ssize_t>(got);
}

// Streams one file: size and CRC32C checked, segments (sorted by offset) copied out.
int64_t stream_file(const std::string& file, const CheckpointFile& f, std::vector<Segment>& segs) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) ZD_THROW_INPUT("{}: missing ({})", file, ec.message());
  if (static_cast<int64_t>(size) != f.bytes) {
    ZD_THROW_INPUT("{}: {} bytes, the manifest says {} (torn or truncated)", file, size, f.bytes);
  }
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ZD_THROW_INPUT("{}: cannot open: {}", file, std::strerror(errno));
  std::sort(segs.begin(), segs.end(),
            [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  AlignedChunk bufs[2] = {AlignedChunk(kLoadChunk), AlignedChunk(kLoadChunk)};
  uint32_t crc = 0;
  uint64_t pos = 0;
  size_t next_seg = 0;
  std::future<ssize_t> ahead =
      std::async(std::launch::async, read_chunk, fd, bufs[0].p, kLoadChunk, 0);
  for (int k = 0;; k ^= 1) {
    const ssize_t n = ahead.get();
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ZD_THROW_INPUT("{}: read error at offset {}: {}", file, pos, std::strerror(err));
    }
    const bool last = static_cast<size_t>(n) < kLoadChunk;
    if (!last) {
      ahead = std::async(std::launch::async, read_chunk, fd, bufs[k ^ 1].p, kLoadChunk,
                         pos + static_cast<uint64_t>(n));
    }
    const char* chunk = bufs[k].p;
    const uint64_t end = pos + static_cast<uint64_t>(n);
    crc = crc32c(chunk, static_cast<size_t>(n), crc);
    // Copy out every segment part inside [pos, end).
    for (size_t i = next_seg; i < segs.size() && segs[i].offset < end; ++i) {
      const Segment& sg = segs[i];
      const uint64_t lo = std::max(sg.offset, pos), hi = std::min(sg.offset + sg.bytes, end);
      if (lo < hi) std::memcpy(sg.dst + (lo - sg.offset), chunk + (lo - pos), hi - lo);
      if (sg.offset + sg.bytes <= end && i == next_seg) ++next_seg;
    }
    pos = end;
    if (last) break;
  }
  ::close(fd);
  if (static_cast<int64_t>(pos) != f.bytes) {
    ZD_THROW_INPUT("{}: read {} bytes, the manifest says {} (torn or truncated)", file, pos,
                   f.bytes);
  }
  if (crc != f.crc32c) {
    ZD_THROW_INPUT("{}: CRC32C {:08x}, the manifest says {:08x} (corrupt)", file, crc, f.crc32c);
  }
  return static_cast<int64_t>(pos);
}

// InputError when the manifest's files leave part of a unit uncovered.
void check_coverage(const std::string& path, const Manifest& manifest) {
  for (size_t u = 0; u < manifest.units.size(); ++u) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const auto& f : manifest.files)
      for (const auto& s : f.slices)
        if (s.unit == static_cast<int>(u)) spans.emplace_back(s.begin, s.end);
    std::sort(spans.begin(), spans.end());
    int64_t covered = 0;
    for (const auto& [b, e] : spans) {
      if (b > covered) break;
      covered = std::max(covered, e);
    }
    if (covered < manifest.units[u].numel) {
      ZD_THROW_INPUT("{}: the manifest's files do not hold unit {} ({}) beyond element {} of {}",
                     path, u, manifest.units[u].name, covered, manifest.units[u].numel);
    }
  }
}

}  // namespace

int64_t load_shards(const std::string& path, const Manifest& manifest,
                    const std::vector<ShardRequest>& requests) {
  check_coverage(path, manifest);
  // Zero the padding past each unit's end; the files cover the rest.
  for (const ShardRequest& r : requests) {
    const int64_t numel = manifest.units.at(static_cast<size_t>(r.unit)).numel;
    const int64_t from = std::clamp(numel, r.begin, r.end) - r.begin;
    for (float* p : {r.master, r.exp_avg, r.exp_avg_sq})
      if (p) std::fill(p + from, p + (r.end - r.begin), 0.0f);
  }
  int64_t total = 0;
  for (const CheckpointFile& f : manifest.files) {
    const std::string file = (std::filesystem::path(path) / f.name).string();
    std::vector<Segment> segs;
    std::unique_ptr<SafetensorsReader> header;  // tensor offsets, read when first needed
    for (const ShardSlice& s : f.slices) {
      for (const ShardRequest& r : requests) {
        if (r.unit != s.unit) continue;
        const int64_t lo = std::max(r.begin, s.begin), hi = std::min(r.end, s.end);
        if (lo >= hi) continue;
        if (!header) header = std::make_unique<SafetensorsReader>(file);
        const std::string& uname = manifest.units.at(static_cast<size_t>(s.unit)).name;
        const std::pair<const char*, float*> kinds[3] = {
            {".master", r.master}, {".exp_avg", r.exp_avg}, {".exp_avg_sq", r.exp_avg_sq}};
        for (const auto& [kind, dst] : kinds) {
          if (dst == nullptr) continue;
          const StTensor& t = header->at(uname + kind);
          const uint64_t want = static_cast<uint64_t>(hi - s.begin) * sizeof(float);
          ZD_CHECK_INPUT(t.bytes() >= want, "{}: tensor {} has {} bytes, the slice needs {}", file,
                         t.name, t.bytes(), want);
          segs.push_back(
              {header->data_start() + t.begin + static_cast<uint64_t>(lo - s.begin) * sizeof(float),
               static_cast<uint64_t>(hi - lo) * sizeof(float),
               reinterpret_cast<char*>(dst + (lo - r.begin))});
        }
      }
    }
    if (segs.empty()) continue;  // nothing this rank needs (another rank verifies it)
    header.reset();
    total += stream_file(file, f, segs);
  }
  return total;
}

ShardReader::ShardReader(std::string path, const Manifest& manifest)
    : path_(std::move(path)), manifest_(manifest) {
  check_coverage(path_, manifest_);
}

ShardReader::~ShardReader() = default;

SafetensorsReader& ShardReader::open(const std::string& name) {
  auto& r = readers_[name];
  if (!r) r = std::make_unique<SafetensorsReader>((std::filesystem::path(path_) / name).string());
  return *r;
}

void ShardReader::read(int unit, int64_t begin, int64_t end, float* master, float* exp_avg,
                       float* exp_avg_sq) {
  ZD_CHECK(unit >= 0 && unit < static_cast<int>(manifest_.units.size()), "unit {}", unit);
  const int64_t n = end - begin;
  for (float* p : {master, exp_avg, exp_avg_sq})
    if (p) std::fill(p, p + n, 0.0f);
  const std::string& uname = manifest_.units[static_cast<size_t>(unit)].name;
  for (const CheckpointFile& f : manifest_.files) {
    for (const ShardSlice& s : f.slices) {
      if (s.unit != unit) continue;
      const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
      if (lo >= hi) continue;
      SafetensorsReader& r = open(f.name);
      if (master) r.read(uname + ".master", lo - s.begin, hi - lo, master + (lo - begin));
      if (exp_avg) r.read(uname + ".exp_avg", lo - s.begin, hi - lo, exp_avg + (lo - begin));
      if (exp_avg_sq)
        r.read(uname + ".exp_avg_sq", lo - s.begin, hi - lo, exp_avg_sq + (lo - begin));
    }
  }
}

}  // namespace zerod
