#include "engine/checkpoint/export.h"

#include <filesystem>

#include "core/error.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_gpt2.h"
#include "engine/checkpoint/shard_io.h"
#include "model/layout.h"

namespace zerod {

namespace fs = std::filesystem;

ExportReport export_checkpoint(const std::string& checkpoint_dir, const std::string& which,
                               const std::string& out, DType dtype, bool overwrite) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    ZD_THROW_INPUT("--dtype {}: export writes fp32 or bf16", dtype_name(dtype));
  }
  std::error_code ec;
  if (!overwrite && fs::exists(out, ec)) {
    ZD_THROW_INPUT("{}: the output file exists (pass --force to replace it)", out);
  }
  FoundCheckpoint found = find_checkpoint(checkpoint_dir, which);
  const Manifest& m = found.manifest;

  GptSpec spec;
  spec.n_layer = m.n_layer;
  spec.n_head = m.n_head;
  spec.n_embd = m.n_embd;
  spec.vocab_size = m.vocab_size;
  spec.padded_vocab_size = m.padded_vocab_size;
  spec.seq_len = m.seq_len;
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
  report.file = export_hf_gpt2(
      layout,
      [&](int u, float* flat) { reader.read(u, 0, layout.unit(u).numel, flat, nullptr, nullptr); },
      out, dtype);
  report.tag = found.tag;
  report.skipped = std::move(found.skipped);
  report.global_step = m.progress.global_step;
  report.parameters = spec.num_parameters();
  return report;
}

}  // namespace zerod
