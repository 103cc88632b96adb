#include "engine/control/daemon.h"

#include <filesystem>
#include <tuple>

#include <fmt/ranges.h>

#include "core/log.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/config/input_limits.h"
#include "engine/config/parse.h"
#include "engine/train/job_environment.h"
#include "engine/train/run_job.h"

namespace zerod {

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::kIdle:
      return "idle";
    case JobState::kRendezvous:
      return "rendezvous";
    case JobState::kRunning:
      return "running";
    case JobState::kCheckpointing:
      return "checkpointing";
    case JobState::kStopping:
      return "stopping";
    case JobState::kFinished:
      return "finished";
    case JobState::kFailed:
      return "failed";
    case JobState::kInterrupted:
      return "interrupted";
  }
  return "?";
}

namespace {

std::string current_dir() {
  std::error_code ec;
  const auto p = std::filesystem::current_path(ec);
  return ec ? std::string() : p.string();
}

// NotFoundError unless `dir` holds checkpoint `which` (a tag, or latest: any complete one),
// listing the tags it holds (at most kListed). A tag that is there but unusable (torn, a file
// missing) is find_checkpoint's InputError, which says what is wrong with it.
void require_checkpoint(const std::string& dir, const std::string& which, const std::string& what) {
  constexpr size_t kListed = 20;
  FindOptions fo;
  fo.checksums = false;  // sizes here; the load checks the checksums
  try {
    find_checkpoint(dir, which, fo);
    return;
  } catch (const InputError&) {
    std::error_code ec;
    if (which != "latest" && std::filesystem::exists(std::filesystem::path(dir) / which, ec)) throw;
  }
  std::vector<std::string> tags;
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) {
    for (const auto& [tag, m] : list_checkpoints(dir)) tags.push_back(tag);
  }
  std::string held = "it holds none";
  if (!tags.empty()) {
    const size_t n = std::min(tags.size(), kListed);
    held = fmt::format("it holds {}, newest first: {}{}", tags.size(),
                       fmt::join(tags.begin(), tags.begin() + static_cast<std::ptrdiff_t>(n), ", "),
                       tags.size() > n ? fmt::format(", ... and {} more", tags.size() - n) : "");
  }
  throw NotFoundError(fmt::format("{}: {} in {} ({})", what,
                                  which == "latest" ? std::string("no complete checkpoint")
                                                    : fmt::format("no checkpoint '{}'", which),
                                  dir, held));
}

}  // namespace

Daemon::Daemon(DaemonOptions options) : opt_(std::move(options)) {
  ZD_CHECK(opt_.start_session != nullptr, "Daemon without a session factory");
  if (opt_.state != nullptr) recover();
}

void Daemon::recover() {
  const std::optional<Journal> journal = opt_.state->read();
  if (!journal) return;
  jobs_ = static_cast<int>(journal->jobs_started);
  if (!journal->job) return;
  const JournalJob& j = *journal->job;
  job_id_ = j.id;
  last_text_ = j.text;
  last_name_ = j.name;
  last_resume_ = j.resume;
  last_cwd_ = j.cwd;
  last_base_dir_ = j.base_dir;
  stopped_ = j.stopped;
  reason_ = j.reason;
  state_ = j.state == "finished" ? JobState::kFinished
           : j.state == "failed" ? JobState::kFailed
                                 : JobState::kInterrupted;
  if (j.base_dir.empty() && !j.cwd.empty() && j.cwd != current_dir()) {
    spdlog::warn(
        "{} was submitted while the daemon ran in {}; it runs in {} now, where the job's relative "
        "paths resolve",
        j.id, j.cwd, current_dir());
  }
  try {
    ParsedJob job =
        parse_job_text(j.text, j.name.empty() ? j.id : config::clip_input(j.name), j.base_dir);
    resolve_job(job.config, opt_.spec.world_size());
    check_supported(job.config);
    last_job_ = std::move(job.config);
  } catch (const std::exception& e) {
    recover_error_ = e.what();
    spdlog::warn("{} from the journal cannot run again: {}", j.id, recover_error_);
  }
  std::string from;
  if (last_job_) {
    recovered_.total_steps = last_job_->train.steps;
    recovered_.world_size = opt_.spec.world_size();
    recovered_.global_batch = last_job_->global_batch();
    const std::string& dir = last_job_->train.checkpoint_dir;
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_directory(dir, ec)) {
      try {
        FindOptions fo;
        fo.checksums = false;
        const FoundCheckpoint found = find_checkpoint(dir, "latest", fo);
        recovered_.step = found.manifest.progress.global_step;
        recovered_.last_checkpoint = found.tag;
        from = fmt::format("checkpoint {} (step {})", found.tag, recovered_.step);
      } catch (const std::exception&) {
        // no complete checkpoint
      }
    }
  }
  if (state_ == JobState::kInterrupted) {
    reason_ = fmt::format("the daemon running it ended without ending it (killed or crashed); {}",
                          !recover_error_.empty() ? "it cannot run again: " + recover_error_
                          : !from.empty()         ? "zeroctl resume continues it from " + from
                          : last_job_ && last_job_->train.checkpoint_dir.empty()
                              ? std::string("it has no train.checkpoint_dir: submit it again")
                              : std::string("it saved no checkpoint: submit it again"));
    stopped_ = false;
    spdlog::warn("{}: interrupted: {}", job_id_, reason_);
    std::lock_guard<std::mutex> lock(mu_);
    try {
      write_journal_locked(jobs_);
    } catch (const std::exception& e) {
      spdlog::warn("{}", e.what());
    }
  } else {
    spdlog::info("{} ({}) from the journal: {}", job_id_, last_name_, job_state_name(state_));
  }
}

