// The parameters of DeepSpeed's 1-bit optimizers (deepspeed/runtime/fp16/onebit/): OneBitAdam,
// ZeroOneAdam (0/1 Adam) and OneBitLamb, with DeepSpeed's defaults. Part of OptimizerConfig.
#pragma once

#include <cstdint>
#include <string>

namespace zerod {

struct OnebitConfig {
  // OneBitAdam / OneBitLamb: steps of full-precision warm-up before compressed communication.
  int64_t freeze_step = 100000;
  // DeepSpeed's choice of MPI / NCCL path; zerod compresses over the job's communicator, so
  // these are accepted (known values) and change nothing.
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";
  // ZeroOneAdam (arXiv 2202.06009).
  int64_t var_freeze_step = 100000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
  // OneBitLamb (arXiv 2104.06069).
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  double coeff_beta = 0.9;
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;

  bool operator==(const OnebitConfig&) const = default;
};

// True for "OneBitAdam", "ZeroOneAdam", "OneBitLamb".
inline bool is_onebit_optimizer(const std::string& type) {
  return type == "OneBitAdam" || type == "ZeroOneAdam" || type == "OneBitLamb";
}

}  // namespace zerod
