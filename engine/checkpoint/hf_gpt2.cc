#include "engine/checkpoint/hf_gpt2.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zerod {

namespace {

constexpr int64_t kChunkElems = int64_t{1} << 20;  // conversion buffer: 4 MiB of floats
constexpr const char* kPrefix = "transformer.";

// dst[c * dst_ld + r] = src[r * src_ld + c] for r < rows, c < cols, in 32 x 32 tiles.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t src_ld, float* dst,
               int64_t dst_ld) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * dst_ld + r] = src[r * src_ld + c];
    }
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

std::string spec_json(const GptSpec& s) {
  nlohmann::ordered_json j = {
      {"model", "gpt2"},    {"n_layer", s.n_layer},       {"n_head", s.n_head},
      {"n_embd", s.n_embd}, {"vocab_size", s.vocab_size}, {"seq_len", s.seq_len}};
  return j.dump();
}

void fsync_directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ZD_THROW("{}: cannot open directory to fsync it: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ZD_THROW("{}: fsync of the directory failed: {}", dir, std::strerror(err));
}

// HF name ("transformer." stripped) -> is it a buffer or tied head that import ignores?
bool ignored_name(const std::string& name) {
  if (name == "lm_head.weight") return true;
  // h.<digits>.attn.bias, h.<digits>.attn.masked_bias
  if (name.rfind("h.", 0) != 0) return false;
  size_t i = 2;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == 2) return false;
  const std::string rest = name.substr(i);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

// Writes n floats of src as `dtype` under tensor `name`, converting through `scratch`.
void write_converted(SafetensorsWriter& w, const std::string& name, const float* src, int64_t n,
                     DType dtype, std::vector<uint16_t>& scratch) {
  if (dtype == DType::kF32) {
    w.write(name, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; i += kChunkElems) {
    const int64_t m = std::min(kChunkElems, n - i);
    for (int64_t k = 0; k < m; ++k) scratch[k] = f32_to_bf16_bits(src[i + k]);
    w.write(name, scratch.data(), static_cast<size_t>(m) * sizeof(uint16_t));
  }
}

// Reads elements [begin, begin + n) of tensor t as floats into dst.
void read_converted(const SafetensorsReader& r, const StTensor& t, int64_t begin, int64_t n,
                    float* dst, std::vector<uint16_t>& scratch) {
  if (t.dtype == StDType::kF32) {
    r.read(t.name, begin, n, dst);
    return;
  }
  for (int64_t i = 0; i < n; i += kChunkElems) {
    const int64_t m = std::min(kChunkElems, n - i);
    r.read(t.name, begin + i, m, scratch.data());
    if (t.dtype == StDType::kBF16) {
      for (int64_t k = 0; k < m; ++k) dst[i + k] = bf16_bits_to_f32(scratch[k]);
    } else {
      for (int64_t k = 0; k < m; ++k) dst[i + k] = f16_bits_to_f32(scratch[k]);
    }
  }
}

constexpr size_t kMaxLines = 12;  // shape problems listed one per line before "... and N more"

std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kMaxNames = 24;
  if (names.size() <= kMaxNames) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)",
                     fmt::join(names.begin(), names.begin() + kMaxNames, ", "), names.size());
}

// What the file's shapes say about its model, to set against what was expected.
std::string describe_file(const std::map<std::string, const StTensor*>& file) {
  int layers = 0;
  for (const auto& [name, t] : file) {
    if (name.rfind("h.", 0) != 0) continue;
    const int l = std::atoi(name.c_str() + 2);
    layers = std::max(layers, l + 1);
  }
  std::string out = fmt::format(" (the file has {} layers", layers);
  if (auto it = file.find("wte.weight"); it != file.end() && it->second->shape.size() == 2)
    out += fmt::format(", n_embd {}, vocab_size {}", it->second->shape[1], it->second->shape[0]);
  if (auto it = file.find("wpe.weight"); it != file.end() && !it->second->shape.empty())
    out += fmt::format(", {} positions", it->second->shape[0]);
  return out + ")";
}

}  // namespace

