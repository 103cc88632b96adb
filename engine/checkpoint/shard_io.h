// The per-rank files of a checkpoint: rank R's slices of every unit's fp32 master weights and
// Adam moments, in CHECKPOINT/rank_RRRRR.safetensors, three 1-D F32 tensors per unit
// ("<unit>.master", "<unit>.exp_avg", "<unit>.exp_avg_sq"), the slice offsets in the metadata
// and in the manifest. ShardReader re-slices: it reads any range of any unit from whichever
// files hold it, so a checkpoint saved with one world size and stage loads with another.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/manifest.h"
#include "engine/checkpoint/safetensors.h"

namespace zerod {

// One unit's slice [begin, end) of this rank's optimizer states.
struct ShardData {
  int unit = 0;  // the saving engine's unit
  // The unit's index in the checkpoint (the whole model's layout) when it differs from `unit`: a
  // pipeline stage's engine holds a subset of the units. -1: `unit`.
  int file_unit = -1;
  std::string unit_name;
  int64_t begin = 0, end = 0;
  const float* master = nullptr;      // (end - begin)
  const float* exp_avg = nullptr;     // (end - begin)
  const float* exp_avg_sq = nullptr;  // (end - begin)
};

std::string rank_file_name(int rank);  // "rank_00003.safetensors"

// Where a writer gets each shard's data when it must not simply read `shards` (an async save
// writing live optimizer states): acquire(i) returns shard i with the pointers to write from,
// valid until release(i). Called in order from the writing thread.
class ShardSource {
 public:
  virtual ~ShardSource() = default;
  virtual ShardData acquire(size_t i) = 0;
  virtual void release(size_t i) = 0;
};

// Writes dir/rank_file_name(rank) (fsynced) and returns its manifest entry (size, CRC32C,
// slices). With no shards no file is written and the entry has bytes == 0 and an empty name.
// The data comes from `shards`, or from `source` when one is given (shapes from `shards`).
CheckpointFile write_rank_file(const std::string& dir, int rank,
                               const std::vector<ShardData>& shards, ShardSource* source = nullptr);

// A range [begin, end) of a unit's states one rank loads (any pointer may be null).
struct ShardRequest {
  int unit = 0;
  int64_t begin = 0, end = 0;
  float* master = nullptr;      // (end - begin)
  float* exp_avg = nullptr;     // (end - begin)
  float* exp_avg_sq = nullptr;  // (end - begin)
};

// Loads the requests from checkpoint directory `path` in one pass: every file holding part of a
// request is read once from start to end (O_DIRECT where the file system allows, the next chunk
// read while the current one is checksummed and copied out), its size and CRC32C checked
// against the manifest on the way. Elements at or past a unit's size are zero. InputError
// first when the manifest's files do not cover every unit.
// InputError naming the file when it is missing, short or corrupt; the destinations are then partly
// written. Returns the bytes read.
int64_t load_shards(const std::string& path, const Manifest& manifest,
                    const std::vector<ShardRequest>& requests);

class ShardReader {
 public:
  // Checks that the manifest's slices cover every unit completely.
  ShardReader(std::string path, const Manifest& manifest);
  ~ShardReader();

  // Fills [begin, end) of unit u's states (any pointer may be null); elements at or past the
  // unit's size (padding) are zero.
  void read(int unit, int64_t begin, int64_t end, float* master, float* exp_avg, float* exp_avg_sq);

 private:
  SafetensorsReader& open(const std::string& name);
  std::string path_;
  const Manifest& manifest_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

}  // namespace zerod
