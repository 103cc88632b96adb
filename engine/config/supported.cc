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

const NotBuiltYet kNotBuiltYet[] = {
    {[](const JobConfig& c) {
       return !c.communication_compression.type.empty() && c.train.device == TrainDevice::kCuda;
     },
     [](const JobConfig& c) {
       return fmt::format(
           "communication_compression.type: \"{}\" with train.device cuda: the PowerSGD hook "
           "compiles for GPUs (cuBLAS matmuls, NCCL all-reduces) but has never run on one; it "
           "runs on CPU ranks",
           c.communication_compression.type);
     }},
    {[](const JobConfig& c) {
       return c.parallelism.tensor > 1 && c.train.device == TrainDevice::kCuda;
     },
     [](const JobConfig& c) {
       return fmt::format(
           "parallelism.tensor: {} with train.device cuda: tensor-parallel groups over NCCL are "
           "not enabled yet (they have never run on GPUs); tensor parallelism runs on CPU ranks",
           c.parallelism.tensor);
     }},
    {[](const JobConfig& c) {
       return c.parallelism.context > 1 && c.train.device == TrainDevice::kCuda;
     },
     [](const JobConfig& c) {
       return fmt::format(
           "parallelism.context: {} with train.device cuda: context-parallel groups over NCCL "
           "are not enabled yet (they have never run on GPUs); context parallelism ({}) runs on "
           "CPU ranks",
           c.parallelism.context, c.parallelism.context_impl);
     }},
    // Pipelines: every schedule runs on CPU ranks (parallel/pipeline/runner.h).
    {[](const JobConfig& c) {
       return c.parallelism.pipeline > 1 && c.train.device == TrainDevice::kCuda;
     },
     [](const JobConfig& c) {
       return fmt::format(
           "parallelism.pipeline {} with train.device cuda: NCCL point-to-point messages have "
           "never run on GPUs; pipelines run on CPU ranks",
           c.parallelism.pipeline);
     },
     true},
    // (PowerSGD runs per stage over its data-parallel group, each matrix drawing the same Q as
    // in the whole model; the 1-bit optimizers are refused with pipelines by their section.)
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
