// A consolidated model out of a sharded checkpoint: the Hugging Face GPT-2 safetensors file that
// `zeroctl export` writes, streamed unit by unit from the rank files (one unit in memory).
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
  FileChecksum file;       // size and CRC32C of the output
};

// Exports checkpoint `which` ("latest" or a tag) of checkpoint_dir to `out` in `dtype` (kF32 or
// kBF16). The checkpoint is verified first (sizes, checksums). An existing `out` is an InputError
// unless overwrite is set; the file appears only when complete (written to out.tmp, renamed).
ExportReport export_checkpoint(const std::string& checkpoint_dir, const std::string& which,
                               const std::string& out, DType dtype, bool overwrite);

}  // namespace zerod
