// Where a rank sits in the job: its global and local rank, and its communicator.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/peer_monitor.h"
#include "comm/store.h"

namespace zerod {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // The zerod processes on this machine and this one's index (launch.h): local rank r of
  // process p uses GPU p x local_world_size + r when the process sees every process's GPUs.
  int local_processes = 1;
  int local_process = 0;
  Communicator* comm = nullptr;  // required when world_size > 1
  // For communicators the rank makes itself (NCCL on GPUs): the run's rendezvous store (keys
  // already namespaced for this run), the collective timeout and the peer monitor. The store is
  // null in a world of one.
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{300000};
  std::shared_ptr<PeerMonitor> monitor;
  // Where this rank's Gloo communicators listen (the world's, and the sub-groups' it makes).
  std::string bind_address = "127.0.0.1";
};

}  // namespace zerod
