#include "engine/control/grpc/follower.h"

#include "core/log.h"
#include "zerod.grpc.pb.h"

namespace zerod {

Follower::Follower(Daemon& daemon, std::string master_control, ClientSecurity security,
                   int node_rank, int nnodes, int nproc_per_node)
    : daemon_(daemon),
      master_(std::move(master_control)),
      sec_(std::move(security)),
      node_rank_(node_rank),
      nnodes_(nnodes),
      nproc_(nproc_per_node) {
  thread_ = std::thread(&Follower::loop, this);
}

Follower::~Follower() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_) ctx_->TryCancel();
  }
  thread_.join();
}

void Follower::loop() {
  auto channel = grpc::CreateChannel(master_, client_credentials(sec_));
  auto stub = v1::Control::NewStub(channel);
  std::string last_error;
  while (!stop_) {
    grpc::ClientContext ctx;
    add_auth_metadata(ctx, sec_.token);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx_ = &ctx;
    }
    v1::FollowJobsRequest req;
    req.set_node_rank(node_rank_);
    req.set_nnodes(nnodes_);
    req.set_nproc_per_node(nproc_);
    auto reader = stub->FollowJobs(&ctx, req);
    v1::JobAssignment a;
    while (reader->Read(&a)) {
      if (!connected_) {
        connected_ = true;
        last_error.clear();
        spdlog::info("following the master daemon at {} as node {} of {}", master_, node_rank_,
                     nnodes_);
      }
      if (a.job_id().empty()) continue;
      JobAssignment job;
      job.job_id = a.job_id();
      job.job_json = a.job_json();
      job.resume = a.resume();
      job.rendezvous = a.rendezvous();
      try {
        daemon_.run_assignment(job);
      } catch (const std::exception& e) {
        spdlog::error("{} from the master: {}", job.job_id, e.what());
      }
    }
    const grpc::Status st = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx_ = nullptr;
    }
    if (connected_) spdlog::warn("lost the master daemon at {}: {}", master_, st.error_message());
    connected_ = false;
    if (!st.ok() && st.error_message() != last_error && !stop_) {
      last_error = st.error_message();
      if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
          st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        spdlog::error("the master daemon at {} refused this node: {}", master_, last_error);
      }
    }
    for (int i = 0; i < 10 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace zerod
