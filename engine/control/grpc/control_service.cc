#include "engine/control/grpc/control_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "engine/config/config_error.h"
#include "engine/runtime/grpc/auth.h"

namespace zerod {

namespace {

// A status message travels in the trailing metadata (percent-encoded: up to 3 bytes a byte),
// which clients refuse past 8 KiB, reporting RESOURCE_EXHAUSTED instead of the real code: a long
// one (a job with thousands of problems) is cut at a line, saying how much was left out.
std::string status_message(std::string_view m) {
  constexpr size_t kMax = 2048;
  if (m.size() <= kMax) return std::string(m);
  size_t cut = m.rfind('\n', kMax);
  if (cut == std::string_view::npos || cut == 0) {
    cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;
  }
  const size_t lines = static_cast<size_t>(std::count(m.begin() + cut, m.end(), '\n'));
  return fmt::format("{}\n... ({} more line{}, {} bytes in all)", m.substr(0, cut),
                     lines == 0 ? 1 : lines, lines > 1 ? "s" : "", m.size());
}

// Checks the token, then runs f, turning zerod errors into status codes.
template <class F>
grpc::Status guarded(const grpc::ServerContext* ctx, const std::string& token, F&& f) {
  if (grpc::Status st = check_token(*ctx, token); !st.ok()) return st;
  try {
    f();
    return grpc::Status::OK;
  } catch (const ConfigError& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, status_message(e.what())};
  } catch (const PreconditionError& e) {
    return {grpc::StatusCode::FAILED_PRECONDITION, status_message(e.what())};
  } catch (const NotFoundError& e) {
    return {grpc::StatusCode::NOT_FOUND, status_message(e.what())};
  } catch (const AlreadyExistsError& e) {
    return {grpc::StatusCode::ALREADY_EXISTS, status_message(e.what())};
  } catch (const InputError& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, status_message(e.what())};
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kPeerLost) {
      return {grpc::StatusCode::DEADLINE_EXCEEDED, status_message(e.what())};
    }
    return {grpc::StatusCode::INTERNAL, status_message(e.what())};
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INTERNAL, status_message(e.what())};
  }
}

v1::JobState to_proto(JobState s) {
  switch (s) {
    case JobState::kIdle:
      return v1::JOB_STATE_IDLE;
    case JobState::kRendezvous:
      return v1::JOB_STATE_RENDEZVOUS;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kCheckpointing:
      return v1::JOB_STATE_CHECKPOINTING;
    case JobState::kStopping:
      return v1::JOB_STATE_STOPPING;
    case JobState::kFinished:
      return v1::JOB_STATE_FINISHED;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kInterrupted:
      return v1::JOB_STATE_INTERRUPTED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

bool ended(JobState s) {
  return s == JobState::kFinished || s == JobState::kFailed || s == JobState::kInterrupted;
}

}  // namespace

void fill_status(const DaemonStatus& s, v1::JobStatus* out) {
  out->set_state(to_proto(s.state));
  out->set_job_id(s.job_id);
  out->set_job_name(s.job_name);
  out->set_reason(s.reason);
  out->set_stopped(s.stopped);
  out->set_elapsed_seconds(s.elapsed_seconds);
  const JobProgress& p = s.progress;
  out->set_step(p.step);
  out->set_total_steps(p.total_steps);
  out->set_world_size(p.world_size);
  out->set_last_checkpoint(p.last_checkpoint);
  out->set_samples_seen(p.samples_seen());
  if (p.val_loss) out->set_val_loss(*p.val_loss);
  if (p.last) {
    out->set_loss(p.last->loss);
    out->set_lr(p.last->lr);
    out->set_tokens_per_s(p.last->tokens_per_s);
    out->set_mfu(p.last->mfu);
    out->set_grad_norm(p.last->grad_norm);
    out->set_loss_scale(p.last->loss_scale);
  }
  if (!ended(s.state) && p.total_steps > p.step) {
    out->set_eta_seconds(static_cast<double>(p.total_steps - p.step) * p.seconds_per_step);
  }
  for (const auto& [rank, m] : p.memory) {
    v1::RankMemory* rm = out->add_memory();
    rm->set_rank(rank);
    rm->set_current_bytes(m.current);
    rm->set_peak_bytes(m.peak);
  }
}

void ControlService::shutdown() {
  shutting_down_ = true;
  watchers_.shutdown();
}

grpc::Status ControlService::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                       v1::SubmitJobResponse* resp) {
  return guarded(ctx, token_, [&] {
    resp->set_job_id(daemon_.submit(req->job_json(), req->name(), req->resume(), req->base_dir()));
  });
}