void Daemon::write_journal_locked(int64_t jobs_started) const {
  if (opt_.state == nullptr) return;
  Journal j;
  j.jobs_started = jobs_started;
  if (!job_id_.empty()) {
    JournalJob o;
    o.id = job_id_;
    o.state = job_state_name(state_);
    o.reason = reason_;
    o.stopped = stopped_;
    o.name = last_name_;
    o.text = last_text_;
    o.resume = last_resume_;
    o.checkpoint_dir = last_job_ ? last_job_->train.checkpoint_dir : "";
    o.cwd = last_cwd_;
    o.base_dir = last_base_dir_;
    j.job = std::move(o);
  }
  opt_.state->write(j);
}

Daemon::~Daemon() {
  std::shared_ptr<JobControl> control;
  {
    std::lock_guard<std::mutex> lock(mu_);
    control = control_;
  }
  if (control) control->request_stop(false);
  if (thread_.joinable()) thread_.join();
}

void Daemon::changed() {
  ++version_;
  cv_.notify_all();
}

std::string Daemon::submit(const std::string& job_text, const std::string& name,
                           const std::string& resume, const std::string& base_dir) {
  refuse_one_off("submit");
  if (multi_node() && !is_master()) {
    throw PreconditionError(
        fmt::format("this daemon is node {} of {}: submit jobs to the master daemon at {}",
                    opt_.spec.node_rank, opt_.spec.nnodes, opt_.master_control));
  }
  if (!base_dir.empty() && !std::filesystem::path(base_dir).is_absolute()) {
    ZD_THROW_INPUT("base_dir \"{}\": the directory of the job's relative paths must be absolute",
                   config::clip_input(base_dir));
  }
  ParsedJob job =
      parse_job_text(job_text, name.empty() ? "submitted job" : config::clip_input(name), base_dir);
  if (base_dir.empty()) require_absolute_paths(job.config);
  resolve_job(job.config, opt_.spec.world_size());
  check_supported(job.config);
  // What the job needs from this machine, as `zerod check` and `zerod train` check it.
  check_job_environment(job.config, {.local_ranks = opt_.spec.nproc_per_node});
  for (const auto& w : job.warnings) spdlog::warn("{}: {}", job.config.source, w);
  if (!resume.empty()) {
    if (resume != "latest" && resume != "auto") validate_tag(resume);
    if (job.config.train.checkpoint_dir.empty()) {
      throw PreconditionError(
          fmt::format("resume '{}': the job has no train.checkpoint_dir", resume));
    }
    if (busy()) {  // (start() refuses too; this says so before looking for the checkpoint)
      const DaemonStatus st = status();
      throw PreconditionError(fmt::format("job {} is {}: one job at a time (stop it first)",
                                          st.job_id, job_state_name(st.state)));
    }
    if (resume != "auto") require_checkpoint(job.config.train.checkpoint_dir, resume, "resume");
  }
  start(std::move(job.config), resume, opt_.spec, job_text, name.empty() ? "submitted job" : name,
        base_dir);
  return status().job_id;
}

