#include "engine/train/job_control.h"

#include "core/error.h"

namespace zerod {

int64_t JobControl::request_save(const std::string& tag) {
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (save_) ZD_THROW_INPUT("a checkpoint save is already pending");
    save_ = true;
    tag_ = tag;
    ticket = pending_ticket_ = next_ticket_++;
  }
  notify();
  return ticket;
}

std::optional<JobControl::SaveResult> JobControl::wait_save(int64_t ticket,
                                                            std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return results_.count(ticket) > 0; })) return std::nullopt;
  SaveResult r = results_[ticket];
  results_.erase(ticket);
  return r;
}

void JobControl::request_stop(bool checkpoint) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stop_checkpoint_ = stop_checkpoint_ || checkpoint;
  }
  notify();
}

bool JobControl::save_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return save_ || taken_ticket_ != 0;
}

bool JobControl::stop_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

JobProgress JobControl::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

void JobControl::set_listener(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(f);
}

void JobControl::notify() {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    f = listener_;
  }
  cv_.notify_all();
  if (f) f();
}

void JobControl::job_ended(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t t : {pending_ticket_, taken_ticket_}) {
      if (t != 0 && results_.count(t) == 0) results_[t] = SaveResult{"", 0, why, true};
    }
    save_ = false;
    pending_ticket_ = taken_ticket_ = 0;
  }
  notify();
}

JobControl::Command JobControl::take() {
  std::lock_guard<std::mutex> lock(mu_);
  Command c;
  if (save_) {
    c.save = true;
    c.tag = tag_;
    save_ = false;
    taken_ticket_ = pending_ticket_;
    pending_ticket_ = 0;
  }
  c.stop = stop_;
  c.stop_checkpoint = stop_checkpoint_;
  return c;  // a stop stays pending: every later boundary offers it again (harmless)
}

void JobControl::set_world(int world_size, int64_t total_steps, int64_t global_batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.world_size = world_size;
    progress_.total_steps = total_steps;
    progress_.global_batch = global_batch;
  }
  notify();
}

void JobControl::on_step(int rank, const StepMetrics& m, RankMemoryUse mem) {
  bool reporter = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.memory[rank] = mem;
    // The lowest rank of this process reports the step (global rank 0 on the master node).
    reporter = rank == progress_.memory.begin()->first;
    if (reporter) {
      progress_.step = m.step;
      progress_.last = m;
      if (m.val_loss) progress_.val_loss = m.val_loss;
      // An exponential average of the step time (ETA), started at the first step.
      progress_.seconds_per_step = progress_.seconds_per_step == 0
                                       ? m.seconds
                                       : 0.8 * progress_.seconds_per_step + 0.2 * m.seconds;
    }
  }
  if (reporter) notify();
}

void JobControl::on_saved(const std::string& tag, int64_t step, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error.empty()) progress_.last_checkpoint = tag;
    if (taken_ticket_ != 0) {
      results_[taken_ticket_] = SaveResult{tag, step, error};
      taken_ticket_ = 0;
    }
  }
  notify();
}

}  // namespace zerod
