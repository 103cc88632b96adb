// The checkpoint directory (DESIGN.md section 5):
//
//   CHECKPOINT_DIR/TAG/          a complete checkpoint: rank files + manifest.json
//   CHECKPOINT_DIR/TAG.tmp/      a save in progress (never read)
//   CHECKPOINT_DIR/latest        the tag of the newest complete checkpoint (one line)
//
// A save writes into TAG.tmp/, fsyncs every file and the directory, renames TAG.tmp to TAG,
// fsyncs CHECKPOINT_DIR, then replaces `latest` by write-and-rename. A crash at any point leaves
// `latest` on a complete checkpoint. Loading verifies sizes and checksums; a torn or corrupt
// newest checkpoint is reported and the newest complete one is used instead.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint/manifest.h"

namespace zerod {

// Tags are [A-Za-z0-9._-]{1,128}, not "latest", not ending in ".tmp"/".old", not starting with
// '.'; InputError otherwise (they become directory names: no way out of the checkpoint dir),
// quoting at most a prefix and the length of a long one (config::clip_input).
void validate_tag(const std::string& tag);
std::string default_tag(int64_t global_step);  // "global_step<N>"

// Checks that checkpoints can be written under `dir` before any work is at stake: creates it
// (create) or, when it does not exist yet, takes its nearest existing parent (!create, for
// `zerod check`), then creates, writes, fsyncs, renames and removes a probe file named after
// `probe_id` there. InputError naming `key` (e.g. "train.checkpoint_dir"), the directory and the
// system's reason: a file in the way, no permission, a read-only or pseudo file system.
void probe_checkpoint_dir(const std::string& dir, const std::string& key, bool create,
                          const std::string& probe_id);

// Rank 0, before the ranks write: creates dir and an empty dir/TAG.tmp (removing a stale one).
std::string prepare_save(const std::string& dir, const std::string& tag);

// Rank 0, after every rank's file is in dir/TAG.tmp: writes the manifest, fsyncs, renames to
// dir/TAG (replacing an older checkpoint of the same tag), and points `latest` at it.
void commit_save(const std::string& dir, const Manifest& manifest);

// Removes the oldest automatic checkpoints (Manifest::automatic: the job's own saves) beyond the
// newest keep_last automatic ones (never the one `latest` names, never one the user tagged) and
// stale TAG.tmp directories. Returns the tags removed.
std::vector<std::string> apply_retention(const std::string& dir, int64_t keep_last);

// The tag `latest` names (nullopt when there is no `latest` file). A `latest` that is not a valid
// tag (a path out of the directory: "../other/global_step5", "/abs/dir") is ignored with a
// warning: nullopt, and find_checkpoint("latest") takes the newest complete checkpoint.
std::optional<std::string> read_latest(const std::string& dir);

// Checks every file of the manifest: present, the recorded size, the recorded CRC32C.
// InputError naming the file and what differs.
// With checksums false, only presence and sizes (the loader checks the CRC32C as it reads).
void verify_checkpoint(const std::string& path, const Manifest& manifest, bool checksums = true);

struct FoundCheckpoint {
  std::string tag;
  std::string path;  // dir/TAG
  Manifest manifest;
  std::vector<std::string> skipped;  // newer checkpoints passed over, with why
};

// Finds the checkpoint to load: `which` = "latest" (the newest complete one: `latest`, or when
// that one is torn or corrupt, the complete checkpoint with the highest global step) or a tag
// (that one, verified). InputError when the directory is missing, the tag is unknown, or no
// complete checkpoint exists.
struct FindOptions {
  bool checksums = true;             // verify every file's CRC32C (else sizes only)
  std::vector<std::string> exclude;  // tags found corrupt while loading: skip them ("latest")
};
FoundCheckpoint find_checkpoint(const std::string& dir, const std::string& which,
                                const FindOptions& options = {});

// Complete checkpoints in dir (with a readable manifest), newest global step first.
std::vector<std::pair<std::string, Manifest>> list_checkpoints(const std::string& dir);

}  // namespace zerod
