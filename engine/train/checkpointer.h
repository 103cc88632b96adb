// Saving and loading a rank's training state (DESIGN.md section 5), collectively: every rank
// calls save/poll/finish/load at the same step.
//
// save: rank 0 prepares CHECKPOINT_DIR/TAG.tmp; every rank that owns optimizer shards writes
// its file there (stage 0: rank 0 alone, the others hold the same states); the file sizes and
// checksums are gathered; rank 0 writes the manifest and commits atomically (checkpoint_dir.h);
// a barrier ends the save. With checkpoint.async the rank copies its shards to host memory and
// writes them on a background thread while training goes on; the commit happens at the first
// step boundary where every rank's write is done (poll), and the next save waits for it.
// Async saves copy nothing up front: the writer reads the live states, and the optimizer copies a
// unit only if it must update it before the writer got to it (state_snapshot.h). States in GPU
// memory are copied to host memory in save() (the time training is blocked) and written from
// there in the background. NVMe states are saved synchronously, unit by unit.
//
// load: rank 0 chooses and verifies the checkpoint (falling back from a torn newest one) and
// tells the others; each rank reads its own optimizer shard of every unit from whichever files
// hold it, so any world size and ZeRO stage can load any checkpoint.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.h"
#include "engine/checkpoint/dir_lock.h"
#include "engine/checkpoint/manifest.h"
#include "engine/checkpoint/shard_io.h"
#include "engine/config/job_config.h"
#include "engine/runtime/rank_context.h"
#include "engine/train/job_tokenizer.h"
#include "engine/train/state_snapshot.h"
#include "zero/zero_engine.h"

namespace zerod {

struct SaveReport {
  std::string tag;
  int64_t bytes = 0;           // this rank's file (sync: written; async: being written)
  double blocked_seconds = 0;  // how long training waited in save()
  bool committed = false;      // the checkpoint is complete on disk when save() returns
};

class Checkpointer {
 public:
  // tokenizer: the job's (data.tokenizer), copied into every checkpoint; null: none.
  Checkpointer(const JobConfig& cfg, const RankContext& ctx, ZeroEngine& engine,
               MemoryTracker* tracker, const JobTokenizer* tokenizer = nullptr);
  ~Checkpointer();

  // automatic: the job's own save (interval, end, preemption), which keep_last may remove later;
  // false for a tag the user asked for.
  SaveReport save(const std::string& tag, const TrainingProgress& progress, bool automatic = true);
  // At a step boundary: commits a finished background save (one small all-reduce while one is
  // pending; nothing otherwise). Returns the tag it committed, if any.
  std::optional<std::string> poll();
  // Waits for and commits a pending background save; returns its tag (nullopt: none pending).
  std::optional<std::string> finish();
  bool pending() const { return pending_ != nullptr; }
  // Loads `which` ("latest", a tag, or "auto": latest when there is a checkpoint, else
  // nothing) into the engine; returns where training stood (nullopt: "auto" found none).
  std::optional<TrainingProgress> load(const std::string& which);

  // An in-memory snapshot's share of a save (engine/train/memory_snapshot.h): this rank's files
  // written into `dir` (an existing directory of its own, e.g. on tmpfs), and the manifest every
  // rank builds alike from the gathered file records. Collective. No tokenizer, commit or
  // retention: the caller keeps the files and the manifest.
  Manifest save_files(const std::string& dir, const std::string& tag,
                      const TrainingProgress& progress);

  const std::string& dir() const { return cfg_.train.checkpoint_dir; }
  // Async saves: training time spent in optimizer steps copying or waiting for states a
  // background write had not reached yet (cumulative).
  double update_blocked_seconds() const { return snapshot_ ? snapshot_->blocked_seconds() : 0.0; }

 private:
  struct Pending;
  class StagedStates;
  // This rank's shards to save (pointers to the states when they are in memory).
  std::vector<ShardData> my_shards();
  Manifest make_manifest(const std::string& tag, bool automatic,
                         const TrainingProgress& progress) const;
  void write_rank_extras(const std::string& dir, const TrainingProgress& progress);
  // Loads checkpoint `tag` (chosen by rank 0); nullopt with *why set when a rank found one of
  // its files corrupt (collective: every rank returns the same).
  std::optional<TrainingProgress> load_tag(const std::string& tag, std::string* why);
  void commit(Pending& p, const std::vector<std::string>& files_json);
  std::vector<std::string> gather(const std::string& mine);
  void barrier();
  bool all_true(bool mine);
  // The 1-bit optimizer's per-rank errors: the file's name in a checkpoint, and reading it.
  static std::string onebit_file(int rank);
  void load_onebit(OnebitOptimizer& ob, const std::string& path);
  // PowerSGD's residuals and Q of this rank (powersgd_rankR.bin): restored, or restarted with a
  // warning when the checkpoint has none for this rank and world size.
  static std::string powersgd_file(int rank);
  void load_powersgd(PowerSgd& ps, const std::string& path, int64_t steps);

  const JobConfig& cfg_;
  RankContext ctx_;
  ZeroEngine& engine_;
  MemoryTracker* tracker_;
  const JobTokenizer* tokenizer_ = nullptr;
  std::unique_ptr<Pending> pending_;
  std::unique_ptr<StateSnapshot> snapshot_;  // async: copy-on-update of the states being written
  std::unique_ptr<CheckpointDirLock> lock_;  // rank 0: the directory is this job's
};

}  // namespace zerod
