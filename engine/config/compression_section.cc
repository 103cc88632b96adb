// communication_compression: {"type": "powersgd", "rank": r, "start_iter": n, ...}
// (zero/powersgd.h; the keys are PyTorch PowerSGDState's arguments, start_iter its
// start_powerSGD_iter, rank its matrix_approximation_rank).
#include <fmt/format.h>

#include "engine/config/sections.h"

namespace zerod::config {

void read_communication_compression(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("communication_compression");
  if (obj == nullptr) return;
  CommCompressionConfig& cc = cfg.communication_compression;
  PowerSgdConfig& c = cc.powersgd;
  ObjectReader r(*obj, "communication_compression", top.problems());
  const std::vector<std::string> types = {"powersgd"};
  size_t index = 0;
  if (!r.has("type")) {
    top.problems().error(r.path_of("type"), "required (supported: powersgd)");
  } else if (r.read_choice("type", index, types, /*case_insensitive=*/true)) {
    cc.type = types[index];
  }
  r.read_int("rank", c.rank, at_least(1));
  r.read_int("start_iter", c.start_iter, at_least(0));
  r.read_real("min_compression_rate", c.min_compression_rate, real_at_least(0.0));
  r.read_bool("use_error_feedback", c.use_error_feedback);
  r.read_bool("warm_start", c.warm_start);
  r.read_real("orthogonalization_epsilon", c.orthogonalization_epsilon, real_at_least(0.0));
  r.read_u64("random_seed", c.random_seed);
  r.finish("keys");
}

void validate_communication_compression(const JobConfig& cfg, Problems& p) {
  const CommCompressionConfig& c = cfg.communication_compression;
  if (c.type.empty()) return;
  // PowerSGD replaces stage 0's gradient all-reduce (PyTorch's DDP hook); stages 1-3
  // reduce-scatter shards (a low-rank factor of a whole matrix is no shard's), and the
  // optimizer offload needs stage >= 1. fp16's loss scaler would feed inf/NaN of an overflowing
  // step into the error-feedback buffers.
  if (cfg.zero.stage != 0) {
    p.error("communication_compression.type",
            fmt::format("\"{}\" serves zero_optimization.stage 0 only (it replaces the gradient "
                        "all-reduce of data parallelism), got stage {}",
                        c.type, cfg.zero.stage));
  }
  if (is_onebit_optimizer(cfg.optimizer.type)) {
    p.error("communication_compression.type",
            fmt::format("\"{}\" cannot be combined with optimizer.type {} (which compresses its "
                        "own communication)",
                        c.type, cfg.optimizer.type));
  }
  if (cfg.fp16.enabled) {
    p.error("communication_compression.type",
            fmt::format("\"{}\" cannot be combined with fp16 (an overflowing step would leave "
                        "inf/NaN in its error feedback); use bf16 or fp32",
                        c.type));
  }
}

}  // namespace zerod::config
