#include "engine/checkpoint/hf_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/config/input_limits.h"
#include "engine/config/model_spec.h"

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

std::string spec_json(const ModelSpec& s) {
  nlohmann::ordered_json j = {{"model", model_arch_name(s.arch)},
                              {"n_layer", s.n_layer},
                              {"n_head", s.n_head},
                              {"n_embd", s.n_embd},
                              {"vocab_size", s.vocab_size},
                              {"seq_len", s.seq_len}};
  if (s.llama_family()) {
    j["n_kv_head"] = s.kv_heads();
    j["head_dim"] = s.head_size();
    j["intermediate_size"] = s.ffn();
  }
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

// Writes tensor t of a unit buffer (src = its first element) in HF orientation and real rows
// as `name`.
void write_tensor(SafetensorsWriter& w, const TensorInfo& t, const std::string& name,
                  const float* src, DType dtype, std::vector<float>& fscratch,
                  std::vector<uint16_t>& hscratch) {
  if (!t.hf_transposed) {
    const int64_t n = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
    write_converted(w, name, src, n, dtype, hscratch);
    return;
  }
  // Ours (out, in) -> HF (in, out), a block of HF rows (our columns) at a time.
  ZD_CHECK(t.shape.size() == 2 && t.real_rows < 0, "tensor {}", t.name);
  const int64_t out = t.shape[0], in = t.shape[1];
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / out);
  fscratch.resize(static_cast<size_t>(std::min(in, rows_per_chunk) * out));
  for (int64_t i0 = 0; i0 < in; i0 += rows_per_chunk) {
    const int64_t nr = std::min(rows_per_chunk, in - i0);
    transpose(src + i0, out, nr, in, fscratch.data(), out);
    write_converted(w, name, fscratch.data(), nr * out, dtype, hscratch);
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

// Llama-family names a checkpoint may hold that are not parameters: rotary inv_freq buffers of
// older exports, and the output head when the embedding is tied (save_pretrained omits it, other
// tools write a copy).
bool ignored_llama_name(const std::string& name, const ModelSpec& spec) {
  if (spec.tied() && name == "lm_head.weight") return true;
  const std::string suffix = ".self_attn.rotary_emb.inv_freq";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
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

FileChecksum export_hf_safetensors(const ParamLayout& layout,
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
      for (const TensorInfo& t : layout.unit(u).tensors)
        write_tensor(w, t, t.name, unit.data() + t.offset, dtype, fscratch, hscratch);
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

std::vector<std::string> hf_weight_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) ZD_THROW_INPUT("{}: no such file or directory", path);
    return {path};
  }
  const fs::path dir(path);
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    std::ifstream in(index, std::ios::binary);
    std::ostringstream buf;
    buf << in.rdbuf();
    if (std::string deep = config::json_depth_problem(buf.str()); !deep.empty())
      ZD_THROW_INPUT("{}: {}", index.string(), deep);
    const nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      ZD_THROW_INPUT("{}: not a safetensors index (expected an object with a \"weight_map\")",
                     index.string());
    }
    std::vector<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) {
        ZD_THROW_INPUT("{}: weight_map[\"{}\"] is not a file name", index.string(), name);
      }
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty()) {
        ZD_THROW_INPUT("{}: weight_map[\"{}\"] = \"{}\" is not a file of the directory",
                       index.string(), name, f);
      }
      const std::string full = (dir / f).string();
      if (std::find(files.begin(), files.end(), full) == files.end()) files.push_back(full);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (!fs::exists(f, ec))
        ZD_THROW_INPUT("{}: names {}, which does not exist", index.string(), f);
    return files;
  }
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(single, ec)) return {single.string()};
  ZD_THROW_INPUT("{}: a directory without model.safetensors or model.safetensors.index.json", path);
}

