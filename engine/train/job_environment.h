// What a resolved job needs from the machine it runs on, checked before anything starts: one
// function for `zerod check`, `zerod train` (before the rendezvous) and a job submitted to the
// daemon (zerod serve), so the three agree.
//
//   data.train, data.val          every glob matches at least one file
//   model.init_from               a file, or a directory with model.safetensors (or
//                                 model.safetensors.index.json and every shard it names)
//   train.device                  "cuda": this zerod has CUDA and sees a GPU (enough GPUs for the
//                                 local ranks, when known)
//   zero_optimization.offload_*.nvme_path
//                                 with device "nvme": an existing folder this process can write
//   train.checkpoint_dir          writable where it is or would be created (nothing is created)
//
// Every problem is reported at once in a ConfigError (bad input, exit code 2), each line naming
// its JSON key. Nothing here reads the files' contents (the daemon's errors never quote them):
// shards, weights and room on the disk are checked when the ranks open them.
#pragma once

#include "engine/config/job_config.h"

namespace zerod {

struct JobEnvironmentOptions {
  int local_ranks = 0;  // ranks this process runs (the GPU count check); 0: unknown, not checked
};

void check_job_environment(const JobConfig& cfg, const JobEnvironmentOptions& options = {});

}  // namespace zerod
