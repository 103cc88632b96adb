// check_supported: options zerod recognises and validates but has not built yet. One list; drop an
// entry when the feature lands.
#include <fmt/format.h>

#include "engine/config/parse.h"
#include "engine/config/sections.h"

namespace zerod {

namespace {

struct NotBuiltYet {
  bool (*applies)(const JobConfig&);
  std::string (*message)(const JobConfig&);
  bool plans = false;  // `zerod check` accepts it (and shows its plan); only running is refused
};

std::string over_nccl_message(const char* what, int value) {
  return fmt::format(
      "{}: {} with train.device cuda and train.device_comm \"nccl\": NCCL sub-groups are not "
      "enabled yet (they have never run on GPUs); with train.device_comm \"auto\" or \"gloo\" "
      "the groups run over Gloo with host staging",
      what, value);
}

const NotBuiltYet kNotBuiltYet[] = {
    {[](const JobConfig& c) {
       return !c.communication_compression.type.empty() && device_comm_is_nccl(c);
     },
     [](const JobConfig& c) {
       return fmt::format(
           "communication_compression.type: \"{}\" with train.device cuda and "
           "train.device_comm \"nccl\": the PowerSGD hook has never run over NCCL; it runs on "
           "CPU ranks and on GPU ranks with train.device_comm \"auto\" or \"gloo\" (host "
           "staging)",
           c.communication_compression.type);
     }},
    {[](const JobConfig& c) {
       return c.parallelism.tensor > 1 && c.train.device == TrainDevice::kCuda &&
              c.train.device_comm == DeviceComm::kNccl;
     },
     [](const JobConfig& c) {
       return over_nccl_message("parallelism.tensor", c.parallelism.tensor);
     }},
    {[](const JobConfig& c) {
       return c.parallelism.context > 1 && c.train.device == TrainDevice::kCuda &&
              c.train.device_comm == DeviceComm::kNccl;
     },
     [](const JobConfig& c) {
       return over_nccl_message("parallelism.context", c.parallelism.context);
     }},
    // Pipelines: every schedule runs on CPU ranks and, over Gloo with host staging, on GPU ranks
    // (parallel/pipeline/runner.h).
    {[](const JobConfig& c) {
       return c.parallelism.pipeline > 1 && c.train.device == TrainDevice::kCuda &&
              c.train.device_comm == DeviceComm::kNccl;
     },
     [](const JobConfig& c) {
       return over_nccl_message("parallelism.pipeline", c.parallelism.pipeline);
     },
     true},
    // (PowerSGD runs per stage over its data-parallel group, each matrix drawing the same Q as
    // in the whole model; so do the 1-bit optimizers.)
    {[](const JobConfig& c) { return c.aio.use_gds; },
     [](const JobConfig&) {
       return std::string("aio.use_gds: GPUDirect Storage is not implemented yet in zerod");
     }},
    {[](const JobConfig& c) { return c.activation_checkpointing.partition_activations; },
     [](const JobConfig&) {
       return std::string(
           "activation_checkpointing.partition_activations: partitioning "
           "checkpointed activations across ranks is not implemented yet in zerod");
     }},
    {[](const JobConfig& c) { return c.activation_checkpointing.cpu_checkpointing; },
     [](const JobConfig&) {
       return std::string(
           "activation_checkpointing.cpu_checkpointing: keeping checkpointed "
           "activations in CPU memory is not implemented yet in zerod");
     }},
};

}  // namespace

void check_supported(const JobConfig& cfg, bool running) {
  std::vector<std::string> problems;
  for (const NotBuiltYet& item : kNotBuiltYet) {
    if ((running || !item.plans) && item.applies(cfg)) problems.push_back(item.message(cfg));
  }
  if (!problems.empty()) throw ConfigError(std::move(problems), cfg.source);
}

}  // namespace zerod