void Daemon::check_followers_locked() const {
  std::vector<std::string> missing;
  for (int r = 1; r < opt_.spec.nnodes; ++r)
    if (!followers_.count(r)) missing.push_back(std::to_string(r));
  if (!missing.empty()) {
    throw PreconditionError(
        fmt::format("node daemon{} {} of {} not connected (start them with zerod serve --nnodes {} "
                    "--node-rank R --master <this daemon's --listen>)",
                    missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), opt_.spec.nnodes,
                    opt_.spec.nnodes));
  }
}

void Daemon::assign_locked(const JobConfig& cfg, const std::string& resume) {
  assignment_.seq += 1;
  assignment_.job_id = fmt::format("job-{}", jobs_ + 1);  // the id start() gives it next
  assignment_.job_json = job_to_json(cfg).dump();
  assignment_.resume = resume;
  assignment_.rendezvous = opt_.rendezvous;
}

std::string Daemon::start_job(JobConfig cfg, const std::string& resume, const std::string& name) {
  ZD_CHECK(opt_.one_off, "start_job is for a one-off daemon (zerod train --listen)");
  start(std::move(cfg), resume, opt_.spec, "", name, "");
  return status().job_id;
}

void Daemon::rethrow_failure() const {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = failure_;
  }
  if (e) std::rethrow_exception(e);
}

void Daemon::refuse_one_off(const char* what) const {
  if (!opt_.one_off) return;
  throw PreconditionError(
      fmt::format("{}: this is `zerod train --listen`, which serves its own job only; run `zerod "
                  "serve` to submit jobs",
                  what));
}

std::string Daemon::resume(const std::string& tag) {
  refuse_one_off("resume");
  if (multi_node() && !is_master()) {
    throw PreconditionError(
        fmt::format("this daemon is node {} of {}: resume jobs on the master daemon at {}",
                    opt_.spec.node_rank, opt_.spec.nnodes, opt_.master_control));
  }
  const std::string which = tag.empty() ? "latest" : tag;
  JobConfig cfg;
  std::string text, name, base_dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_job_ && !recover_error_.empty()) {
      throw PreconditionError(
          fmt::format("resume: {} from the journal cannot run again: {}", job_id_, recover_error_));
    }
    if (!last_job_) throw PreconditionError("resume: no job has been submitted to this daemon");
    if (running_) {
      throw PreconditionError(fmt::format("resume: job {} is {}: one job at a time (stop it first)",
                                          job_id_, job_state_name(state_)));
    }
    cfg = *last_job_;
    text = last_text_;
    name = last_name_;
    base_dir = last_base_dir_;
  }
  if (which != "latest") validate_tag(which);
  if (cfg.train.checkpoint_dir.empty()) {
    throw PreconditionError("resume: the last job has no train.checkpoint_dir");
  }
  require_checkpoint(cfg.train.checkpoint_dir, which, "resume");
  start(std::move(cfg), which, opt_.spec, text, name, base_dir);
  return status().job_id;
}

void Daemon::start(JobConfig cfg, const std::string& resume, LaunchSpec spec,
                   const std::string& text, const std::string& name, const std::string& base_dir,
                   const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) {
    throw PreconditionError(fmt::format("job {} is {}: one job at a time (stop it first)", job_id_,
                                        job_state_name(state_)));
  }
  if (thread_.joinable()) thread_.join();  // the previous job's thread has ended
  // A master refuses while a node daemon is not following.
  if (master_of_nodes()) check_followers_locked();
  // The journal first: a job it does not record never starts (and its id is never reused).
  {
    const auto saved = std::make_tuple(job_id_, state_, reason_, stopped_, last_job_, last_text_,
                                       last_name_, last_resume_, last_cwd_, last_base_dir_);
    job_id_ = job_id.empty() ? fmt::format("job-{}", jobs_ + 1) : job_id;
    state_ = JobState::kRendezvous;
    reason_.clear();
    stopped_ = false;
    last_job_ = cfg;
    last_text_ = text;
    last_name_ = name;
    last_resume_ = resume;
    last_cwd_ = current_dir();
    last_base_dir_ = base_dir;
    try {
      write_journal_locked(jobs_ + 1);
    } catch (...) {
      std::tie(job_id_, state_, reason_, stopped_, last_job_, last_text_, last_name_, last_resume_,
               last_cwd_, last_base_dir_) = saved;
      throw;
    }
  }
  if (master_of_nodes()) assign_locked(cfg, resume);
  ++jobs_;
  recover_error_.clear();
  failure_ = nullptr;
  recovered_ = JobProgress();
  running_ = true;
  started_ = std::chrono::steady_clock::now();
  elapsed_ = 0;
  control_ = std::make_shared<JobControl>();
  control_->set_listener([this] {
    std::lock_guard<std::mutex> l(mu_);
    changed();
  });
  changed();
  if (master_of_nodes()) {  // the master hosts every job's Rendezvous
    std::tie(spec.master_host, spec.master_port) =
        parse_host_port(opt_.rendezvous, "the rendezvous address");
  }
  thread_ = std::thread(&Daemon::run, this, std::move(cfg), resume, spec, control_);
}

