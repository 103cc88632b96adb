// Offload preflight (ZeRO-Infinity): before a rank allocates its model states, where they will
// go (bytes per rank in the compute pool, in host memory and on disk), and with NVMe offload a
// check that nvme_path is a writable folder with room for the swap files of this process's
// ranks. A failure is an InputError (exit 2) with the numbers, before anything is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/job_config.h"
#include "engine/runtime/rank_context.h"
#include "model/layout.h"
#include "offload/state_swapper.h"

namespace zerod {

struct OffloadPlan {
  int64_t device = 0;  // model states in the compute pool
  int64_t host = 0;    // offloaded states in host memory, or NVMe swap buffers
  int64_t disk = 0;    // NVMe swap files (optimizer states and parameters)
  int64_t optimizer_disk = 0, param_disk = 0;
  std::string text() const;  // "device X MiB, host Y MiB, disk Z MiB per rank"
};

// Where rank `rank` of this process keeps its optimizer states / parameters under nvme_path:
// zerod-HOST-PID-rankR.optimizer.swp / .params.swp.
std::string optimizer_swap_path(const std::string& nvme_path, int rank);
std::string param_swap_path(const std::string& nvme_path, int rank);
// The swapper settings of a job: sub_group_size, offload_optimizer's buffer_count, pipeline_*,
// pin_memory, and the aio section.
SwapOptions swap_options(const JobConfig& cfg);
// The bytes of one rank of `world` for this job's ZeRO stage and offload settings, with compute
// elements of `elem_bytes` as the backend stores them (2 for bf16/fp16 on a GPU; 4 on the CPU,
// which keeps every dtype in fp32 arrays).
OffloadPlan plan_offload(const JobConfig& cfg, const ParamLayout& layout, int world,
                         int64_t elem_bytes);
// Removes the swap files in nvme_path that processes of this host which no longer exist left
// behind (killed runs); returns their paths. Other hosts' files (a shared folder) are left.
std::vector<std::string> remove_stale_swap_files(const std::string& nvme_path);
// "" when nvme_path (named `what` in messages) is an existing folder this process can create
// files in, else the problem (a probe file is created and removed; nothing else is touched).
std::string nvme_path_problem(const std::string& nvme_path, const std::string& what);
// Checks nvme_path (named `what` in messages, e.g. "zero_optimization.offload_optimizer.
// nvme_path") for `bytes` of swap files: "" when fine, else the problem.
std::string check_nvme_path(const std::string& nvme_path, int64_t bytes, const std::string& what);
// Runs the checks on every rank, collectively (every rank throws the same InputError when any
// rank's check fails); the leader logs the plan.
void offload_preflight(const JobConfig& cfg, const RankContext& ctx, const ParamLayout& layout,
                       int64_t elem_bytes);

}  // namespace zerod
