#include "engine/checkpoint/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/config/input_limits.h"

namespace zerod {

using nlohmann::json;

json Manifest::to_json() const {
  json units_j = json::array();
  for (const auto& u : units) units_j.push_back({{"name", u.name}, {"numel", u.numel}});
  json files_j = json::array();
  for (const auto& f : files) {
    json slices = json::array();
    for (const auto& s : f.slices)
      slices.push_back({{"unit", s.unit}, {"begin", s.begin}, {"end", s.end}});
    files_j.push_back({{"name", f.name},
                       {"rank", f.rank},
                       {"bytes", f.bytes},
                       {"crc32c", fmt::format("{:08x}", f.crc32c)},
                       {"slices", slices}});
    if (tensor_parallel > 1) files_j.back()["tensor_rank"] = f.tensor_rank;
  }
  const TrainingProgress& p = progress;
  json out = {{"format", kCheckpointFormat},
              {"automatic", automatic},
              {"format_version", format_version},
              {"tag", tag},
              {"created", created},
              {"zerod_version", zerod_version},
              {"world_size", world_size},
              {"zero_stage", zero_stage},
              {"compute_dtype", compute_dtype},
              {"model",
               {{"n_layer", n_layer},
                {"n_head", n_head},
                {"n_embd", n_embd},
                {"vocab_size", vocab_size},
                {"padded_vocab_size", padded_vocab_size},
                {"seq_len", seq_len},
                {"units", units_j}}},
              {"progress",
               {{"global_step", p.global_step},
                {"skipped_steps", p.skipped_steps},
                {"adam_steps", p.adam_steps},
                {"samples_seen", p.samples_seen}}},
              {"data", {{"seed", p.data_seed}, {"num_samples", p.data_num_samples}}},
              {"rng", {{"init_seed", p.init_seed}, {"data_seed", p.data_seed}}},
              {"scheduler", {{"steps_taken", p.adam_steps}}},
              {"loss_scaler",
               {{"scale", p.loss_scale},
                {"hysteresis_left", p.loss_scale_hysteresis_left},
                {"iter", p.loss_scale_iter},
                {"last_overflow_iter", p.loss_scale_last_overflow_iter}}},
              {"files", files_j},
              {"job", job}};
  if (tensor_parallel > 1) out["tensor_parallel"] = tensor_parallel;
  if (!p.data_blend.empty()) out["data"]["blend"] = p.data_blend;
  if (tokenizer) {
    json tf = json::array();
    for (const SideFile& f : tokenizer->files) {
      tf.push_back(
          {{"name", f.name}, {"bytes", f.bytes}, {"crc32c", fmt::format("{:08x}", f.crc32c)}});
    }
    out["tokenizer"] = {{"source", tokenizer->source}, {"kind", tokenizer->kind}, {"files", tf}};
  }
  if (p.csv_run >= 0 || p.tensorboard_run >= 0) {
    out["monitors"] = {{"csv_run", p.csv_run}, {"tensorboard_run", p.tensorboard_run}};
  }
  return out;
}

namespace {
template <class T>
T field(const json& j, const char* key, const std::string& where, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end()) ZD_THROW_INPUT("{}: {}{} is missing", where, path, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    ZD_THROW_INPUT("{}: {}{} has the wrong type ({})", where, path, key,
                   config::clip_input(it->dump()));
  }
}
}  // namespace