void Daemon::set_state(JobState s, const std::string& reason, bool stopped) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
  if (!reason.empty()) reason_ = reason;
  stopped_ = stopped;
  if (s == JobState::kFinished || s == JobState::kFailed) {
    running_ = false;
    elapsed_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    try {
      write_journal_locked(jobs_);
    } catch (const std::exception& e) {
      spdlog::warn("{}: {}", job_id_, e.what());
    }
  }
  changed();
}

void Daemon::run(JobConfig cfg, std::string resume, LaunchSpec spec,
                 std::shared_ptr<JobControl> control) {
  const std::string id = status().job_id;
  spdlog::info("{}: starting ({} steps, world size {}){}", id, cfg.train.steps,
               opt_.spec.world_size(), resume.empty() ? "" : " from checkpoint " + resume);
  try {
    JobOutcome outcome;
    {
      std::unique_ptr<NodeSession> session = opt_.start_session(spec, cfg);
      set_state(JobState::kRunning);
      RunJobOptions ro;
      ro.log_steps = opt_.log_steps;
      ro.resume = resume;
      ro.control = control.get();
      ro.metrics = opt_.metrics;
      ro.threads_per_rank = opt_.threads_per_rank;
      ro.local_processes = spec.local_processes;
      ro.local_process = spec.local_process;
      outcome = run_job(cfg, *session, ro);
      session->leave("");
    }  // the session (and on the master the job's Rendezvous server) is gone: the next job
       // may bind its port
    control->job_ended("the job ended before the checkpoint was saved");
    spdlog::info("{}: {}", id, outcome.stopped ? "stopped" : "finished");
    set_state(JobState::kFinished, "", outcome.stopped);
  } catch (const std::exception& e) {
    control->job_ended(fmt::format("the job failed: {}", e.what()));
    spdlog::error("{}: failed: {}", id, e.what());
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = std::current_exception();
    }
    set_state(JobState::kFailed, e.what());
  }
}

JobControl::SaveResult Daemon::save_checkpoint(const std::string& tag,
                                               std::chrono::milliseconds timeout, bool overwrite) {
  std::shared_ptr<JobControl> control;
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_ || state_ == JobState::kRendezvous) {
      throw PreconditionError(
          fmt::format("checkpoint save: no job is running (state {})", job_state_name(state_)));
    }
    if (last_job_->train.checkpoint_dir.empty()) {
      throw PreconditionError(
          fmt::format("checkpoint save: job {} has no train.checkpoint_dir", job_id_));
    }
    control = control_;
    dir = last_job_->train.checkpoint_dir;
  }
  if (!tag.empty()) validate_tag(tag);
  std::error_code ec;
  if (!tag.empty() && !overwrite && std::filesystem::exists(std::filesystem::path(dir) / tag, ec)) {
    throw AlreadyExistsError(fmt::format(
        "checkpoint save: {} already holds a checkpoint '{}' (choose another tag, or replace it: "
        "zeroctl checkpoint save --tag {} --overwrite)",
        dir, tag, tag));
  }
  if (control->stop_pending()) throw PreconditionError("checkpoint save: the job is stopping");
  int64_t ticket;
  try {
    ticket = control->request_save(tag);
  } catch (const InputError& e) {
    throw PreconditionError(e.what());  // another save is pending
  }
  const auto r = control->wait_save(ticket, timeout);
  if (!r)
    ZD_THROW_KIND(ErrorKind::kPeerLost, "checkpoint save: not done after {} ms", timeout.count());
  if (!r->error.empty()) {
    if (r->job_ended) throw PreconditionError(r->error);
    ZD_THROW_INPUT("checkpoint save: {}", r->error);
  }
  return *r;
}