grpc::Status ControlService::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                       v1::JobStatus* resp) {
  return guarded(ctx, token_, [&] { fill_status(daemon_.status(), resp); });
}

grpc::ServerWriteReactor<v1::JobStatus>* ControlService::WatchStatus(
    grpc::CallbackServerContext* ctx, const v1::WatchStatusRequest* req) {
  return watchers_.open(ctx, req, check_token(*ctx, token_));
}

grpc::Status ControlService::SaveCheckpoint(grpc::ServerContext* ctx,
                                            const v1::SaveCheckpointRequest* req,
                                            v1::SaveCheckpointResponse* resp) {
  // As long as the client waits (its deadline), at most an hour.
  auto timeout = std::chrono::milliseconds(3600 * 1000);
  const auto deadline = ctx->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    timeout = std::min(timeout, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::system_clock::now()));
  }
  return guarded(ctx, token_, [&] {
    const JobControl::SaveResult r = daemon_.save_checkpoint(req->tag(), timeout, req->overwrite());
    resp->set_tag(r.tag);
    resp->set_step(r.step);
  });
}

grpc::Status ControlService::ListCheckpoints(grpc::ServerContext* ctx,
                                             const v1::ListCheckpointsRequest*,
                                             v1::ListCheckpointsResponse* resp) {
  return guarded(ctx, token_, [&] {
    std::string dir;
    for (const CheckpointListing& c : daemon_.list_checkpoints(&dir)) {
      v1::CheckpointInfo* ci = resp->add_checkpoints();
      ci->set_tag(c.tag);
      ci->set_latest(c.latest);
      ci->set_global_step(c.manifest.progress.global_step);
      ci->set_world_size(c.manifest.world_size);
      ci->set_zero_stage(c.manifest.zero_stage);
      ci->set_bytes(c.manifest.total_bytes());
      ci->set_created(c.manifest.created);
    }
    resp->set_checkpoint_dir(dir);
  });
}

grpc::Status ControlService::Resume(grpc::ServerContext* ctx, const v1::ResumeRequest* req,
                                    v1::ResumeResponse* resp) {
  return guarded(ctx, token_, [&] { resp->set_job_id(daemon_.resume(req->tag())); });
}

grpc::Status ControlService::Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                                  v1::StopResponse* resp) {
  return guarded(ctx, token_, [&] { resp->set_job_id(daemon_.stop(req->checkpoint())); });
}

grpc::Status ControlService::FollowJobs(grpc::ServerContext* ctx, const v1::FollowJobsRequest* req,
                                        grpc::ServerWriter<v1::JobAssignment>* writer) {
  const int node = req->node_rank();
  if (grpc::Status st = guarded(
          ctx, token_, [&] { daemon_.follow_begin(node, req->nnodes(), req->nproc_per_node()); });
      !st.ok()) {
    return st;
  }
  // A first, empty assignment says the node is accepted; then each new job (not one that was
  // already running when the node connected: it could not join that one any more).
  uint64_t seen = daemon_.assignment_seq();
  bool open = writer->Write(v1::JobAssignment());
  while (open && !ctx->IsCancelled() && !shutting_down_) {
    const auto a = daemon_.wait_assignment(seen, std::chrono::milliseconds(100));
    if (!a) continue;
    seen = a->seq;
    v1::JobAssignment msg;
    msg.set_job_id(a->job_id);
    msg.set_job_json(a->job_json);
    msg.set_resume(a->resume);
    msg.set_rendezvous(a->rendezvous);
    open = writer->Write(msg);
  }
  daemon_.follow_end(node);
  if (shutting_down_) return {grpc::StatusCode::UNAVAILABLE, "the master daemon is shutting down"};
  return grpc::Status::OK;
}

}  // namespace zerod
