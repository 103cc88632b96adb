// A consolidated model out of a sharded checkpoint, as `zeroctl export` writes it: one Hugging
// Face safetensors file, or a Hugging Face model directory (config.json, generation_config.json,
// weights sharded above a size), streamed unit by unit from the rank files (one unit in memory).
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/checkpoint/safetensors.h"

namespace zerod {

struct ExportReport {
  std::string tag;                   // the checkpoint exported
  std::vector<std::string> skipped;  // newer checkpoints passed over (torn or corrupt), with why
  int64_t global_step = 0;
  int64_t parameters = 0;  // real parameters written
  FileChecksum file;       // size and CRC32C of the output file (directory: bytes of all shards)
  std::vector<std::string> files;  // the weight files written
};

// Exports checkpoint `which` ("latest" or a tag) of checkpoint_dir to `out` in `dtype` (kF32 or
// kBF16): a file when `out` ends in .safetensors, else a Hugging Face directory whose weight
// files hold at most max_shard_bytes each (hf_model.h). The model comes from the manifest's
// copy of the job. The checkpoint is verified first (sizes, checksums). An existing `out` is an
// InputError unless overwrite is set; the output appears only when complete.
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"
ExportReport export_checkpoint(const std::string& checkpoint_dir, const std::string& which,
                               const std::string& out, DType dtype, bool overwrite,
                               int64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace zerod