Manifest Manifest::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) ZD_THROW_INPUT("{}: not a JSON object", where);
  const std::string format = field<std::string>(j, "format", where, "");
  if (format != kCheckpointFormat) {
    ZD_THROW_INPUT("{}: format is \"{}\", expected \"{}\"", where, format, kCheckpointFormat);
  }
  Manifest m;
  m.format_version = field<int>(j, "format_version", where, "");
  if (m.format_version > kCheckpointFormatVersion) {
    ZD_THROW_INPUT("{}: format version {} is newer than this zerod understands ({}); upgrade zerod",
                   where, m.format_version, kCheckpointFormatVersion);
  }
  if (m.format_version < 1)
    ZD_THROW_INPUT("{}: format version {} is invalid", where, m.format_version);
  m.tag = field<std::string>(j, "tag", where, "");
  if (j.contains("automatic")) {
    m.automatic = field<bool>(j, "automatic", where, "");
  } else {  // older manifests: the job's own saves were the global_stepN ones
    m.automatic = m.tag.rfind("global_step", 0) == 0;
  }
  m.created = j.value("created", "");
  m.zerod_version = j.value("zerod_version", "");
  m.world_size = field<int>(j, "world_size", where, "");
  m.zero_stage = field<int>(j, "zero_stage", where, "");
  m.tensor_parallel =
      j.contains("tensor_parallel") ? field<int>(j, "tensor_parallel", where, "") : 1;
  if (m.tensor_parallel < 1 || m.tensor_parallel > m.world_size)
    ZD_THROW_INPUT("{}: tensor_parallel {} must be between 1 and the world size {}", where,
                   m.tensor_parallel, m.world_size);
  m.compute_dtype = field<std::string>(j, "compute_dtype", where, "");
  m.job = j.value("job", json::object());
  const json& model = field<json>(j, "model", where, "");
  m.n_layer = field<int>(model, "n_layer", where, "model.");
  m.n_head = field<int>(model, "n_head", where, "model.");
  m.n_embd = field<int>(model, "n_embd", where, "model.");
  m.vocab_size = field<int>(model, "vocab_size", where, "model.");
  m.padded_vocab_size = field<int>(model, "padded_vocab_size", where, "model.");
  m.seq_len = field<int>(model, "seq_len", where, "model.");
  for (const json& u : field<json>(model, "units", where, "model.")) {
    m.units.push_back({field<std::string>(u, "name", where, "model.units[]."),
                       field<int64_t>(u, "numel", where, "model.units[].")});
  }
  const json& prog = field<json>(j, "progress", where, "");
  TrainingProgress& p = m.progress;
  p.global_step = field<int64_t>(prog, "global_step", where, "progress.");
  p.skipped_steps = field<int64_t>(prog, "skipped_steps", where, "progress.");
  p.adam_steps = field<int64_t>(prog, "adam_steps", where, "progress.");
  p.samples_seen = field<int64_t>(prog, "samples_seen", where, "progress.");
  const json& data = field<json>(j, "data", where, "");
  p.data_seed = field<uint64_t>(data, "seed", where, "data.");
  p.data_num_samples = field<int64_t>(data, "num_samples", where, "data.");
  if (data.contains("blend"))  // absent without a blend (and in older manifests)
    p.data_blend = field<std::vector<double>>(data, "blend", where, "data.");
  p.init_seed = field<uint64_t>(field<json>(j, "rng", where, ""), "init_seed", where, "rng.");
  const json& ls = field<json>(j, "loss_scaler", where, "");
  p.loss_scale = field<double>(ls, "scale", where, "loss_scaler.");
  p.loss_scale_hysteresis_left = field<int>(ls, "hysteresis_left", where, "loss_scaler.");
  p.loss_scale_iter = field<int64_t>(ls, "iter", where, "loss_scaler.");
  p.loss_scale_last_overflow_iter = field<int64_t>(ls, "last_overflow_iter", where, "loss_scaler.");
  if (j.contains("monitors")) {  // absent in older manifests
    const json& mon = field<json>(j, "monitors", where, "");
    p.csv_run = field<int64_t>(mon, "csv_run", where, "monitors.");
    p.tensorboard_run = field<int64_t>(mon, "tensorboard_run", where, "monitors.");
    if (p.csv_run < -1 || p.tensorboard_run < -1)
      ZD_THROW_INPUT("{}: monitors: run numbers must be >= -1", where);
  }
  if (j.contains("tokenizer")) {  // absent when the job had no data.tokenizer
    const json& t = field<json>(j, "tokenizer", where, "");
    CheckpointTokenizer tok;
    tok.source = field<std::string>(t, "source", where, "tokenizer.");
    tok.kind = field<std::string>(t, "kind", where, "tokenizer.");
    for (const json& f : field<json>(t, "files", where, "tokenizer.")) {
      SideFile sf;
      sf.name = field<std::string>(f, "name", where, "tokenizer.files[].");
      // "tokenizer/NAME": one plain name under tokenizer/, no way out of the checkpoint.
      const std::string prefix = "tokenizer/";
      const std::string rest = sf.name.substr(std::min(sf.name.size(), prefix.size()));
      if (sf.name.compare(0, prefix.size(), prefix) != 0 || rest.empty() ||
          rest.find('/') != std::string::npos || rest[0] == '.') {
        ZD_THROW_INPUT("{}: tokenizer file name \"{}\" must be tokenizer/NAME", where, sf.name);
      }
      sf.bytes = field<int64_t>(f, "bytes", where, "tokenizer.files[].");
      sf.crc32c = static_cast<uint32_t>(
          std::stoul(field<std::string>(f, "crc32c", where, "tokenizer.files[]."), nullptr, 16));
      tok.files.push_back(std::move(sf));
    }
    m.tokenizer = std::move(tok);
  }
  for (const json& f : field<json>(j, "files", where, "")) {
    CheckpointFile cf;
    cf.name = field<std::string>(f, "name", where, "files[].");
    if (cf.name.empty() || cf.name.find('/') != std::string::npos || cf.name[0] == '.') {
      ZD_THROW_INPUT("{}: file name \"{}\" must be a plain name inside the checkpoint", where,
                     cf.name);
    }
    cf.rank = field<int>(f, "rank", where, "files[].");
    cf.tensor_rank =
        f.contains("tensor_rank") ? field<int>(f, "tensor_rank", where, "files[].") : 0;
    if (cf.tensor_rank < 0 || cf.tensor_rank >= m.tensor_parallel)
      ZD_THROW_INPUT("{}: {} has tensor_rank {} outside [0, {})", where, cf.name, cf.tensor_rank,
                     m.tensor_parallel);
    cf.bytes = field<int64_t>(f, "bytes", where, "files[].");
    cf.crc32c = static_cast<uint32_t>(
        std::stoul(field<std::string>(f, "crc32c", where, "files[]."), nullptr, 16));
    for (const json& s : field<json>(f, "slices", where, "files[].")) {
      ShardSlice sl{field<int>(s, "unit", where, "files[].slices[]."),
                    field<int64_t>(s, "begin", where, "files[].slices[]."),
                    field<int64_t>(s, "end", where, "files[].slices[].")};
      if (sl.unit < 0 || sl.unit >= static_cast<int>(m.units.size()) || sl.begin < 0 ||
          sl.end < sl.begin || sl.end > m.units[static_cast<size_t>(sl.unit)].numel) {
        ZD_THROW_INPUT("{}: {} holds slice [{}, {}) of unit {}, outside the model's units", where,
                       cf.name, sl.begin, sl.end, sl.unit);
      }
      cf.slices.push_back(sl);
    }
    m.files.push_back(std::move(cf));
  }
  return m;
}

int64_t Manifest::total_bytes() const {
  int64_t n = 0;
  for (const auto& f : files) n += f.bytes;
  return n;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) ZD_THROW_INPUT("{}: cannot read the checkpoint manifest (missing or unreadable)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  const std::string text = ss.str();
  if (std::string deep = config::json_depth_problem(text); !deep.empty()) {
    ZD_THROW_INPUT("{}: {}", path, deep);  // before a tree is built: it recurses per level
  }
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ZD_THROW_INPUT("{}: not valid JSON ({})", path, config::json_error_without_input(e.what()));
  }
  return Manifest::from_json(j, path);
}

}  // namespace zerod
