#include "engine/train/offload_preflight.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm/strings.h"
#include "core/error.h"
#include "core/log.h"
#include "offload/param_swapper.h"
#include "zero/partition.h"
#include "zero/zero_engine.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {
double mib(int64_t b) {
  return static_cast<double>(b) / (1 << 20);
}
}  // namespace

std::string OffloadPlan::text() const {
  return fmt::format("device {:.2f} MiB, host {:.2f} MiB, disk {:.2f} MiB per rank", mib(device),
                     mib(host), mib(disk));
}

std::string swap_file_prefix() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  return fmt::format("zerod-{}-", host);
}

std::string optimizer_swap_path(const std::string& nvme_path, int rank) {
  return (fs::path(nvme_path) /
          fmt::format("{}{}-rank{}.optimizer.swp", swap_file_prefix(), ::getpid(), rank))
      .string();
}

std::string param_swap_path(const std::string& nvme_path, int rank) {
  return (fs::path(nvme_path) /
          fmt::format("{}{}-rank{}.params.swp", swap_file_prefix(), ::getpid(), rank))
      .string();
}

SwapOptions swap_options(const JobConfig& cfg) {
  const OffloadOptimizerConfig& oo = cfg.zero.offload_optimizer;
  SwapOptions o;
  o.group_elems = cfg.zero.sub_group_size;
  o.buffer_count = static_cast<int>(oo.buffer_count);
  o.pipeline_read = oo.pipeline_read;
  o.pipeline_write = oo.pipeline_write;
  o.pin_memory = oo.pin_memory;
  o.aio.block_size = cfg.aio.block_size;
  o.aio.queue_depth = static_cast<int>(cfg.aio.queue_depth);
  o.aio.threads = static_cast<int>(cfg.aio.intra_op_parallelism);
  o.aio.single_submit = cfg.aio.single_submit;
  o.aio.overlap_events = cfg.aio.overlap_events;
  return o;
}

OffloadPlan plan_offload(const JobConfig& cfg, const ParamLayout& layout, int world,
                         int64_t elem_bytes) {
  const int stage = cfg.zero.stage;
  const Partition part(layout, stage >= 1 ? world : 1);
  const int64_t shard = part.shard_elems_total();
  const int64_t esz = elem_bytes;
  // fp32 runs keep no separate master: the weights are it (4-byte elements without a dtype).
  const bool fp32 = cfg.compute_dtype() == DType::kF32;
  OffloadPlan p;
  p.device = esz * (stage >= 3 ? shard : part.padded_elems_total()) +
             esz * (stage >= 2 ? shard : part.padded_elems_total());
  const OffloadOptimizerConfig& oo = cfg.zero.offload_optimizer;
  const int64_t states = 12 * shard;  // fp32 master, exp_avg, exp_avg_sq
  switch (oo.device) {
    case OffloadDevice::kNone:
      p.device += fp32 ? 8 * shard : states;  // fp32: the weights are the master
      break;
    case OffloadDevice::kCpu:
      p.host = static_cast<int64_t>(static_cast<double>(states) * oo.ratio);
      p.device += states - p.host;
      break;
    case OffloadDevice::kNvme: {
      const SwapOptions so = swap_options(cfg);
      p.optimizer_disk = StateSwapper::file_bytes_for(shard, so.group_elems);
      p.host = StateSwapper::buffer_bytes_for(shard, so);
      break;
    }
  }
  // Parameter offload (stage 3): the weight shards leave the compute pool.
  const OffloadParamConfig& op = cfg.zero.offload_param;
  if (op.device != OffloadDevice::kNone && stage == 3) {
    p.device -= esz * shard;
    if (op.device == OffloadDevice::kCpu) {
      p.host += esz * shard;
    } else {
      // The leading units whose shards fit in max_in_cpu stay in host memory (as ZeroEngine).
      std::vector<int64_t> regions;
      int64_t in_cpu = 0, most = 0;
      bool resident = true;
      for (int u = 0; u < part.num_units(); ++u) {
        const int64_t n = part.unit(u).shard;
        resident = resident && part.shard_offset(u) + n <= op.max_in_cpu;
        if (resident) in_cpu += n;
        regions.push_back(resident ? 0 : esz * n);
        if (!resident) most = std::max(most, n);
      }
      p.param_disk = ParamSwapper::file_bytes_for(regions);
      p.host += esz * in_cpu + 2 * ((esz * most + 4095) / 4096 * 4096);
    }
  }
  p.disk = p.optimizer_disk + p.param_disk;
  return p;
}

