#include "engine/checkpoint/export.h"

#include <filesystem>

#include "core/error.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/shard_io.h"
#include "engine/checkpoint/unit_reader.h"
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
  // Whole units, the tensor-parallel parts of a T > 1 checkpoint put back together (the units
  // are checked against the shape the manifest records).
  UnitReader reader(found.path, m, spec);
  ExportReport report;
  auto read_unit = [&](int u, float* flat) { reader.read_global(u, flat, nullptr, nullptr); };
  if (to_file) {
    report.file = export_hf_safetensors(layout, read_unit, out, dtype);
    report.files = {out};
  } else {
    // The job's tokenizer (data.tokenizer), when the checkpoint carries one: AutoTokenizer
    // loads it from the exported directory.
    std::vector<std::string> extra;
    if (m.tokenizer) {
      for (const SideFile& f : m.tokenizer->files)
        extra.push_back((fs::path(found.path) / f.name).string());
    }
    const HfDirectoryReport d =
        export_hf_directory(layout, read_unit, out, dtype, max_shard_bytes, overwrite, extra);
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
