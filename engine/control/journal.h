// The daemon's memory across restarts (zerod serve --state-dir): a small journal of its current
// job (the job file's text as submitted, its name, state, checkpoint dir, id, the directory its
// relative paths resolve against, the directory the daemon ran in) and the count of jobs ever
// started, so that a restarted daemon reports a job that was running as interrupted, `zeroctl
// resume` continues it, and job ids are never reused.
//
// STATE_DIR/journal.json is replaced atomically (write a temporary file, fsync, rename, fsync the
// directory): a kill at any moment leaves the previous journal or the new one. STATE_DIR/lock is
// held (flock) for the daemon's life: one daemon per state directory; the kernel drops the lock
// of a killed daemon.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerod {

struct JournalJob {
  std::string id;     // "job-7"
  std::string state;  // job_state_name(): rendezvous, running, ..., finished, failed
  std::string reason;
  bool stopped = false;
  std::string name;  // for messages (the job file's path as zeroctl sent it)
  std::string text;  // the job file's text, parsed again at a restart
  std::string resume;
  std::string checkpoint_dir;
  std::string cwd;       // the daemon's directory when the job was submitted
  std::string base_dir;  // the job's relative paths resolve against it (empty: against cwd,
                         // a journal of a daemon before SubmitJobRequest.base_dir)
};

struct Journal {
  int64_t jobs_started = 0;  // ids job-1 .. job-N are taken
  std::optional<JournalJob> job;
};

class StateDir {
 public:
  // Creates `dir` (0700) and locks it. InputError naming the directory when it cannot, or when
  // another daemon holds it (with that daemon's pid).
  explicit StateDir(std::string dir);
  ~StateDir();
  StateDir(const StateDir&) = delete;
  StateDir& operator=(const StateDir&) = delete;

  const std::string& dir() const { return dir_; }
  std::string journal_path() const { return dir_ + "/journal.json"; }
  // The journal, or nullopt when there is none yet. InputError naming the file when it cannot
  // be read or is not a journal (its content is never quoted).
  std::optional<Journal> read() const;
  // Replaces the journal atomically. InputError naming the file on failure.
  void write(const Journal& j) const;

 private:
  std::string dir_;
  int lock_fd_ = -1;
};

}  // namespace zerod
