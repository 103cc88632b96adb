#include "engine/checkpoint/export.h"

#include <filesystem>

#include "core/error.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/shard_io.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "model/layout.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

ModelSpec manifest_model_spec(const Manifest& m, const std::string& path) {
  if (m.job.is_object() && m.job.contains("model")) {
    return model_spec(parse_model_config(m.job["model"], path + "/manifest.json: job"));
  }
  ModelSpec spec;  // a manifest without the job: GPT-2 from the shape fields
  spec.n_layer = m.n_layer;
  spec.n_head = m.n_head;
  spec.n_embd = m.n_embd;
  spec.vocab_size = m.vocab_size;
  spec.padded_vocab_size = m.padded_vocab_size;
  spec.seq_len = m.seq_len;
  return spec;
}

bool is_safetensors_file(const std::string& out) {
  const std::string ext = ".safetensors";
  return out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace

ExportReport export_checkpoint(const std::string& checkpoint_dir, const std::string& which,
                               const std::string& out, DType dtype, bool overwrite,
                               int64_t max_shard_bytes) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    ZD_THROW_INPUT("--dtype {}: export writes fp32 or bf16", dtype_name(dtype));
  }
  const bool to_file = is_safetensors_file(out);
  std::error_code ec;
  if (!overwrite && fs::exists(out, ec)) {
    ZD_THROW_INPUT("{}: the output {} exists (pass --force to replace it)", out,
                   to_file ? "file" : "directory");
  }
  FoundCheckpoint found = find_checkpoint(checkpoint_dir, which);
  const Manifest& m = found.manifest;

  const ModelSpec spec = manifest_model_spec(m, found.path);
  const ParamLayout layout(spec);
  // The manifest's units must be the layout this build derives from the shape it records.
  if (static_cast<int>(m.units.size()) != layout.num_units()) {
    ZD_THROW_INPUT("{}/manifest.json: {} units, but a model of this shape has {}", found.path,
                   m.units.size(), layout.num_units());
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitShape& us = m.units[static_cast<size_t>(u)];
    if (us.name != layout.unit(u).name || us.numel != layout.unit(u).numel) {
      ZD_THROW_INPUT("{}/manifest.json: units[{}] is {} ({} elements), expected {} ({} elements)",
                     found.path, u, us.name, us.numel, layout.unit(u).name, layout.unit(u).numel);
    }
  }

  ShardReader reader(found.path, m);
  ExportReport report;
  auto read_unit = [&](int u, float* flat) {
    reader.read(u, 0, layout.unit(u).numel, flat, nullptr, nullptr);
  };
  if (to_file) {
    report.file = export_hf_safetensors(layout, read_unit, out, dtype);
    report.files = {out};
  } else {
    const HfDirectoryReport d =
        export_hf_directory(layout, read_unit, out, dtype, max_shard_bytes, overwrite);
    report.file.bytes = static_cast<uint64_t>(d.bytes);
    for (const auto& f : d.files) report.files.push_back((fs::path(out) / f).string());
  }
  report.tag = found.tag;
  report.skipped = std::move(found.skipped);
  report.global_step = m.progress.global_step;
  report.parameters = spec.num_parameters();
  return report;
}

}  // namespace zerod
