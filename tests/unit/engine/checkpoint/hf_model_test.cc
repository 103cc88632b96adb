#include "engine/checkpoint/hf_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "tests/unit/engine/checkpoint/raw_safetensors.h"

namespace zerod {
namespace {

using testing::le_bytes;
using testing::safetensors_bytes;
using testing::write_file;

ModelSpec tiny_spec() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.vocab_size = 50;  // padded to 128
  s.seq_len = 6;
  return s;
}

using Units = std::vector<std::vector<float>>;

// Every real element a distinct random value; padding rows and alignment gaps 0.
Units random_units(const ParamLayout& layout, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Units units;
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> flat(static_cast<size_t>(layout.unit(u).numel), 0.0f);
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t real = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      for (int64_t i = 0; i < real; ++i) flat[t.offset + i] = normal(gen);
    }
    units.push_back(std::move(flat));
  }
  return units;
}

FileChecksum export_units(const ParamLayout& layout, const Units& units, const std::string& path,
                          DType dtype) {
  return export_hf_safetensors(
      layout, [&](int u, float* out) { std::copy(units[u].begin(), units[u].end(), out); }, path,
      dtype);
}

Units import_units(const std::string& path, const ParamLayout& layout) {
  Units got;
  import_hf_model(path, layout, [&](int u, const float* flat) {
    EXPECT_EQ(u, static_cast<int>(got.size())) << "units out of order";
    got.emplace_back(flat, flat + layout.unit(u).numel);
  });
  return got;
}

template <class F>
std::string input_error_message(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

class HfGpt2 : public testing::TempDirTest {
 protected:
  ParamLayout layout_{tiny_spec(), 16};
  Units units_ = random_units(layout_, 7);
};

TEST_F(HfGpt2, Fp32ExportThenImportIsBitwiseIdentical) {
  const std::string file = path("model.safetensors");
  int calls = 0;
  export_hf_safetensors(
      layout_,
      [&](int u, float* out) {
        EXPECT_EQ(u, calls++) << "read_unit called out of order or twice";
        std::copy(units_[u].begin(), units_[u].end(), out);
      },
      file, DType::kF32);
  EXPECT_EQ(calls, layout_.num_units());
  const Units got = import_units(file, layout_);
  ASSERT_EQ(got.size(), units_.size());
  for (size_t u = 0; u < got.size(); ++u)
    EXPECT_EQ(std::memcmp(got[u].data(), units_[u].data(), got[u].size() * 4), 0) << "unit " << u;
}

TEST_F(HfGpt2, Bf16ExportThenImportGivesTheRoundedWeights) {
  const std::string file = path("model.safetensors");
  export_units(layout_, units_, file, DType::kBF16);
  const Units got = import_units(file, layout_);
  ASSERT_EQ(got.size(), units_.size());
  for (size_t u = 0; u < got.size(); ++u)
    for (size_t i = 0; i < got[u].size(); ++i)
      ASSERT_EQ(got[u][i], round_bf16(units_[u][i])) << "unit " << u << " element " << i;
}

TEST_F(HfGpt2, ExportedFileHasHuggingFaceNamesShapesAndOrientation) {
  const std::string file = path("model.safetensors");
  const FileChecksum sum = export_units(layout_, units_, file, DType::kF32);
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
  EXPECT_EQ(sum.bytes, std::filesystem::file_size(file));
  EXPECT_EQ(sum.crc32c, file_crc32c(file).crc32c);

  SafetensorsReader r(file);
  // Names and shapes as openai-community/gpt2's model.safetensors has them (C = 8, V = 50, T = 6).
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"wte.weight", {50, 8}},
                                                                    {"wpe.weight", {6, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    want.push_back({p + "ln_1.weight", {8}});
    want.push_back({p + "ln_1.bias", {8}});
    want.push_back({p + "attn.c_attn.weight", {8, 24}});
    want.push_back({p + "attn.c_attn.bias", {24}});
    want.push_back({p + "attn.c_proj.weight", {8, 8}});
    want.push_back({p + "attn.c_proj.bias", {8}});
    want.push_back({p + "ln_2.weight", {8}});
    want.push_back({p + "ln_2.bias", {8}});
    want.push_back({p + "mlp.c_fc.weight", {8, 32}});
    want.push_back({p + "mlp.c_fc.bias", {32}});
    want.push_back({p + "mlp.c_proj.weight", {32, 8}});
    want.push_back({p + "mlp.c_proj.bias", {8}});
  }
  want.push_back({"ln_f.weight", {8}});
  want.push_back({"ln_f.bias", {8}});
  ASSERT_EQ(r.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.tensors()[i].name, want[i].first);
    EXPECT_EQ(r.tensors()[i].shape, want[i].second) << want[i].first;
    EXPECT_EQ(r.tensors()[i].dtype, StDType::kF32) << want[i].first;
  }
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const auto meta = nlohmann::json::parse(r.metadata().at("zerod"));
  EXPECT_EQ(meta["n_layer"], 2);
  EXPECT_EQ(meta["n_head"], 2);
  EXPECT_EQ(meta["n_embd"], 8);
  EXPECT_EQ(meta["vocab_size"], 50);
  EXPECT_EQ(meta["seq_len"], 6);

  // Conv1D weights are ours transposed: HF c_attn.weight[i][j] == our qkv_w[j][i].
  const std::vector<float>& h1 = units_[layout_.block_unit(1)];
  const auto& bo = layout_.block();
  std::vector<float> hf(8 * 24);
  r.read("h.1.attn.c_attn.weight", 0, 8 * 24, hf.data());
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 24; ++j)
      ASSERT_EQ(hf[i * 24 + j], h1[bo.qkv_w + j * 8 + i]) << i << "," << j;
  // mlp.c_proj: ours (C, 4C) = (8, 32), HF (32, 8).
  std::vector<float> proj(32 * 8);
  r.read("h.1.mlp.c_proj.weight", 0, 32 * 8, proj.data());
  EXPECT_EQ(proj[5 * 8 + 3], h1[bo.fcproj_w + 3 * 32 + 5]);
  EXPECT_EQ(proj[31 * 8 + 7], h1[bo.fcproj_w + 7 * 32 + 31]);
  // Biases and LayerNorm weights are copied as they are.
  float b[24];
  r.read("h.1.attn.c_attn.bias", 0, 24, b);
  EXPECT_EQ(b[17], h1[bo.qkv_b + 17]);
  // wte: the last real vocabulary row; wpe: the last position.
  float row[8];
  r.read("wte.weight", 49 * 8, 8, row);
  EXPECT_EQ(row[5], units_[0][49 * 8 + 5]);
  r.read("wpe.weight", 5 * 8, 8, row);
  EXPECT_EQ(row[2], units_[0][layout_.wpe_offset() + 5 * 8 + 2]);
}

