// manifest.json of a checkpoint (DESIGN.md section 5): what was saved, by which job, on how
// many ranks at which ZeRO stage, where training stood, and the size and CRC32C of every file.
// A checkpoint directory is complete when its manifest parses, its format version is known and
// every file it lists has the recorded size and checksum.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zerod {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointFormat = "zerod-checkpoint";

// One unit's slice [begin, end) of the flat parameter buffer, held by one file.
struct ShardSlice {
  int unit = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory, e.g. "rank_00003.safetensors"
  int rank = 0;
  // The tensor-parallel rank that wrote it: its slices are of that rank's part of each unit
  // (model/shard.h); 0 without tensor parallelism.
  int tensor_rank = 0;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  std::vector<ShardSlice> slices;
};

// A file a checkpoint carries beside the rank files (the job's tokenizer), checked as they are.
struct SideFile {
  std::string name;  // relative to the checkpoint directory: "tokenizer/tokenizer.json"
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The job's tokenizer (data.tokenizer), copied into CHECKPOINT/tokenizer/.
struct CheckpointTokenizer {
  std::string source;  // data.tokenizer when saved
  std::string kind;    // Tokenizer::describe()
  std::vector<SideFile> files;
};

struct UnitShape {
  std::string name;
  int64_t numel = 0;
};

// Where training stood when the checkpoint was taken (everything exact resume needs).
struct TrainingProgress {
  int64_t global_step = 0;    // optimizer steps done, skipped ones included
  int64_t skipped_steps = 0;  // fp16 overflow skips
  int64_t adam_steps = 0;     // steps the optimizer took (bias correction, LR schedule)
  int64_t samples_seen = 0;   // data-loader stream position (global samples consumed)
  uint64_t data_seed = 0;
  int64_t data_num_samples = 0;  // size of the training set the position refers to
  std::vector<double> data_blend;  // data.train's blend weights; empty: no blend
  uint64_t init_seed = 0;
  // fp16 loss scaler (DeepSpeed's DynamicLossScaler state)
  double loss_scale = 1.0;
  int loss_scale_hysteresis_left = 1;
  int64_t loss_scale_iter = 0;
  int64_t loss_scale_last_overflow_iter = -1;
  // The run directories of the job's monitors (engine/metrics/csv_monitor.h): 0 for
  // OUTPUT_PATH/JOB_NAME, N for JOB_NAME_N; -1 when none was written (or an older manifest). A
  // resumed run appends there.
  int64_t csv_run = -1;
  int64_t tensorboard_run = -1;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  std::string tag;
  // Saved by the job itself (save_interval, the end of a run, a preemption signal) rather than
  // asked for by the user with a tag: only these count for (and are removed by) keep_last.
  // Absent in a manifest: true for a global_stepN tag, false otherwise.
  bool automatic = true;
  std::string created;  // UTC, ISO 8601
  std::string zerod_version;
  nlohmann::json job;  // the resolved job (job_to_json)
  int world_size = 1;
  int zero_stage = 0;
  // Tensor-parallel size T of the saving job: units[] are the parts of one tensor rank (every
  // tensor rank's parts have these sizes) and each file says whose parts it holds. Absent in a
  // manifest: 1 (whole units). Loading reshards to any T (engine/checkpoint/unit_reader.h).
  int tensor_parallel = 1;
  std::string compute_dtype;
  // model shape
  int n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, padded_vocab_size = 0, seq_len = 0;
  std::vector<UnitShape> units;
  TrainingProgress progress;
  std::vector<CheckpointFile> files;
  // The job's tokenizer files ("tokenizer" in manifest.json; absent: the job had none).
  std::optional<CheckpointTokenizer> tokenizer;

  nlohmann::json to_json() const;
  // Parses and validates (format name and version, required fields, slices inside their
  // units). `where` names the manifest file in InputError messages.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
  int64_t total_bytes() const;
};

// Reads `dir`/manifest.json (InputError naming the file when missing or invalid).
Manifest read_manifest(const std::string& dir);

}  // namespace zerod
