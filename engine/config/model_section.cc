// The "model" section. GPT-2 keeps zerod's keys; the Llama family (llama, mistral, qwen2, mixtral)
// reads Hugging Face config.json key names, so a config.json pasted into the section works. With
// init_from naming a Hugging Face directory, its config.json is read first (errors name the
// file) and the job's keys override it; a directory of weights without a config.json takes its
// shape from the job alone.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/config/config_error.h"
#include "engine/config/parse.h"
#include "engine/config/sections.h"

namespace zerod::config {

namespace {

const std::vector<std::string> kTypes = {"gpt2", "llama", "mistral", "qwen2", "mixtral"};

// config.json keys that do not change what is trained (tokenizer ids, bookkeeping, inference
// caches, dtype of the stored weights): accepted and ignored.
const std::vector<std::string> kIgnoredHfKeys = {
    "architectures",        "torch_dtype",    "dtype",        "transformers_version",
    "bos_token_id",         "eos_token_id",   "pad_token_id", "use_cache",
    "_name_or_path",        "pretraining_tp", "model_type",   "output_attentions",
    "output_hidden_states", "return_dict",    "is_decoder",   "tokenizer_class",
    "max_window_layers"};
const std::vector<std::string> kIgnoredGpt2HfKeys = {"architectures",
                                                     "torch_dtype",
                                                     "dtype",
                                                     "transformers_version",
                                                     "bos_token_id",
                                                     "eos_token_id",
                                                     "pad_token_id",
                                                     "use_cache",
                                                     "_name_or_path",
                                                     "model_type",
                                                     "n_ctx",
                                                     "summary_type",
                                                     "summary_use_proj",
                                                     "summary_activation",
                                                     "summary_proj_to_labels",
                                                     "summary_first_dropout",
                                                     "task_specific_params",
                                                     "reorder_and_upcast_attn",
                                                     "output_attentions",
                                                     "output_hidden_states",
                                                     "return_dict"};

bool in(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}

void ignore_keys(ObjectReader& r, const std::vector<std::string>& keys) {
  for (const auto& k : keys) r.find(k);
}

// The value of a key that must be a given constant (a feature zerod does not implement
// otherwise): `ok` says whether v is acceptable.
template <class Ok>
void expect(ObjectReader& r, const char* key, Ok ok, const char* allowed) {
  const Json* v = r.find(key);
  if (v == nullptr || ok(*v)) return;
  r.problems().error(r.path_of(key), fmt::format("{} is not supported (allowed: {})",
                                                 r.problems().quote(*v), allowed));
}

// rope_scaling (transformers 4) or rope_parameters (transformers 5, which also holds
// rope_theta): null or {"rope_type"|"type": "default"|"linear"|"llama3"|"dynamic"|"yarn",
// "factor", ...}.
void read_rope(ObjectReader& parent, const char* key, ModelConfig& m) {
  const Json* v = parent.find(key);
  if (v == nullptr || v->is_null()) return;
  const Json* obj = parent.read_object(key);
  if (obj == nullptr) return;
  ObjectReader r(*obj, parent.path_of(key), parent.problems());
  size_t idx = 0;
  const std::vector<std::string> types = {"default", "linear", "llama3", "dynamic", "yarn"};
  for (const char* type_key : {"rope_type", "type"}) {
    const Json* t = r.find(type_key);
    if (t == nullptr) continue;
    if (t->is_string() && !in(types, t->get<std::string>())) {
      r.problems().error(r.path_of(type_key),
                         fmt::format("{} is not supported (supported: default, linear, llama3, "
                                     "dynamic, yarn)",
                                     r.problems().quote(*t)));
      continue;
    }
    if (r.read_choice(type_key, idx, types, false)) m.rope_type = types[idx];
  }
  // transformers reads the optional yarn keys with `.get(key) or default`: null is the default.
  const auto read_opt_real = [&](const char* k, double& out, const RealRange& range) {
    const Json* x = r.find(k);
    if (x != nullptr && !x->is_null()) r.read_real(k, out, range);
  };
  r.read_real("rope_theta", m.rope_theta, real_above(0.0));
  r.read_real("factor", m.rope_factor, real_above(0.0));
  r.read_real("low_freq_factor", m.rope_low_freq_factor, real_above(0.0));
  r.read_real("high_freq_factor", m.rope_high_freq_factor, real_above(0.0));
  std::optional<int64_t> omax;
  if (r.read_opt_int("original_max_position_embeddings", omax, at_least(1))) {
    m.rope_original_max_position_embeddings = omax ? static_cast<int>(*omax) : 0;
  }
  read_opt_real("attention_factor", m.rope_attention_factor, real_above(0.0));
  read_opt_real("beta_fast", m.rope_beta_fast, real_above(0.0));
  read_opt_real("beta_slow", m.rope_beta_slow, real_above(0.0));
  // DeepSeek's yarn attention factor and gpt-oss's untruncated ramp.
  for (const char* k : {"mscale", "mscale_all_dim"}) {
    expect(
        r, k, [](const Json& x) { return x.is_null(); },
        "null; zerod's yarn takes its attention factor from attention_factor or factor");
  }
  expect(
      r, "truncate", [](const Json& x) { return x == true || x.is_null(); }, "true");
  r.finish();
}

// Qwen2's per-layer window: use_sliding_window, max_window_layers and (transformers >= 4.53
// writes it into every config.json) layer_types.
void read_qwen2_window(ObjectReader& r, ModelConfig& m) {
  r.read_bool("use_sliding_window", m.use_sliding_window);
  r.read_int("max_window_layers", m.max_window_layers, at_least(0));
  const Json* lt = r.find("layer_types");
  if (lt == nullptr) return;
  if (lt->is_null()) {
    m.layer_types.clear();
    return;
  }
  if (!lt->is_array()) {
    r.problems().error(r.path_of("layer_types"),
                       fmt::format("expected a list of \"full_attention\" or "
                                   "\"sliding_attention\", got {}",
                                   r.problems().quote(*lt)));
    return;
  }
  std::vector<std::string> types;
  for (size_t i = 0; i < lt->size(); ++i) {
    const Json& t = (*lt)[i];
    if (t != "full_attention" && t != "sliding_attention") {
      r.problems().error(fmt::format("{}[{}]", r.path_of("layer_types"), i),
                         fmt::format("{} is not supported (allowed: \"full_attention\", "
                                     "\"sliding_attention\")",
                                     r.problems().quote(t)));
      return;
    }
    types.push_back(t.get<std::string>());
  }
  m.layer_types = std::move(types);
}

void read_llama_keys(ObjectReader& r, ModelConfig& m, bool from_hf_file) {
  r.read_int("hidden_size", m.n_embd, at_least(1));
  r.read_int("intermediate_size", m.intermediate_size, at_least(1));
  r.read_int("num_hidden_layers", m.n_layer, at_least(1));
  r.read_int("num_attention_heads", m.n_head, at_least(1));
  std::optional<int64_t> kv;
  if (r.read_opt_int("num_key_value_heads", kv, at_least(1))) m.n_kv_head = kv ? int(*kv) : 0;
  std::optional<int64_t> hd;
  if (r.read_opt_int("head_dim", hd, at_least(1))) m.head_dim = hd ? int(*hd) : 0;
  r.read_int("vocab_size", m.vocab_size, int_between(1, int64_t{1} << 28));
  r.read_real("rms_norm_eps", m.rms_norm_eps, real_above(0.0));
  r.read_real("rope_theta", m.rope_theta, real_above(0.0));
  read_rope(r, "rope_scaling", m);
  read_rope(r, "rope_parameters", m);
  // Kept only where the rotary frequencies depend on it (read_model_object).
  std::optional<int64_t> max_pos;
  if (r.read_opt_int("max_position_embeddings", max_pos, at_least(1))) {
    m.max_position_embeddings = max_pos ? static_cast<int>(*max_pos) : 0;
  }
  r.read_bool("tie_word_embeddings", m.tie_word_embeddings);
  r.read_real("initializer_range", m.init_std, real_above(0.0));
  expect(
      r, "hidden_act", [](const Json& v) { return v == "silu"; }, "\"silu\"");
  expect(
      r, "attention_dropout", [](const Json& v) { return v.is_number() && v.get<double>() == 0.0; },
      "0.0");
  if (m.type == "llama") {
    r.read_bool("attention_bias", m.attention_bias);
    r.read_bool("mlp_bias", m.mlp_bias);
  }
  if (m.type == "mistral" || m.type == "qwen2") {
    std::optional<int64_t> w;
    if (r.read_opt_int("sliding_window", w, at_least(1))) m.sliding_window = w ? int(*w) : 0;
  }
  if (m.type == "mixtral") read_mixtral_keys(r, m);
  if (m.type == "qwen2") read_qwen2_window(r, m);
  ignore_keys(r, kIgnoredHfKeys);
  if (!from_hf_file) {
    r.read_int("seq_len", m.seq_len, at_least(1));
    r.read_opt_string("init_from", m.init_from);
    r.read_bool("activation_checkpointing", m.activation_checkpointing);
  }
}

void read_gpt2_keys(ObjectReader& r, ModelConfig& m, bool from_hf_file) {
  r.read_int("n_layer", m.n_layer, at_least(1));
  r.read_int("n_head", m.n_head, at_least(1));
  r.read_int("n_embd", m.n_embd, at_least(1));
  // GPT-2 vocabularies stay within what uint16 token shards hold (the Llama family reads
  // uint32 shards for larger ones).
  r.read_int("vocab_size", m.vocab_size, int_between(1, 65536));
  if (from_hf_file) {
    // GPT2Config: n_positions rows of wpe (the job's seq_len, unless it says otherwise).
    r.read_int("n_positions", m.seq_len, at_least(1));
    r.read_real("initializer_range", m.init_std, real_above(0.0));
    expect(
        r, "activation_function", [](const Json& v) { return v == "gelu_new"; }, "\"gelu_new\"");
    expect(
        r, "layer_norm_epsilon",
        [](const Json& v) { return v.is_number() && v.get<double>() == 1e-5; }, "1e-05");
    expect(
        r, "n_inner", [](const Json& v) { return v.is_null(); }, "null (4 n_embd)");
    expect(
        r, "scale_attn_weights", [](const Json& v) { return v == true; }, "true");
    expect(
        r, "scale_attn_by_inverse_layer_idx", [](const Json& v) { return v == false; }, "false");
    expect(
        r, "tie_word_embeddings", [](const Json& v) { return v == true; }, "true");
    expect(
        r, "add_cross_attention", [](const Json& v) { return v == false; }, "false");
    for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
      const Json* v = r.find(k);
      if (v != nullptr && !(v->is_number() && v->get<double>() == 0.0)) {
        r.problems().warn(r.path_of(k),
                          fmt::format("{}: zerod trains without dropout", r.problems().quote(*v)));
      }
    }
    ignore_keys(r, kIgnoredGpt2HfKeys);
    return;
  }
  r.read_int("seq_len", m.seq_len, at_least(1));
  r.read_opt_string("init_from", m.init_from);
  r.read_bool("activation_checkpointing", m.activation_checkpointing);
  r.read_real("init_std", m.init_std, real_above(0.0));
}

// Reads DIR/config.json as a JSON object; problems are reported under `path`. A directory with
// weights (model.safetensors, or model.safetensors.index.json) but no config.json has none: the
// job's model section gives the shape, as with a safetensors file.
std::optional<Json> read_hf_config(const std::string& dir, const std::string& path, Problems& p) {
  namespace fs = std::filesystem;
  const std::string file = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    if (!fs::exists(fs::path(dir) / "model.safetensors", ec) &&
        !fs::exists(fs::path(dir) / "model.safetensors.index.json", ec)) {
      p.error(path, fmt::format("{} is a directory without a config.json or weights "
                                "(model.safetensors, model.safetensors.index.json)",
                                dir));
    }
    return std::nullopt;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    p.error(path, fmt::format("{} cannot be read", file));
    return std::nullopt;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!json_depth_ok(buf.str(), file, p)) return std::nullopt;
  Json j = Json::parse(buf.str(), nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) {
    p.error(file, "not valid JSON");
    return std::nullopt;
  }
  if (!j.is_object()) {
    p.error(file, "expected a JSON object");
    return std::nullopt;
  }
  return j;
}

}  // namespace

