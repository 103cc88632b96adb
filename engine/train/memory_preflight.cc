#include "engine/train/memory_preflight.h"

#include "engine/plan/pipeline_plan.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "engine/plan/planner.h"

namespace zerod {

namespace {
// A number from a file (cgroup v2 "max" and unreadable files: -1).
int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (...) {
    return -1;
  }
}

int64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}
}  // namespace

HostMemory host_memory_available(int64_t limit) {
  HostMemory m;
  m.bytes = mem_available();
  m.source = "MemAvailable of /proc/meminfo";
  auto consider = [&](int64_t bytes, const std::string& source) {
    if (bytes < 0) return;
    if (m.bytes < 0 || bytes < m.bytes) {
      m.bytes = bytes;
      m.source = source;
    }
  };
  // cgroup v2, then v1 (a v1 "no limit" reads as a huge number and never wins).
  const int64_t max2 = read_number("/sys/fs/cgroup/memory.max");
  if (max2 >= 0) {
    consider(max2 - std::max<int64_t>(0, read_number("/sys/fs/cgroup/memory.current")),
             "the cgroup's memory.max less its memory.current");
  }
  const int64_t max1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (max1 >= 0) {
    consider(
        max1 - std::max<int64_t>(0, read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
        "the cgroup's memory.limit_in_bytes less its usage");
  }
  if (limit > 0) consider(limit, "train.memory_limit (--memory-limit)");
  if (m.bytes < 0) m.bytes = 0;  // unknown: the caller skips the check
  return m;
}

PlanRequest job_plan_request(const JobConfig& cfg, const ModelSpec& spec, int elem_bytes) {
  PlanRequest req;
  req.spec = spec;
  req.world = cfg.world_size;
  req.tensor = cfg.parallelism.tensor;
  req.sequence_parallel = cfg.parallelism.sequence_parallel;
  req.context = cfg.parallelism.context;
  req.context_impl = cfg.parallelism.context_impl;
  req.expert = cfg.parallelism.expert;
  req.micro_batch = static_cast<int>(cfg.micro_batch());
  req.seq = spec.seq_len;
  req.compute_bytes = elem_bytes;
  req.activation_checkpointing = cfg.model.activation_checkpointing;
  req.offload = "all";
  req.overlap_comm = cfg.zero.overlap_comm;
  req.reduce_bucket_size = cfg.zero.reduce_bucket_size;
  req.prefetch_bucket_size = cfg.zero.stage3_prefetch_bucket_size;
  req.param_persistence_threshold = cfg.zero.stage3_param_persistence_threshold;
  return req;
}

namespace {
const char* offload_name(OffloadDevice d) {
  return d == OffloadDevice::kCpu ? "cpu" : d == OffloadDevice::kNvme ? "nvme" : "none";
}
}  // namespace

const PlanRow* job_plan_row(const Plan& plan, const JobConfig& cfg) {
  const std::string opt = offload_name(cfg.zero.offload_optimizer.device);
  const std::string par = offload_name(cfg.zero.offload_param.device);
  const PlanRow* mine = nullptr;
  for (const PlanRow& row : plan.rows) {
    const int stage = plan.data_parallel == 1 && row.offload_optimizer == "none" ? 0 : row.stage;
    const int want = plan.data_parallel == 1 && opt == "none" ? 0 : cfg.zero.stage;
    if (stage == want && row.offload_optimizer == opt && row.offload_param == par) mine = &row;
  }
  return mine;
}

void host_memory_preflight(const JobConfig& cfg, const ModelSpec& spec, int local_ranks,
                           int elem_bytes, const HostMemory& available) {
  if (available.bytes <= 0) return;  // nothing known to compare with
  const int ranks = std::max(1, local_ranks);
  if (cfg.parallelism.pipeline > 1) {
    // The planner models whole replicas; a pipeline rank holds one stage: the pipeline plan's
    // model states and activations (for the micro-batches its schedule keeps live) of the
    // largest stage, for every rank of this process.
    const PipelinePlan pp = make_pipeline_plan(cfg);
    int64_t per_rank = 0, states = 0, activations = 0;
    int worst = 0;
    for (size_t r = 0; r < pp.rank_state_bytes.size(); ++r) {
      const int64_t a = r < pp.rank_activation_bytes.size() ? pp.rank_activation_bytes[r] : 0;
      if (pp.rank_state_bytes[r] + a <= per_rank) continue;
      per_rank = pp.rank_state_bytes[r] + a;
      states = pp.rank_state_bytes[r];
      activations = a;
      worst = static_cast<int>(r);
    }
    const int64_t need = per_rank * ranks;
    if (need <= available.bytes) return;
    ZD_THROW_INPUT(
        "this pipeline job needs about {} of host memory in this process ({} rank{} x up to {}: "
        "pipeline rank {}'s model states {} and activations {}), but {} is available ({}); use "
        "more pipeline stages, ranks or nodes, a higher ZeRO stage, a smaller micro-batch or "
        "activation checkpointing",
        format_bytes(need), ranks, ranks == 1 ? "" : "s", format_bytes(per_rank), worst,
        format_bytes(states), format_bytes(activations), format_bytes(available.bytes),
        available.source);
  }
  const PlanRequest req = job_plan_request(cfg, spec, elem_bytes);
  // On the CPU backend "device" and host memory are the same memory.
  auto need_of = [&](const PlanRow& row) { return (row.device + row.host) * ranks; };
  const Plan plan = make_plan(req);
  const std::string opt = offload_name(cfg.zero.offload_optimizer.device);
  const std::string par = offload_name(cfg.zero.offload_param.device);
  const PlanRow* mine = job_plan_row(plan, cfg);
  if (mine == nullptr) return;  // a combination the planner does not model: no claim
  const int64_t need = need_of(*mine);
  if (need <= available.bytes) return;

  // What would fit: other stages / offload at this micro-batch, then smaller micro-batches
  // (more accumulation keeps the global batch), then activation checkpointing.
  std::vector<std::string> fits;
  for (const PlanRow& row : plan.rows) {
    if (&row != mine && need_of(row) <= available.bytes)
      fits.push_back(fmt::format("{} ({})", row.name, format_bytes(need_of(row))));
  }
  // The largest smaller micro-batch at which something fits: the job's own stage and offload
  // if it can, else the fastest setting that does.
  for (int mb = req.micro_batch / 2; mb >= 1; mb /= 2) {
    PlanRequest smaller = req;
    smaller.micro_batch = mb;
    const Plan p = make_plan(smaller);
    const PlanRow* best = nullptr;
    for (const PlanRow& row : p.rows) {
      if (need_of(row) > available.bytes) continue;
      const bool same =
          row.stage == mine->stage && row.offload_optimizer == opt && row.offload_param == par;
      if (best == nullptr || same) best = &row;
      if (same) break;
    }
    if (best != nullptr) {
      const bool same = best->stage == mine->stage && best->offload_optimizer == opt &&
                        best->offload_param == par;
      fits.push_back(fmt::format("train_micro_batch_size_per_gpu {}{} ({})", mb,
                                 same ? "" : " with " + best->name, format_bytes(need_of(*best))));
      break;
    }
  }
  if (!req.activation_checkpointing) {
    PlanRequest ckpt = req;
    ckpt.activation_checkpointing = true;
    for (const PlanRow& row : make_plan(ckpt).rows) {
      if (row.stage == mine->stage && row.offload_optimizer == opt && row.offload_param == par &&
          need_of(row) <= available.bytes)
        fits.push_back(
            fmt::format("model.activation_checkpointing true ({})", format_bytes(need_of(row))));
    }
  }
  std::string options;
  for (size_t i = 0; i < fits.size(); ++i) options += (i ? "; " : "") + fits[i];
  ZD_THROW_INPUT(
      "this job needs about {} of host memory in this process ({} rank{} x {}: model states {}, "
      "activations {}, buffers {}), but {} is available ({}); {}",
      format_bytes(need), ranks, ranks == 1 ? "" : "s", format_bytes(need / ranks),
      format_bytes(mine->weights + mine->gradients + mine->optimizer + mine->host),
      format_bytes(mine->activations), format_bytes(mine->buffers), format_bytes(available.bytes),
      available.source,
      fits.empty() ? "no ZeRO stage, offload, micro-batch or activation checkpointing setting "
                     "fits: use more ranks or nodes, or a smaller model"
                   : "settings that fit: " + options);
}

}  // namespace zerod