TEST_F(HfGpt2, Bf16ExportStoresRoundedBits) {
  const std::string file = path("model.safetensors");
  export_units(layout_, units_, file, DType::kBF16);
  SafetensorsReader r(file);
  for (const StTensor& t : r.tensors()) EXPECT_EQ(t.dtype, StDType::kBF16) << t.name;
  const auto& bo = layout_.block();
  std::vector<uint16_t> hf(8 * 24);
  r.read("h.0.attn.c_attn.weight", 0, 8 * 24, hf.data());
  const std::vector<float>& h0 = units_[layout_.block_unit(0)];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 24; ++j)
      ASSERT_EQ(hf[i * 24 + j], f32_to_bf16_bits(h0[bo.qkv_w + j * 8 + i]));
}

TEST_F(HfGpt2, ExportRefusesFp16AndCleansUpAfterAFailure) {
  EXPECT_THROW(export_units(layout_, units_, path("m.safetensors"), DType::kF16), InputError);
  const std::string file = path("model.safetensors");
  write_file(file, "an older export");
  EXPECT_THROW(export_hf_safetensors(
                   layout_,
                   [&](int u, float* out) {
                     if (u == 2) throw std::runtime_error("rank died");
                     std::copy(units_[u].begin(), units_[u].end(), out);
                   },
                   file, DType::kF32),
               std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
  EXPECT_EQ(testing::read_file(file), "an older export");  // untouched
}

// ---------------------------------------------------------------------------------------------
// Files assembled by hand, the way another tool would write them.

struct HfTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I32"
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string encode(const std::vector<float>& v, const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return le_bytes(v);
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    h[i] = dtype == "BF16" ? f32_to_bf16_bits(v[i]) : f32_to_f16_bits(v[i]);
  return le_bytes(h);
}

// The model of `units` in HF orientation, dtypes cycling F32, BF16, F16; wpe with `wpe_rows`
// rows (extra rows random).
std::vector<HfTensor> hf_tensors(const ParamLayout& layout, const Units& units, int wpe_rows) {
  static const char* kDTypes[] = {"F32", "BF16", "F16"};
  std::vector<HfTensor> out;
  int k = 0;
  for (int u = 0; u < layout.num_units(); ++u)
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const float* src = units[u].data() + t.offset;
      std::vector<float> v;
      std::vector<int64_t> shape;
      if (t.hf_transposed) {
        const int64_t o = t.shape[0], in = t.shape[1];
        shape = {in, o};
        for (int64_t i = 0; i < in; ++i)
          for (int64_t j = 0; j < o; ++j) v.push_back(src[j * in + i]);
      } else if (t.name == "wpe.weight") {
        shape = {wpe_rows, t.shape[1]};
        v.assign(src, src + t.numel);
        for (int64_t i = t.numel; i < wpe_rows * t.shape[1]; ++i) v.push_back(100.0f + i);
        v.resize(wpe_rows * t.shape[1]);
      } else {
        shape = t.shape;
        if (t.real_rows >= 0) shape[0] = t.real_rows;
        v.assign(src, src + shape[0] * (shape.size() > 1 ? shape[1] : 1));
      }
      const std::string dt = kDTypes[k++ % 3];
      out.push_back({t.name, dt, shape, encode(v, dt)});
    }
  return out;
}

