// The Control service of proto/zerod.proto over a Daemon: errors become status codes
// (ConfigError/InputError -> INVALID_ARGUMENT with the messages `zerod check` prints,
// PreconditionError -> FAILED_PRECONDITION, a save that does not finish in time ->
// DEADLINE_EXCEEDED).
#pragma once

#include "engine/control/daemon.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class ControlService final : public v1::Control::Service {
 public:
  // token: every call must carry "authorization: Bearer <token>" (empty: no check).
  ControlService(Daemon& daemon, std::string token) : daemon_(daemon), token_(std::move(token)) {}
  // Ends every WatchStatus stream (server shutdown).
  void shutdown();

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::JobStatus*) override;
  grpc::Status WatchStatus(grpc::ServerContext*, const v1::WatchStatusRequest*,
                           grpc::ServerWriter<v1::JobStatus>*) override;
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
};

// The daemon's status as the proto message.
void fill_status(const DaemonStatus& s, v1::JobStatus* out);

}  // namespace zerod
