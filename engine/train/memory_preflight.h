// The host-memory preflight of a CPU job (issue: a model too large for the machine grew until
// the kernel's OOM killer ended it). Before anything large is allocated, the planner's per-rank
// bytes (model states, activations, buffers: engine/plan/planner.h, within 10% of what runs
// measure) times the ranks of this process are compared with what the process may use: the
// machine's MemAvailable, the cgroup's memory.max minus what the cgroup already uses, and
// train.memory_limit (zerod train --memory-limit), whichever is smallest. A job that does not
// fit is refused with InputError (exit 2) giving both numbers and the nearest settings that fit
// (ZeRO stage / NVMe offload, a smaller micro-batch with more accumulation, activation
// checkpointing).
#pragma once

#include <cstdint>
#include <string>

#include "engine/config/job_config.h"
#include "engine/plan/planner.h"
#include "model/spec.h"

namespace zerod {

struct HostMemory {
  int64_t bytes = 0;   // what this process may still allocate
  std::string source;  // "MemAvailable", "cgroup memory.max", "train.memory_limit"
};
// The smallest of the machine's available memory, the cgroup's room and `limit` (0: none).
HostMemory host_memory_available(int64_t limit);

// The planner's request for this job's shape, world, parallelism, micro-batch and activation
// checkpointing, every offload choice considered (compute elements `elem_bytes` wide).
PlanRequest job_plan_request(const JobConfig& cfg, const ModelSpec& spec, int elem_bytes);
// The row of `plan` that is this job's ZeRO stage and offload settings (null: a combination the
// planner does not model). Its device + host bytes are one rank's predicted memory.
const PlanRow* job_plan_row(const Plan& plan, const JobConfig& cfg);

// Throws InputError when `local_ranks` ranks of this job would need more host memory than
// `available` (each rank's compute elements `elem_bytes` wide: 4 on the CPU backend).
void host_memory_preflight(const JobConfig& cfg, const ModelSpec& spec, int local_ranks,
                           int elem_bytes, const HostMemory& available);

}  // namespace zerod