// Header built with nlohmann (keys in reverse order of the data), data concatenated.
std::string hf_file(const std::vector<HfTensor>& tensors, const std::string& prefix,
                    const nlohmann::json& metadata = nullptr) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  std::string data;
  std::vector<std::pair<std::string, nlohmann::ordered_json>> entries;
  for (const HfTensor& t : tensors) {
    entries.push_back({prefix + t.name,
                       {{"dtype", t.dtype},
                        {"shape", t.shape},
                        {"data_offsets", {data.size(), data.size() + t.bytes.size()}}}});
    data += t.bytes;
  }
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) h[it->first] = it->second;
  return safetensors_bytes(h.dump(), data);
}

std::vector<HfTensor>::iterator find_tensor(std::vector<HfTensor>& v, const std::string& name) {
  return std::find_if(v.begin(), v.end(), [&](const HfTensor& t) { return t.name == name; });
}

// The import of hf_tensors(layout, units, ...) must give the originals, rounded as stored.
void expect_imported(const ParamLayout& layout, const Units& units, const Units& got) {
  ASSERT_EQ(got.size(), units.size());
  int k = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    ASSERT_EQ(got[u].size(), units[u].size());
    for (const TensorInfo& ti : layout.unit(u).tensors) {
      const int dt = k++ % 3;  // F32, BF16, F16 as hf_tensors assigned them
      for (int64_t i = 0; i < ti.numel; ++i) {
        const float orig = units[u][ti.offset + i];  // 0 in padded vocabulary rows
        const float want = dt == 0 ? orig : dt == 1 ? round_bf16(orig) : round_f16(orig);
        ASSERT_EQ(got[u][ti.offset + i], want) << ti.name << " element " << i;
      }
    }
    // Alignment gaps between tensors are zero.
    std::vector<bool> covered(got[u].size(), false);
    for (const TensorInfo& ti : layout.unit(u).tensors)
      std::fill(covered.begin() + ti.offset, covered.begin() + ti.offset + ti.numel, true);
    for (size_t i = 0; i < covered.size(); ++i)
      if (!covered[i]) {
        ASSERT_EQ(got[u][i], 0.0f) << "gap element " << i << " of unit " << u;
      }
  }
}