void read_model_object(const Json& obj, const std::string& path, ModelConfig& m, Problems& p,
                       bool load_hf_config) {
  ObjectReader r(obj, path, p);
  // The directory's config.json, when init_from names a directory. Its values are quoted in
  // messages unless the daemon reads it (set_quote_file_values).
  std::optional<Json> hf;
  std::string hf_file;
  Problems hp;
  hp.quote_values = quote_file_values();
  if (load_hf_config) {
    const Json* from = obj.is_object() && obj.contains("init_from") ? &obj["init_from"] : nullptr;
    std::error_code ec;
    if (from != nullptr && from->is_string() &&
        std::filesystem::is_directory(from->get<std::string>(), ec)) {
      const std::string dir = from->get<std::string>();
      hf = read_hf_config(dir, join_path(path, "init_from"), p);
      hf_file = (std::filesystem::path(dir) / "config.json").string();
    }
  }
  // The type: the job's, else the directory's model_type, else gpt2.
  std::string hf_type;
  if (hf && hf->contains("model_type") && (*hf)["model_type"].is_string()) {
    hf_type = (*hf)["model_type"].get<std::string>();
  }
  size_t idx = 0;
  if (r.has("type")) {
    if (r.read_choice("type", idx, kTypes, /*case_insensitive=*/false)) m.type = kTypes[idx];
  } else if (!hf_type.empty()) {
    if (in(kTypes, hf_type)) {
      m.type = hf_type;
    } else {
      p.error(hf_file + ": model_type",
              fmt::format("{} is not a supported architecture (supported: gpt2, llama, "
                          "mistral, qwen2, mixtral)",
                          hp.quote((*hf)["model_type"])));
      return;
    }
  }
  if (hf && !hf_type.empty() && hf_type != m.type && in(kTypes, hf_type)) {
    p.error(join_path(path, "type"),
            fmt::format("\"{}\" but {} says model_type \"{}\"", m.type, hf_file, hf_type));
  }
  if (m.llama_family()) {
    // HF defaults where they differ from GPT-2's.
    m.tie_word_embeddings = false;
    m.init_std = 0.02;
    m.vocab_size = 32000;
    m.rms_norm_eps = 1e-6;
    if (m.type == "mistral" || m.type == "qwen2") m.sliding_window = 4096;
    if (m.type == "mixtral") set_mixtral_defaults(m);
  }
  if (hf) {
    ObjectReader hr(*hf, hf_file, hp);
    if (m.llama_family()) {
      read_llama_keys(hr, m, true);
    } else {
      read_gpt2_keys(hr, m, true);
    }
    hr.finish();
    p.errors.insert(p.errors.end(), hp.errors.begin(), hp.errors.end());
    p.warnings.insert(p.warnings.end(), hp.warnings.begin(), hp.warnings.end());
  }
  if (m.llama_family()) {
    read_llama_keys(r, m, false);
    for (const char* k :
         {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
      const bool given = (obj.is_object() && obj.contains(k)) || (hf && hf->contains(k));
      if (!given) {
        p.error(join_path(path, k), fmt::format("required for type \"{}\"", m.type));
      }
    }
    // max_position_embeddings sets the frequencies of rope dynamic and yarn only; elsewhere it
    // is bookkeeping (the positions are the job's seq_len) and is not kept.
    if (m.rope_type != "dynamic" && m.rope_type != "yarn") m.max_position_embeddings = 0;
    if (m.rope_type == "llama3" && m.rope_original_max_position_embeddings == 0) {
      m.rope_original_max_position_embeddings = 8192;
    }
  } else {
    read_gpt2_keys(r, m, false);
  }
  read_moe_section(r, m);
  r.finish();
}

void read_model(ObjectReader& top, JobConfig& cfg) {
  const Json* raw = top.find("model");
  if (raw == nullptr) return;
  if (raw->is_null()) {
    top.problems().error("model",
                         "null: give the model as an object (leave the key out for the default "
                         "GPT-2 124M)");
    return;
  }
  const Json* obj = top.read_object("model");
  if (obj == nullptr) return;
  read_model_object(*obj, "model", cfg.model, top.problems(), /*load_hf_config=*/true);
}

}  // namespace zerod::config

namespace zerod {

ModelConfig parse_model_config(const nlohmann::json& model, const std::string& source) {
  config::Problems p;
  JobConfig cfg;
  if (!model.is_object()) {
    p.error("model", "expected an object");
  } else {
    config::read_model_object(model, "model", cfg.model, p, /*load_hf_config=*/false);
  }
  config::validate_job(cfg, p);
  config::derive_values(cfg);
  if (!p.errors.empty()) throw ConfigError(std::move(p.errors), source);
  return cfg.model;
}

}  // namespace zerod
