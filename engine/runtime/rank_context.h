// Where a rank sits in the job: its global and local rank, and its communicator.
#pragma once

#include "comm/communicator.h"

namespace zerod {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  Communicator* comm = nullptr;  // required when world_size > 1
};

}  // namespace zerod