void import_hf_model(const std::string& path, const ParamLayout& layout,
                     const std::function<void(int unit, const float* unit_flat)>& consume) {
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  for (const std::string& f : hf_weight_files(path))
    readers.push_back(std::make_unique<SafetensorsReader>(f));
  const ModelSpec& spec = layout.spec();
  const bool gpt2 = !spec.llama_family();

  std::vector<std::string> problems;
  // A file we exported records its shape; n_head is the one thing shapes cannot tell.
  for (const auto& r : readers) {
    auto it = r->metadata().find(kHfZerodMetadataKey);
    if (it == r->metadata().end()) continue;
    nlohmann::json j = config::json_depth_problem(it->second).empty()
                           ? nlohmann::json::parse(it->second, nullptr, false)
                           : nlohmann::json(nlohmann::json::value_t::discarded);
    if (j.is_discarded() || !j.is_object())
      ZD_THROW_INPUT("{}: metadata '{}' is not a JSON object", r->path(), kHfZerodMetadataKey);
    if (j.contains("n_head") &&
        (!j["n_head"].is_number_integer() || j["n_head"].get<int64_t>() != spec.n_head))
      problems.push_back(
          fmt::format("the file was exported with n_head {}, the model has n_head {}",
                      j["n_head"].dump(), spec.n_head));
  }

  // File tensors by HF name (GPT-2: without the "transformer." prefix), and their reader.
  std::map<std::string, const StTensor*> file;
  std::map<const StTensor*, const SafetensorsReader*> reader_of;
  for (const auto& r : readers) {
    for (const StTensor& t : r->tensors()) {
      std::string name = t.name;
      if (gpt2 && name.rfind(kPrefix, 0) == 0) name = name.substr(std::strlen(kPrefix));
      if (gpt2 ? ignored_name(name) : ignored_llama_name(name, spec)) continue;
      reader_of[&t] = r.get();
      if (!file.emplace(name, &t).second)
        problems.push_back(
            gpt2 ? fmt::format("tensor {} appears twice (with and without '{}')", name, kPrefix)
                 : fmt::format("tensor {} appears twice", name));
    }
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
      const bool is_wpe = gpt2 && t.name == "wpe.weight";
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
  if (!problems.empty()) {
    if (gpt2) {
      ZD_THROW_INPUT(
          "{}: not a GPT-2 model with n_layer {}, n_head {}, n_embd {}, vocab_size {}, seq_len {}"
          "{}:\n  {}",
          path, spec.n_layer, spec.n_head, spec.n_embd, spec.vocab_size, spec.seq_len,
          describe_file(file), fmt::join(problems, "\n  "));
    }
    ZD_THROW_INPUT(
        "{}: not a {} model with num_hidden_layers {}, hidden_size {}, num_attention_heads {}, "
        "num_key_value_heads {}, head_dim {}, intermediate_size {}, vocab_size {}{}:\n  {}",
        path, model_arch_name(spec.arch), spec.n_layer, spec.n_embd, spec.n_head, spec.kv_heads(),
        spec.head_size(), spec.ffn(), spec.vocab_size,
        spec.tied() ? " (tied embeddings)" : " (untied: lm_head.weight)",
        fmt::join(problems, "\n  "));
  }
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
      const SafetensorsReader& r = *reader_of.at(&f);
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

nlohmann::ordered_json hf_config_json(const ModelSpec& s, DType dtype) {
  const char* torch_dtype = dtype == DType::kBF16 ? "bfloat16" : "float32";
  if (!s.llama_family()) {
    nlohmann::ordered_json j = {{"architectures", {"GPT2LMHeadModel"}},
                                {"model_type", "gpt2"},
                                {"n_layer", s.n_layer},
                                {"n_head", s.n_head},
                                {"n_embd", s.n_embd},
                                {"vocab_size", s.vocab_size},
                                {"n_positions", s.seq_len},
                                {"n_ctx", s.seq_len},
                                {"n_inner", nullptr},
                                {"activation_function", "gelu_new"},
                                {"layer_norm_epsilon", 1e-5},
                                {"initializer_range", s.init_std},
                                {"resid_pdrop", 0.0},
                                {"embd_pdrop", 0.0},
                                {"attn_pdrop", 0.0},
                                {"scale_attn_weights", true},
                                {"tie_word_embeddings", true},
                                {"torch_dtype", torch_dtype}};
    if (s.vocab_size == 50257) {  // the GPT-2 tokenizer's <|endoftext|>
      j["bos_token_id"] = 50256;
      j["eos_token_id"] = 50256;
    }
    return j;
  }
  ZD_CHECK_INPUT(!s.moe.enabled() || s.arch == ModelArch::kMixtral,
                 "a {} model with a moe section has no Hugging Face architecture to export to "
                 "(only type \"mixtral\" exports, as MixtralForCausalLM)",
                 model_arch_name(s.arch));
  const char* arch = s.arch == ModelArch::kMistral   ? "MistralForCausalLM"
                     : s.arch == ModelArch::kQwen2   ? "Qwen2ForCausalLM"
                     : s.arch == ModelArch::kMixtral ? "MixtralForCausalLM"
                                                     : "LlamaForCausalLM";
  nlohmann::ordered_json j = {{"architectures", {arch}},
                              {"model_type", model_arch_name(s.arch)},
                              {"hidden_size", s.n_embd},
                              {"intermediate_size", s.ffn()},
                              {"num_hidden_layers", s.n_layer},
                              {"num_attention_heads", s.n_head},
                              {"num_key_value_heads", s.kv_heads()}};
  if (s.head_size() * s.n_head != s.n_embd) j["head_dim"] = s.head_size();
  j["vocab_size"] = s.vocab_size;
  j["hidden_act"] = "silu";
  const RopeScaling& r = s.rope_scaling;
  j["max_position_embeddings"] =
      r.max_position_embeddings > 0 ? r.max_position_embeddings : s.seq_len;
  j["rms_norm_eps"] = s.rms_norm_eps;
  j["rope_theta"] = s.rope_theta;
  j["rope_scaling"] = rope_scaling_json(r);
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["initializer_range"] = s.init_std;
  j["attention_dropout"] = 0.0;
  if (s.arch == ModelArch::kLlama) {
    j["attention_bias"] = s.qkv_bias;
    j["mlp_bias"] = s.mlp_bias;
  }
  if (s.arch == ModelArch::kMistral || s.arch == ModelArch::kQwen2) {
    j["sliding_window"] = s.sliding_window > 0 ? nlohmann::ordered_json(s.sliding_window)
                                               : nlohmann::ordered_json(nullptr);
  }
  if (s.arch == ModelArch::kQwen2) {
    // transformers 4.57's spelling (layer_types) and the older one (max_window_layers: the
    // first windowed layer, exact where the windowed layers are the last ones).
    j["use_sliding_window"] = s.sliding_window > 0;
    if (s.sliding_window > 0) {
      int first = s.n_layer;
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (int l = 0; l < s.n_layer; ++l) {
        const bool windowed = s.window_of(l) > 0;
        if (windowed) first = std::min(first, l);
        types.push_back(windowed ? "sliding_attention" : "full_attention");
      }
      j["max_window_layers"] = first;
      j["layer_types"] = types;
    }
  }
  if (s.arch == ModelArch::kMixtral) {
    j["sliding_window"] = nullptr;
    j["num_local_experts"] = s.moe.num_experts;
    j["num_experts_per_tok"] = s.moe.top_k;
    j["router_aux_loss_coef"] = s.moe.aux_loss_coef;
    j["output_router_logits"] = s.moe.aux_loss_coef > 0;
    j["router_jitter_noise"] = 0.0;
  }
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j;
}

namespace {

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) ZD_THROW_INPUT("{}: write failed: {}", path.string(), std::strerror(errno));
}

void fsync_path(const std::filesystem::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) ZD_THROW("{}: cannot open to fsync: {}", path.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ZD_THROW("{}: fsync failed: {}", path.string(), std::strerror(err));
}

// One tensor of the directory: where its data comes from and which shard holds it.
struct DirTensor {
  int unit;
  const TensorInfo* info;
  std::string name;  // in the file
  std::vector<int64_t> shape;
  int64_t bytes;
  int shard = 0;
};

}  // namespace