std::vector<std::string> remove_stale_swap_files(const std::string& nvme_path) {
  std::vector<std::string> removed;
  const std::string prefix = swap_file_prefix();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(nvme_path, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() < 4 ||
        name.compare(name.size() - 4, 4, ".swp") != 0)
      continue;
    const std::string rest = name.substr(prefix.size());  // "PID-rankR.KIND.swp"
    const size_t dash = rest.find('-');
    if (dash == std::string::npos || dash == 0) continue;
    long long pid = 0;
    try {
      size_t used = 0;
      pid = std::stoll(rest.substr(0, dash), &used);
      if (used != dash) continue;
    } catch (...) {
      continue;
    }
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (fs::remove(entry.path(), rm)) removed.push_back(entry.path().string());
  }
  return removed;
}

std::string nvme_path_problem(const std::string& nvme_path, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(nvme_path, ec)) return fmt::format("{} '{}' does not exist", what, nvme_path);
  if (!fs::is_directory(nvme_path, ec))
    return fmt::format("{} '{}' is not a folder", what, nvme_path);
  const std::string probe =
      (fs::path(nvme_path) / fmt::format(".zerod-probe-{}-{}", ::getpid(), gettid())).string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    return fmt::format("{} '{}' is not writable: {}", what, nvme_path, std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

std::string check_nvme_path(const std::string& nvme_path, int64_t bytes, const std::string& what) {
  if (std::string problem = nvme_path_problem(nvme_path, what); !problem.empty()) return problem;
  // Swap files this host's killed runs left behind would eat the room (and the disk).
  for (const std::string& f : remove_stale_swap_files(nvme_path))
    spdlog::warn("{}: removed the stale swap file {} (its process is gone)", what, f);
  struct statvfs st {};
  if (::statvfs(nvme_path.c_str(), &st) != 0)
    return fmt::format("{} '{}': statvfs failed: {}", what, nvme_path, std::strerror(errno));
  const int64_t free_bytes = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  if (free_bytes < bytes) {
    return fmt::format(
        "{} '{}' has {} bytes ({:.2f} MiB) free; the swap files of this process's ranks need "
        "{} bytes ({:.2f} MiB)",
        what, nvme_path, free_bytes, mib(free_bytes), bytes, mib(bytes));
  }
  return "";
}

void offload_preflight(const JobConfig& cfg, const RankContext& ctx, const ParamLayout& layout,
                       int64_t elem_bytes) {
  const OffloadOptimizerConfig& oo = cfg.zero.offload_optimizer;
  const OffloadParamConfig& op = cfg.zero.offload_param;
  if (oo.device == OffloadDevice::kNone && op.device == OffloadDevice::kNone) return;
  const OffloadPlan plan = plan_offload(cfg, layout, ctx.world_size, elem_bytes);
  // The ranks of this process share the folders; other nodes check their own. When both
  // sections name the same folder, it must hold both files.
  const bool same = oo.device == OffloadDevice::kNvme && op.device == OffloadDevice::kNvme &&
                    fs::weakly_canonical(oo.nvme_path) == fs::weakly_canonical(op.nvme_path);
  std::string mine;
  if (oo.device == OffloadDevice::kNvme) {
    mine = check_nvme_path(
        oo.nvme_path, (plan.optimizer_disk + (same ? plan.param_disk : 0)) * ctx.local_world_size,
        "zero_optimization.offload_optimizer.nvme_path");
  }
  if (mine.empty() && op.device == OffloadDevice::kNvme && !same) {
    mine = check_nvme_path(op.nvme_path, plan.param_disk * ctx.local_world_size,
                           "zero_optimization.offload_param.nvme_path");
  }
  std::vector<std::string> all{mine};
  if (ctx.world_size > 1) all = all_gather_strings(*ctx.comm, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    ZD_THROW_INPUT("offload preflight (rank {}): {}. Plan: {}", r, all[r], plan.text());
  }
  if (ctx.rank == 0) {
    auto name = [](OffloadDevice d) {
      return d == OffloadDevice::kNvme ? "nvme" : d == OffloadDevice::kCpu ? "cpu" : "device";
    };
    spdlog::info("offload plan (optimizer states on {}, parameters on {}): {}", name(oo.device),
                 name(op.device), plan.text());
  }
}

}  // namespace zerod
