// The Control service of proto/zerod.proto over a Daemon: errors become status codes
// (ConfigError/InputError -> INVALID_ARGUMENT with the messages `zerod check` prints,
// PreconditionError -> FAILED_PRECONDITION, NotFoundError -> NOT_FOUND, AlreadyExistsError ->
// ALREADY_EXISTS, a save that does not finish in time ->
// DEADLINE_EXCEEDED). WatchStatus is served with gRPC's callback API (status_watchers.h: no
// thread per stream, at most max_watchers streams); the other methods are synchronous.
#pragma once

#include <atomic>

#include "engine/control/daemon.h"
#include "engine/control/grpc/status_watchers.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class ControlService final
    : public v1::Control::WithCallbackMethod_WatchStatus<v1::Control::Service> {
 public:
  static constexpr int kDefaultMaxWatchers = 256;
  // token: every call must carry "authorization: Bearer <token>" (empty: no check).
  ControlService(Daemon& daemon, std::string token, int max_watchers = kDefaultMaxWatchers)
      : daemon_(daemon), token_(std::move(token)), watchers_(daemon, max_watchers) {}
  // Ends every WatchStatus and FollowJobs stream (server shutdown).
  void shutdown();

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::JobStatus*) override;
  grpc::ServerWriteReactor<v1::JobStatus>* WatchStatus(grpc::CallbackServerContext*,
                                                       const v1::WatchStatusRequest*) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext*, const v1::SaveCheckpointRequest*,
                              v1::SaveCheckpointResponse*) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest*,
                               v1::ListCheckpointsResponse*) override;
  grpc::Status Resume(grpc::ServerContext*, const v1::ResumeRequest*, v1::ResumeResponse*) override;
  grpc::Status Stop(grpc::ServerContext*, const v1::StopRequest*, v1::StopResponse*) override;
  grpc::Status FollowJobs(grpc::ServerContext*, const v1::FollowJobsRequest*,
                          grpc::ServerWriter<v1::JobAssignment>*) override;

 private:
  Daemon& daemon_;
  std::string token_;
  std::atomic<bool> shutting_down_{false};
  StatusWatchers watchers_;
};

// The daemon's status as the proto message.
void fill_status(const DaemonStatus& s, v1::JobStatus* out);

}  // namespace zerod