std::string Daemon::stop(bool checkpoint) {
  std::shared_ptr<JobControl> control;
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) {
      throw PreconditionError(
          fmt::format("stop: no job is running (state {})", job_state_name(state_)));
    }
    if (checkpoint && last_job_->train.checkpoint_dir.empty()) {
      throw PreconditionError(
          fmt::format("stop --checkpoint: job {} has no train.checkpoint_dir", job_id_));
    }
    control = control_;
    id = job_id_;
  }
  control->request_stop(checkpoint);
  return id;
}

std::vector<CheckpointListing> Daemon::list_checkpoints(std::string* dir) const {
  std::string d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_job_)
      throw PreconditionError("checkpoint list: no job has been submitted to this daemon");
    d = last_job_->train.checkpoint_dir;
  }
  if (d.empty()) throw PreconditionError("checkpoint list: the job has no train.checkpoint_dir");
  if (dir) *dir = d;
  std::vector<CheckpointListing> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(d, ec)) return out;
  const std::string latest = read_latest(d).value_or("");
  for (auto& [tag, m] : zerod::list_checkpoints(d))
    out.push_back({tag, tag == latest, std::move(m)});
  return out;
}

void Daemon::follow_begin(int node_rank, int nnodes, int nproc_per_node) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!master_of_nodes()) {
    throw PreconditionError("FollowJobs: this daemon is not the master of several nodes");
  }
  if (node_rank < 1 || node_rank >= opt_.spec.nnodes) {
    throw PreconditionError(
        fmt::format("FollowJobs: node rank {} is outside 1..{}", node_rank, opt_.spec.nnodes - 1));
  }
  if (nnodes != opt_.spec.nnodes || nproc_per_node != opt_.spec.nproc_per_node) {
    throw PreconditionError(
        fmt::format("FollowJobs: node {} has --nnodes {} --nproc-per-node {}, the master {} and {}",
                    node_rank, nnodes, nproc_per_node, opt_.spec.nnodes, opt_.spec.nproc_per_node));
  }
  if (!followers_.insert(node_rank).second) {
    throw PreconditionError(
        fmt::format("FollowJobs: node rank {} is already following", node_rank));
  }
  spdlog::info("node daemon {} of {} is following", node_rank, opt_.spec.nnodes);
  changed();
}

void Daemon::follow_end(int node_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (followers_.erase(node_rank)) spdlog::warn("node daemon {} stopped following", node_rank);
  changed();
}

uint64_t Daemon::assignment_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return assignment_.seq;
}

std::optional<JobAssignment> Daemon::wait_assignment(uint64_t seen,
                                                     std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return assignment_.seq != seen; })) return std::nullopt;
  return assignment_;
}

void Daemon::run_assignment(const JobAssignment& a) {
  wait_idle(std::chrono::minutes(10));  // the previous job's last steps and leave
  const std::string name = "job " + a.job_id + " from the master";
  ParsedJob job = parse_job_text(a.job_json, name);
  resolve_job(job.config, opt_.spec.world_size());
  LaunchSpec spec = opt_.spec;
  std::tie(spec.master_host, spec.master_port) =
      parse_host_port(a.rendezvous, "the rendezvous address of " + a.job_id);
  start(std::move(job.config), a.resume, spec, a.job_json, name, "", a.job_id);
}

DaemonStatus Daemon::status() const {
  std::shared_ptr<JobControl> control;
  DaemonStatus s;
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.state = state_;
    s.job_id = job_id_;
    s.job_name = last_name_;
    if (last_job_) dir = last_job_->train.checkpoint_dir;
    s.reason = reason_;
    s.stopped = stopped_;
    s.elapsed_seconds =
        running_
            ? std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()
            : elapsed_;
    control = control_;
    if (!control) s.progress = recovered_;
  }
  if (control) {
    s.progress = control->progress();
    if (s.state == JobState::kRunning && control->stop_pending())
      s.state = JobState::kStopping;
    else if (s.state == JobState::kRunning && control->save_pending())
      s.state = JobState::kCheckpointing;
  }
  // The newest complete checkpoint on disk, whoever saved it (`latest` is replaced only after a
  // save is committed and retention never removes the one it names).
  if (!dir.empty()) {
    const std::optional<std::string> latest = read_latest(dir);
    std::error_code ec;
    s.progress.last_checkpoint =
        latest && std::filesystem::is_directory(std::filesystem::path(dir) / *latest, ec) ? *latest
                                                                                          : "";
  }
  return s;
}

uint64_t Daemon::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

uint64_t Daemon::wait_change(uint64_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return version_ != seen; });
  return version_;
}

bool Daemon::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

bool Daemon::wait_idle(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return !running_; });
}

}  // namespace zerod
