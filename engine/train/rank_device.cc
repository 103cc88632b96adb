#include "engine/train/rank_device.h"

#include "core/error.h"
#include "engine/runtime/launch.h"

#if defined(ZEROD_HAVE_CUDA)
#include "kernels/cuda/cast.h"
#include "kernels/cuda/cuda_backend.h"
#endif
#if defined(ZEROD_HAVE_NCCL)
#include "comm/nccl/nccl_communicator.h"
#endif

namespace zerod {

int visible_gpus() {
#if defined(ZEROD_HAVE_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string train_device_problem(const JobConfig& cfg, int local_ranks) {
  if (cfg.train.device != TrainDevice::kCuda) return "";
#if !defined(ZEROD_HAVE_CUDA)
  (void)local_ranks;
  return "train.device: \"cuda\", but this zerod was built without CUDA (nvcc was not found when "
         "it was configured); rebuild on a machine with the CUDA toolkit, or use \"cpu\"";
#else
  const int gpus = visible_gpus();
  if (gpus == 0) {
    return "train.device: \"cuda\", but this process sees no GPU (no NVIDIA driver or device; "
           "CUDA_VISIBLE_DEVICES?)";
  }
  if (local_ranks > gpus && cfg.train.device_comm != DeviceComm::kGloo) {
    return fmt::format(
        "train.device: \"cuda\" with {} local ranks, but this process sees {} GPU{} (one rank "
        "per GPU: --nproc-per-node {} at most, or train.device_comm \"gloo\" to share them)",
        local_ranks, gpus, gpus == 1 ? "" : "s", gpus);
  }
#if !defined(ZEROD_HAVE_NCCL)
  if (nccl_between_ranks(cfg)) {
    return fmt::format(
        "train.device: \"cuda\" with {} ranks and train.device_comm \"{}\" needs NCCL, and this "
        "zerod was built without it (nccl.h / libnccl not found when it was configured); "
        "train.device_comm \"gloo\" runs without it",
        cfg.world_size, device_comm_name(cfg.train.device_comm));
  }
#endif
  return "";
#endif
}

RankDevice make_rank_device(const JobConfig& cfg, const RankContext& ctx) {
  RankDevice d;
  if (cfg.train.device == TrainDevice::kCpu) {
    d.backend = make_cpu_backend(cfg.compute_dtype());
    return d;
  }
  // (Checked against the local world size, so every rank fails the same way at once instead of
  // the others waiting for the ranks without a GPU at the NCCL rendezvous.)
  if (std::string problem = train_device_problem(cfg, ctx.local_world_size); !problem.empty())
    ZD_THROW_INPUT("{}", problem);
#if defined(ZEROD_HAVE_CUDA)
  const int gpus = visible_gpus();
  // (train.device_comm gloo: ranks may share GPUs, round-robin.)
  const int gpu = local_rank_gpu(ctx.local_process, ctx.local_processes, ctx.local_world_size,
                                 ctx.local_rank, gpus) %
                  gpus;
  d.backend = make_cuda_backend(cfg.compute_dtype(), gpu);
  if (ctx.world_size > 1 && nccl_between_ranks(cfg)) {
#if defined(ZEROD_HAVE_NCCL)
    ZD_CHECK(ctx.store != nullptr, "rank {}: a GPU job of {} ranks needs the rendezvous store",
             ctx.rank, ctx.world_size);
    NcclOptions o;
    o.rank = ctx.rank;
    o.size = ctx.world_size;
    o.device = gpu;
    o.store = ctx.store;
    o.key_prefix = "nccl";
    o.timeout = ctx.timeout;
    o.compute_stream = static_cast<cudaStream_t>(d.backend->native_stream());
    o.monitor = ctx.monitor;
    d.device_comm = make_nccl_communicator(o);
#endif
  }
#endif
  return d;
}

}  // namespace zerod
