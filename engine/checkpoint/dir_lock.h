// The exclusive lock a training job holds on its checkpoint directory for its whole life, so two
// jobs never write into one directory (issue: two runs sharing a checkpoint_dir destroyed each
// other's checkpoints).
//
// DIR/.zerod.lock is created if needed and locked with flock(LOCK_EX | LOCK_NB); the holder
// writes its host, pid, job and start time into it. A second job (another process, or another
// open in this one) finds it locked and gets InputError (exit 2) naming the holder from the
// file. The kernel drops the lock when the holder's process ends, however it ends (kill -9
// included), so a stale lock of a dead process never blocks a new job: the file stays, the lock
// does not. (flock is advisory and local to one machine's kernel, or the NFS server's for
// NFSv4 with lock support.)
#pragma once

#include <string>

namespace zerod {

class CheckpointDirLock {
 public:
  // Creates DIR (and its parents) when missing and takes the lock; `key` names the setting in
  // messages ("train.checkpoint_dir"), `job` describes the job ("job.json").
  CheckpointDirLock(const std::string& dir, const std::string& key, const std::string& job);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  const std::string& path() const { return path_; }  // DIR/.zerod.lock
  // DIR did not exist before this lock made it. (Released, such a directory that holds nothing
  // but the lock file is removed again: a job that never saved leaves nothing behind.)
  bool created() const { return created_; }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  bool created_ = false;
};

}  // namespace zerod