TEST_F(HfGpt2, ImportsAHandWrittenTransformersFile) {
  // "transformer." prefix, mixed dtypes, a longer wpe (9 rows of which the first 6 are used),
  // the attention buffers and the tied head, which are ignored.
  std::vector<HfTensor> t = hf_tensors(layout_, units_, 9);
  for (auto& x : t) x.name = "transformer." + x.name;
  t.push_back({"transformer.h.0.attn.bias",
               "F32",
               {1, 1, 6, 6},
               encode(std::vector<float>(36, 1.0f), "F32")});
  t.push_back({"transformer.h.1.attn.masked_bias", "F32", {}, encode({-1e4f}, "F32")});
  t.push_back({"lm_head.weight", "F32", {50, 8}, std::string(50 * 8 * 4, '\0')});
  const std::string file = path("hf.safetensors");
  write_file(file, hf_file(t, "", {{"format", "pt"}}));
  expect_imported(layout_, units_, import_units(file, layout_));
}

TEST_F(HfGpt2, ImportsAFileWithoutThePrefix) {
  const std::string file = path("hub.safetensors");
  write_file(file, hf_file(hf_tensors(layout_, units_, 6), ""));
  expect_imported(layout_, units_, import_units(file, layout_));
}

struct BadModel {
  const char* what;
  std::function<void(std::vector<HfTensor>&)> change;
  std::vector<std::string> expect;
  nlohmann::json metadata = nullptr;
};

TEST_F(HfGpt2, EveryMismatchGivesAClearError) {
  const std::vector<BadModel> cases = {
      {"missing tensor",
       [](auto& t) { t.erase(find_tensor(t, "h.1.ln_2.bias")); },
       {"missing tensors: h.1.ln_2.bias"}},
      {"not transposed",
       [](auto& t) {
         find_tensor(t, "h.0.attn.c_attn.weight")->shape = {24, 8};
       },
       {"tensor h.0.attn.c_attn.weight has shape [24, 8], expected [8, 24]"}},
      {"extra tensor",
       [](auto& t) {
         t.push_back({"h.2.ln_1.weight", "F32", {8}, std::string(32, '\0')});
       },
       {"unknown tensors: h.2.ln_1.weight"}},
      {"vocabulary rows",
       [](auto& t) {
         auto it = find_tensor(t, "wte.weight");
         it->shape = {51, 8};
         it->bytes += std::string(8 * (it->dtype == "F32" ? 4 : 2), '\0');
       },
       {"tensor wte.weight has shape [51, 8], expected [50, 8]"}},
      {"too few positions",
       [](auto& t) {
         auto it = find_tensor(t, "wpe.weight");
         it->shape = {5, 8};
         it->bytes.resize(it->bytes.size() / 6 * 5);
       },
       {"tensor wpe.weight has shape [5, 8], expected [6, 8] (or more rows)"}},
      {"integer dtype",
       [](auto& t) {
         auto it = find_tensor(t, "ln_f.bias");
         it->dtype = "I32";
         it->bytes = std::string(8 * 4, '\0');
       },
       {"tensor ln_f.bias has dtype I32"}},
      {"several problems at once",
       [](auto& t) {
         t.erase(find_tensor(t, "ln_f.weight"));
         t.push_back({"score.weight", "F32", {2, 8}, std::string(64, '\0')});
       },
       {"missing tensors: ln_f.weight", "unknown tensors: score.weight"}},
      {"zerod metadata with another n_head",
       [](auto&) {},
       {"exported with n_head 4, the model has n_head 2"},
       {{"format", "pt"}, {"zerod", R"({"n_layer":2,"n_head":4})"}}},
  };
  for (const BadModel& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<HfTensor> t = hf_tensors(layout_, units_, 6);
    c.change(t);
    const std::string file = path("bad.safetensors");
    write_file(file, hf_file(t, "", c.metadata));
    const std::string msg = input_error_message([&] { import_units(file, layout_); });
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    for (const auto& e : c.expect) EXPECT_NE(msg.find(e), std::string::npos) << msg;
  }
  // Both spellings of one tensor.
  std::vector<HfTensor> t = hf_tensors(layout_, units_, 6);
  std::vector<HfTensor> twice = t;
  twice.push_back(*find_tensor(t, "ln_f.bias"));
  twice.back().name = "transformer.ln_f.bias";
  write_file(path("twice.safetensors"), hf_file(twice, ""));
  EXPECT_NE(input_error_message([&] {
              import_units(path("twice.safetensors"), layout_);
            }).find("tensor ln_f.bias appears twice"),
            std::string::npos);
  // A truncated export is caught by the file validation.
  const std::string file = path("model.safetensors");
  export_units(layout_, units_, file, DType::kF32);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  EXPECT_NE(input_error_message([&] { import_units(file, layout_); }).find("truncated"),
            std::string::npos);
}

