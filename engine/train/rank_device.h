// Where a rank computes (train.device): the backend of its kernels and, on GPUs with several
// ranks, the communicator of its device tensors.
//
// cpu:  the CPU backend; every collective goes through the rank's (Gloo) communicator.
// cuda: local rank r runs on GPU r of this process (CUDA_VISIBLE_DEVICES selects them); when a
//       launcher started several zerods on the machine and each sees all their GPUs, process
//       p's rank r runs on GPU p x nproc-per-node + r (local_rank_gpu in engine/runtime/launch.h);
//       with train.device_comm gloo, ranks beyond the GPUs share them (GPU index mod the GPUs).
//       When the ranks exchange device tensors over NCCL (nccl_between_ranks: a data-parallel
//       job with train.device_comm auto, or nccl), an NCCL communicator is created for the ZeRO
//       engine's tensors (gradient reductions, weight gathers, on device memory, ordered against
//       the backend's stream), bootstrapped through the rendezvous store under "nccl/"; the
//       rank's Gloo communicator keeps the host-side traffic (losses, checkpoints, stop
//       requests). Otherwise device_comm is null and the trainer moves device tensors through
//       host staging over the process groups' Gloo communicators (Trainer::device_tensors).
// A CUDA job on a zerod built without CUDA (or NCCL, when the ranks would use it), or with fewer
// GPUs than local ranks (unless train.device_comm is gloo), is an InputError (exit 2) that says so.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "engine/config/job_config.h"
#include "engine/runtime/rank_context.h"
#include "kernels/backend.h"

namespace zerod {

struct RankDevice {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> device_comm;  // NCCL, when nccl_between_ranks (else null)
};

RankDevice make_rank_device(const JobConfig& cfg, const RankContext& ctx);

// "" when this process can run `local_ranks` ranks of cfg on its train.device (always for "cpu"),
// else the problem, naming train.device: a build without CUDA (or NCCL, for several ranks), no
// visible GPU, fewer GPUs than local ranks (local_ranks 0: not checked).
std::string train_device_problem(const JobConfig& cfg, int local_ranks);

// The GPUs this process sees (0 without CUDA, without a driver or without a device).
int visible_gpus();

}  // namespace zerod