HfDirectoryReport export_hf_directory(const ParamLayout& layout,
                                      const std::function<void(int unit, float* out)>& read_unit,
                                      const std::string& dir, DType dtype, int64_t max_shard_bytes,
                                      bool overwrite, const std::vector<std::string>& extra_files) {
  namespace fs = std::filesystem;
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    ZD_THROW_INPUT("{}: Hugging Face export supports fp32 and bf16, not {}", dir,
                   dtype_name(dtype));
  ZD_CHECK_INPUT(max_shard_bytes > 0, "--max-shard-size must be positive, got {}", max_shard_bytes);
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  if (exists && !overwrite)
    ZD_THROW_INPUT("{}: the output exists (pass --force to replace it)", dir);
  if (exists && !fs::is_directory(dir, ec))
    ZD_THROW_INPUT("{}: exists and is not a directory", dir);
  const ModelSpec& spec = layout.spec();
  const bool gpt2 = !spec.llama_family();
  const int64_t esz = dtype == DType::kBF16 ? 2 : 4;

  // Plan: every tensor in unit order (GPT-2: then the tied head), split into shards.
  std::vector<DirTensor> tensors;
  for (int u = 0; u < layout.num_units(); ++u)
    for (const TensorInfo& t : layout.unit(u).tensors) {
      DirTensor d{u, &t, gpt2 ? std::string(kPrefix) + t.name : t.name, hf_shape(t), 0};
      tensors.push_back(std::move(d));
    }
  if (gpt2) {
    const TensorInfo& wte = layout.unit(layout.embedding_unit()).tensor("wte.weight");
    tensors.push_back({layout.embedding_unit(), &wte, "lm_head.weight", hf_shape(wte), 0});
  }
  int shards = 0;
  int64_t in_shard = 0, total = 0;
  for (DirTensor& t : tensors) {
    t.bytes = esz;
    for (int64_t d : t.shape) t.bytes *= d;
    if (shards == 0 || (in_shard > 0 && in_shard + t.bytes > max_shard_bytes)) {
      ++shards;
      in_shard = 0;
    }
    t.shard = shards - 1;
    in_shard += t.bytes;
    total += t.bytes;
  }
  auto file_name = [&](int k) {
    return shards == 1 ? std::string("model.safetensors")
                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards);
  };

  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp";
  fs::remove_all(tmp, ec);
  HfDirectoryReport report;
  try {
    fs::create_directories(tmp);
    const StMetadata metadata = {{"format", "pt"}, {kHfZerodMetadataKey, spec_json(spec)}};
    int64_t max_unit = 0;
    for (int u = 0; u < layout.num_units(); ++u)
      max_unit = std::max(max_unit, layout.unit(u).numel);
    std::vector<float> unit(static_cast<size_t>(max_unit));
    std::vector<float> fscratch;
    std::vector<uint16_t> hscratch(dtype == DType::kBF16 ? kChunkElems : 0);
    std::unique_ptr<SafetensorsWriter> w;
    int open_shard = -1, loaded_unit = -1;
    auto close_shard = [&]() {
      if (!w) return;
      w->finish();
      report.bytes += static_cast<int64_t>(w->total_bytes());
      w.reset();
    };
    for (size_t i = 0; i < tensors.size(); ++i) {
      const DirTensor& t = tensors[i];
      if (t.shard != open_shard) {
        close_shard();
        std::vector<SafetensorsWriter::Entry> entries;
        for (const DirTensor& o : tensors)
          if (o.shard == t.shard) entries.push_back({o.name, to_st_dtype(dtype), o.shape});
        report.files.push_back(file_name(t.shard));
        w = std::make_unique<SafetensorsWriter>((tmp / report.files.back()).string(), entries,
                                                metadata);
        open_shard = t.shard;
      }
      if (t.unit != loaded_unit) {
        read_unit(t.unit, unit.data());
        loaded_unit = t.unit;
      }
      write_tensor(*w, *t.info, t.name, unit.data() + t.info->offset, dtype, fscratch, hscratch);
    }
    close_shard();
    if (shards > 1) {
      nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}};
      nlohmann::ordered_json map = nlohmann::ordered_json::object();
      for (const DirTensor& t : tensors) map[t.name] = file_name(t.shard);
      index["weight_map"] = map;
      write_text_file(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
    }
    write_text_file(tmp / "config.json", hf_config_json(spec, dtype).dump(2) + "\n");
    nlohmann::ordered_json gen = {{"_from_model_config", true}};
    const nlohmann::ordered_json cfg = hf_config_json(spec, dtype);
    for (const char* k : {"bos_token_id", "eos_token_id"})
      if (cfg.contains(k)) gen[k] = cfg[k];
    write_text_file(tmp / "generation_config.json", gen.dump(2) + "\n");
    for (const auto& f : {std::string("config.json"), std::string("generation_config.json")})
      fsync_path(tmp / f, false);
    if (shards > 1) fsync_path(tmp / "model.safetensors.index.json", false);
    for (const std::string& f : extra_files) {
      const fs::path to = tmp / fs::path(f).filename();
      fs::copy_file(f, to, fs::copy_options::overwrite_existing);
      fsync_path(to, false);
    }
    fsync_path(tmp, true);
    // Replace: the old directory moves aside first, so a failure leaves one of the two whole.
    const fs::path old = final_dir.string() + ".old";
    if (exists) {
      fs::remove_all(old, ec);
      fs::rename(final_dir, old);
    }
    fs::rename(tmp, final_dir);
    fsync_directory_of(final_dir.string());
    if (exists) fs::remove_all(old, ec);
    return report;
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    ZD_THROW_INPUT("{}: {}", dir, e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace zerod