ModelSpec tiny_llama(ModelArch arch, bool tied) {
  ModelSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.n_embd = 16;
  s.intermediate_size = 24;
  s.vocab_size = 50;
  s.seq_len = 8;
  s.tie_word_embeddings = tied;
  s.qkv_bias = arch == ModelArch::kQwen2;
  return s;
}

class HfDirectory : public testing::TempDirTest,
                    public ::testing::WithParamInterface<std::tuple<ModelSpec, int64_t>> {};

// A directory per architecture, in one file and sharded: every weight comes back bit for bit,
// config.json describes the model, the index names every tensor once.
TEST_P(HfDirectory, ExportThenImportIsBitwiseIdenticalWithAConfigAndAnIndex) {
  const auto& [spec, max_shard] = GetParam();
  const ParamLayout layout(spec, 16);
  const Units units = random_units(layout, 11);
  const std::string dir = path("hf");
  const HfDirectoryReport r = export_hf_directory(
      layout, [&](int u, float* out) { std::copy(units[u].begin(), units[u].end(), out); }, dir,
      DType::kF32, max_shard, false);
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  const Units got = import_units(dir, layout);
  ASSERT_EQ(got.size(), units.size());
  for (size_t u = 0; u < got.size(); ++u)
    EXPECT_EQ(std::memcmp(got[u].data(), units[u].data(), got[u].size() * 4), 0) << "unit " << u;

  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  EXPECT_EQ(cfg["model_type"], model_arch_name(spec.arch));
  EXPECT_TRUE(std::filesystem::exists(dir + "/generation_config.json"));
  if (max_shard < 4096) {
    ASSERT_GT(r.files.size(), 2u);
    EXPECT_EQ(r.files[0], fmt::format("model-00001-of-{:05d}.safetensors", r.files.size()));
    const nlohmann::json index =
        nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) files.insert(file);
    EXPECT_EQ(files.size(), r.files.size());
    int64_t sum = 0;
    for (const auto& f : r.files) {
      const SafetensorsReader reader(dir + "/" + f);
      for (const StTensor& t : reader.tensors()) {
        EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
        sum += static_cast<int64_t>(t.bytes());
      }
    }
    EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), sum);
  } else {
    EXPECT_EQ(r.files, std::vector<std::string>{"model.safetensors"});
    EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  }
  if (!spec.llama_family()) {  // GPT2LMHeadModel's state_dict names, the tied head included
    const SafetensorsReader reader(dir + "/" + r.files.back());
    EXPECT_NE(reader.find("lm_head.weight"), nullptr);
    EXPECT_EQ(cfg["n_positions"], spec.seq_len);
  } else {
    EXPECT_EQ(cfg["num_key_value_heads"], spec.kv_heads());
    EXPECT_EQ(cfg["tie_word_embeddings"], spec.tie_word_embeddings);
  }
  // Existing output: refused without overwrite, replaced with it.
  auto again = [&](bool overwrite) {
    export_hf_directory(
        layout, [&](int u, float* out) { std::copy(units[u].begin(), units[u].end(), out); }, dir,
        DType::kBF16, max_shard, overwrite);
  };
  EXPECT_NE(input_error_message([&] { again(false); }).find("pass --force"), std::string::npos);
  again(true);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir + "/config.json"))["torch_dtype"], "bfloat16");
}

INSTANTIATE_TEST_SUITE_P(
    Archs, HfDirectory,
    ::testing::Combine(::testing::Values(tiny_spec(), tiny_llama(ModelArch::kLlama, false),
                                         tiny_llama(ModelArch::kMistral, false),
                                         tiny_llama(ModelArch::kQwen2, true)),
                       ::testing::Values(int64_t{1000}, int64_t{1} << 30)));

