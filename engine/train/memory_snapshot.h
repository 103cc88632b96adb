// In-memory snapshots of an elastic job (issue 25 item 3, docs/elastic.md "Snapshots"): every
// snapshot.interval steps each rank writes its checkpoint files (the checkpoint's own format,
// Checkpointer::save_files) into its node's snapshot directory, a memory file system (tmpfs,
// snapshot.dir) that the node's agent owns, so it outlives the worker's restart; and sends a copy
// to its buddy, the same local rank of the previous node (node i keeps node i+1's copy, mod n),
// over the world communicator (one send_recv ring step).
//
// When a round starts after a failure, the workers pool what their nodes hold: the newest step
// for which every rank of the old world is held somewhere (its own node, or its buddy's) is
// complete. If it is newer than the disk checkpoint, every rank rebuilds it as a checkpoint
// directory in its node's memory and loads it (the resume-on-another-world-size path reshards
// it); otherwise, or when no snapshot is complete (a node and its buddy both lost), the disk
// checkpoint is used, and the log says so. The steps lost (the step the survivors had trained
// to, less the restored step) go to the log and, through the agent, to zeroctl status.
//
// Node directory (ZEROD_ELASTIC_SNAPSHOT_DIR, made and removed by the agent):
//   progress.rankR           the last step rank R trained
//   stepS/manifest.json      snapshot of step S: the manifest ...
//   stepS/rankO/             ... and old rank O's files (O: this node's ranks and the buddy's)
//   restore.rankR/           the checkpoint directory rank R loads after a failure
//   recovery                 "restored ...": one line for the agent, then "steps_lost N"
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/config/job_config.h"
#include "engine/runtime/rank_context.h"
#include "engine/train/checkpointer.h"

namespace zerod {

constexpr const char* kSnapshotDirEnv = "ZEROD_ELASTIC_SNAPSHOT_DIR";

struct SnapshotRestore {
  std::string dir;         // a checkpoint directory (in memory) to load "latest" from
  int64_t step = 0;        // the snapshot's step
  int64_t trained_to = 0;  // the newest step any survivor had trained
};

class MemorySnapshots {
 public:
  MemorySnapshots(const SnapshotConfig& config, const RankContext& ctx, int nproc_per_node,
                  std::string node_dir);

  // After step `step` on every rank: records the step; every interval steps, a snapshot
  // (collective).
  void after_step(int64_t step, Checkpointer& ckpt, const TrainingProgress& progress);

  // At the start of a round that resumes (collective): where to load the newest complete
  // snapshot from, when it is newer than the disk checkpoint in `checkpoint_dir`; nullopt to
  // resume from disk (logged with why, and the steps lost).
  std::optional<SnapshotRestore> prepare_restore(const std::string& checkpoint_dir);
  // After prepare_restore: the steps the failure lost (the newest step a survivor trained less
  // the step restored, from memory or disk); nullopt before, or when nothing was restored.
  std::optional<int64_t> steps_lost() const { return steps_lost_; }

 private:
  void take(int64_t step, Checkpointer& ckpt, const TrainingProgress& progress);
  void report(const std::string& line, int64_t steps_lost);

  SnapshotConfig config_;
  RankContext ctx_;
  int nproc_;
  std::string node_dir_;
  std::optional<int64_t> steps_lost_;
};

// For an elastic agent whose job failed (below MIN, restarts used up; docs/elastic.md): the newest
// snapshot in `node_dir` whose every old rank's files this node holds (its own and its buddy's:
// all of them when the old world was at most two nodes), committed into `checkpoint_dir` as its
// checkpoint (global_stepS, `latest`) when newer than the one there. Returns what it did, for
// the log ("" when no complete snapshot is newer).
std::string save_held_snapshot(const std::string& node_dir, const std::string& checkpoint_dir);

// The snapshots of this worker: null unless snapshot.enabled and an elastic agent gave it a
// node directory (a static job warns, once, that it takes none).
std::unique_ptr<MemorySnapshots> make_memory_snapshots(const JobConfig& cfg, const RankContext& ctx,
                                                       int nproc_per_node);

}  // namespace zerod