std::vector<int64_t> hf_shape(const TensorInfo& t) {
  std::vector<int64_t> s = t.shape;
  if (t.real_rows >= 0) s[0] = t.real_rows;
  if (t.hf_transposed) std::reverse(s.begin(), s.end());
  return s;
}

FileChecksum export_hf_gpt2(const ParamLayout& layout,
                            const std::function<void(int unit, float* out)>& read_unit,
                            const std::string& path, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    ZD_THROW_INPUT("{}: Hugging Face export supports fp32 and bf16, not {}", path,
                   dtype_name(dtype));
  std::vector<SafetensorsWriter::Entry> entries;
  int64_t max_unit = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    max_unit = std::max(max_unit, layout.unit(u).numel);
    for (const TensorInfo& t : layout.unit(u).tensors)
      entries.push_back({t.name, to_st_dtype(dtype), hf_shape(t)});
  }
  const StMetadata metadata = {{"format", "pt"}, {kHfZerodMetadataKey, spec_json(layout.spec())}};
  const std::string tmp = path + ".tmp";
  try {
    SafetensorsWriter w(tmp, entries, metadata);
    std::vector<float> unit(static_cast<size_t>(max_unit));
    std::vector<float> fscratch;  // one chunk of transposed rows
    std::vector<uint16_t> hscratch(dtype == DType::kBF16 ? kChunkElems : 0);
    for (int u = 0; u < layout.num_units(); ++u) {
      read_unit(u, unit.data());
      for (const TensorInfo& t : layout.unit(u).tensors) {
        const float* src = unit.data() + t.offset;
        if (!t.hf_transposed) {
          const int64_t n = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
          write_converted(w, t.name, src, n, dtype, hscratch);
          continue;
        }
        // Ours (out, in) -> HF (in, out), a block of HF rows (our columns) at a time.
        ZD_CHECK(t.shape.size() == 2 && t.real_rows < 0, "tensor {}", t.name);
        const int64_t out = t.shape[0], in = t.shape[1];
        const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / out);
        fscratch.resize(static_cast<size_t>(std::min(in, rows_per_chunk) * out));
        for (int64_t i0 = 0; i0 < in; i0 += rows_per_chunk) {
          const int64_t nr = std::min(rows_per_chunk, in - i0);
          transpose(src + i0, out, nr, in, fscratch.data(), out);
          write_converted(w, t.name, fscratch.data(), nr * out, dtype, hscratch);
        }
      }
    }
    w.finish();
    const FileChecksum sum{w.total_bytes(), w.crc32c()};
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      ZD_THROW("{}: rename to {} failed: {}", tmp, path, std::strerror(errno));
    fsync_directory_of(path);
    return sum;
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void import_hf_gpt2(const std::string& path, const ParamLayout& layout,
                    const std::function<void(int unit, const float* unit_flat)>& consume) {
  const SafetensorsReader r(path);
  const GptSpec& spec = layout.spec();

  std::vector<std::string> problems;
  // A file we exported records n_head, the one thing shapes cannot tell.
  if (auto it = r.metadata().find(kHfZerodMetadataKey); it != r.metadata().end()) {
    nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      ZD_THROW_INPUT("{}: metadata '{}' is not a JSON object: {}", path, kHfZerodMetadataKey,
                     it->second);
    if (j.contains("n_head") &&
        (!j["n_head"].is_number_integer() || j["n_head"].get<int64_t>() != spec.n_head))
      problems.push_back(
          fmt::format("the file was exported with n_head {}, the model has n_head {}",
                      j["n_head"].dump(), spec.n_head));
  }

  // File tensors by HF name without the prefix.
  std::map<std::string, const StTensor*> file;
  for (const StTensor& t : r.tensors()) {
    std::string name = t.name;
    if (name.rfind(kPrefix, 0) == 0) name = name.substr(std::strlen(kPrefix));
    if (ignored_name(name)) continue;
    if (!file.emplace(name, &t).second)
      problems.push_back(
          fmt::format("tensor {} appears twice (with and without '{}')", name, kPrefix));
  }
  std::map<std::string, const StTensor*> by_name = file;  // what no layout tensor claimed
  std::vector<std::string> missing;
  for (int u = 0; u < layout.num_units(); ++u)
    for (const TensorInfo& t : layout.unit(u).tensors) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) {
        missing.push_back(t.name);
        continue;
      }
      const StTensor& f = *it->second;
      by_name.erase(it);
      const std::vector<int64_t> want = hf_shape(t);
      const bool is_wpe = t.name == "wpe.weight";
      const bool ok = is_wpe ? f.shape.size() == 2 && f.shape[0] >= want[0] && f.shape[1] == want[1]
                             : f.shape == want;
      if (!ok)
        problems.push_back(fmt::format("tensor {} has shape {}, expected {}{}", f.name,
                                       shape_str(f.shape), shape_str(want),
                                       is_wpe ? " (or more rows)" : ""));
      if (f.dtype != StDType::kF32 && f.dtype != StDType::kBF16 && f.dtype != StDType::kF16)
        problems.push_back(fmt::format("tensor {} has dtype {}, expected F32, BF16 or F16", f.name,
                                       st_dtype_name(f.dtype)));
    }
  if (problems.size() > kMaxLines) {
    const size_t more = problems.size() - kMaxLines;
    problems.resize(kMaxLines);
    problems.push_back(fmt::format("... and {} more tensors with a wrong shape or dtype", more));
  }
  if (!missing.empty()) problems.push_back(fmt::format("missing tensors: {}", name_list(missing)));
  if (!by_name.empty()) {
    std::vector<std::string> extra;
    for (const auto& [name, t] : by_name) extra.push_back(t->name);
    problems.push_back(fmt::format("unknown tensors: {}", name_list(extra)));
  }
  if (!problems.empty())
    ZD_THROW_INPUT(
        "{}: not a GPT-2 model with n_layer {}, n_head {}, n_embd {}, vocab_size {}, seq_len {}"
        "{}:\n  {}",
        path, spec.n_layer, spec.n_head, spec.n_embd, spec.vocab_size, spec.seq_len,
        describe_file(file), fmt::join(problems, "\n  "));

  int64_t max_unit = 0;
  for (int u = 0; u < layout.num_units(); ++u) max_unit = std::max(max_unit, layout.unit(u).numel);
  std::vector<float> unit(static_cast<size_t>(max_unit));
  std::vector<float> fscratch;
  std::vector<uint16_t> hscratch(kChunkElems);
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& ul = layout.unit(u);
    std::fill(unit.begin(), unit.begin() + ul.numel, 0.0f);
    for (const TensorInfo& t : ul.tensors) {
      const StTensor& f = *file.at(t.name);
      float* dst = unit.data() + t.offset;
      if (!t.hf_transposed) {
        // wte: V of Vp rows; wpe: the first seq_len rows; the rest: every element.
        const int64_t n = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
        read_converted(r, f, 0, n, dst, hscratch);
        continue;
      }
      // HF (in, out) -> ours (out, in), a block of HF rows (our columns) at a time.
      const int64_t out = t.shape[0], in = t.shape[1];
      const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / out);
      fscratch.resize(static_cast<size_t>(std::min(in, rows_per_chunk) * out));
      for (int64_t i0 = 0; i0 < in; i0 += rows_per_chunk) {
        const int64_t nr = std::min(rows_per_chunk, in - i0);
        read_converted(r, f, i0 * out, nr * out, fscratch.data(), hscratch);
        transpose(fscratch.data(), nr, out, out, dst + i0, in);
      }
    }
    consume(u, unit.data());
  }
}

}  // namespace zerod