// config.json's rope_scaling and max_position_embeddings, read back as a model section, give
// the spec they were written from (the export of a job's model keeps its frequencies).
TEST(HfConfig, EveryRopeScalingReadsBackAsTheSpecItCameFrom) {
  std::vector<RopeScaling> cases(6);
  cases[1].type = RopeScaling::Type::kLinear;
  cases[1].factor = 2.0;
  cases[2].type = RopeScaling::Type::kLlama3;
  cases[2].factor = 8.0;
  cases[2].original_max_position_embeddings = 8192;
  cases[3].type = RopeScaling::Type::kDynamic;
  cases[3].factor = 2.0;
  cases[3].max_position_embeddings = 4;
  cases[4].type = RopeScaling::Type::kYarn;
  cases[4].factor = 4.0;
  cases[4].max_position_embeddings = 32;
  cases[4].beta_fast = 16.0;
  cases[5] = cases[4];
  cases[5].attention_factor = 1.25;
  cases[5].original_max_position_embeddings = 16;
  cases[5].beta_slow = 2.0;
  for (const RopeScaling& r : cases) {
    SCOPED_TRACE(rope_scaling_name(r.type));
    ModelSpec spec = tiny_llama(ModelArch::kLlama, false);
    spec.rope_theta = 5000.0;
    spec.rope_scaling = r;
    nlohmann::json section = hf_config_json(spec, DType::kF32);
    section["type"] = "llama";
    section["seq_len"] = spec.seq_len;
    const ModelSpec back = model_spec(parse_model_config(section, "config.json"));
    EXPECT_EQ(back.rope_scaling, r) << section.dump();
    EXPECT_EQ(back.rope_theta, 5000.0);
    EXPECT_EQ(section["max_position_embeddings"],
              r.max_position_embeddings > 0 ? r.max_position_embeddings : spec.seq_len);
  }
}

// Qwen2's per-layer window goes into config.json in both spellings (layer_types, and
// max_window_layers for readers before transformers 4.53) and reads back layer for layer.
TEST(HfConfig, Qwen2PerLayerWindowReadsBackLayerForLayer) {
  for (const std::vector<uint8_t>& layers :
       {std::vector<uint8_t>{0, 1, 1}, std::vector<uint8_t>{1, 0, 1}, std::vector<uint8_t>{}}) {
    ModelSpec spec = tiny_llama(ModelArch::kQwen2, true);
    spec.n_layer = 3;
    spec.sliding_window = 5;
    spec.sliding_layers = layers;
    nlohmann::json section = hf_config_json(spec, DType::kF32);
    EXPECT_EQ(section["use_sliding_window"], true);
    EXPECT_EQ(section["layer_types"].size(), 3u);
    if (!layers.empty()) {
      EXPECT_EQ(section["max_window_layers"], layers[0] ? 0 : 1);
    }
    section["type"] = "qwen2";
    section["seq_len"] = spec.seq_len;
    const ModelSpec back = model_spec(parse_model_config(section, "config.json"));
    for (int l = 0; l < 3; ++l) EXPECT_EQ(back.window_of(l), spec.window_of(l)) << l;
  }
  ModelSpec none = tiny_llama(ModelArch::kQwen2, true);
  const nlohmann::json section = hf_config_json(none, DType::kF32);
  EXPECT_EQ(section["use_sliding_window"], false);
  EXPECT_TRUE(section["sliding_window"].is_null());
}

TEST_F(HfGpt2, LlamaImportListsEveryMismatch) {
  const ModelSpec spec = tiny_llama(ModelArch::kLlama, false);
  const ParamLayout layout(spec, 16);
  const Units units = random_units(layout, 3);
  const std::string dir = path("hf");
  export_hf_directory(
      layout, [&](int u, float* out) { std::copy(units[u].begin(), units[u].end(), out); }, dir,
      DType::kF32, int64_t{1} << 30, false);
  ModelSpec other = spec;
  other.n_kv_head = 4;  // k/v projections twice as tall
  other.tie_word_embeddings = true;
  const std::string msg = input_error_message([&] { import_units(dir, ParamLayout(other, 16)); });
  EXPECT_NE(msg.find("not a llama model with num_hidden_layers 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor model.layers.0.self_attn.k_proj.weight has shape [8, 16], expected "
                     "[16, 16]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("tensor model.layers.1.self_attn.v_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(input_error_message([&] {
              import_units(path("nothing"), layout);
            }).find("no such file or directory"),
            std::string::npos);
}

}  // namespace
}  // namespace zerod
