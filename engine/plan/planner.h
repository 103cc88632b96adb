// The memory planner behind `zeroctl plan`: per-rank device, host and disk bytes of a GPT
// training job for each ZeRO stage and offload choice, which of them fit, and the fastest
// that does. Model states come from the ZeRO formulas over the parameters as zerod lays them
// out (zero_formula_bytes), activations from the model's own allocation formula
// (model_activation_bytes), so the figures are what zerod's memory accounting measures.
//
// Tensor parallelism (parallelism.tensor T): the world is T x DP ranks (DP = world / T, the
// data-parallel size). Each rank holds the parameters of its tensor-parallel part as zerod lays
// them out (ParamLayout with TensorShard{0, T}: heads, MLP width and vocabulary rows split T ways,
// norms replicated, rank-0-only biases present as zeros on every rank), and ZeRO partitions those
// over the DP ranks of its data-parallel group; activations are the model's own formula for one
// of T ranks, with sequence_parallel also the norm and residual regions' (their N = B x T
// positions split T ways).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/spec.h"

namespace zerod {

struct PlanRequest {
  std::optional<ModelSpec> spec;  // the shape; without it only model states (from `params`)
  int64_t params = 0;             // when spec is not given
  int world = 1;                  // all ranks: tensor x data-parallel
  int tensor = 1;  // parallelism.tensor T (must divide world; and the heads, MLP width, vocabulary)
  bool sequence_parallel = false;  // parallelism.sequence_parallel (with tensor > 1)
  int context = 1;  // parallelism.context C: each rank holds seq / C positions; ZeRO over DP x C
  // parallelism.expert E (a model with experts): each rank stores num_experts / E of every MoE
  // block's routed experts, which ZeRO shards over DP / E ranks.
  int expert = 1;
  std::string context_impl = "ulysses";  // "ulysses" or "ring": the exchange's workspaces
  int micro_batch = 1;    // sequences per rank per forward/backward
  int seq = 1024;         // tokens per sequence (spec->seq_len by default)
  int compute_bytes = 2;  // 2: bf16/fp16 weights and gradients, 4: fp32
  bool activation_checkpointing = false;
  int64_t device_bytes = 0;  // per rank; 0: no limit checked
  int64_t host_bytes = 0;    // per node (all its ranks); 0: not checked
  int ranks_per_node = 1;    // to charge host bytes per node
  std::string offload;       // "" (all choices), "none", "cpu" or "nvme": which to consider
  // zero_optimization settings that size the ZeRO working buffers (PlanRow::buffers; defaults
  // as DeepSpeed's). overlap_comm unset: on at stage 3 only, as the job resolves it.
  std::optional<bool> overlap_comm;
  int64_t reduce_bucket_size = 500000000;
  int64_t prefetch_bucket_size = 50000000;       // stage3_prefetch_bucket_size
  int64_t param_persistence_threshold = 100000;  // stage3_param_persistence_threshold
};

struct PlanRow {
  std::string name;  // "ZeRO-2 + optimizer on cpu"
  int stage = 0;
  std::string offload_optimizer = "none", offload_param = "none";
  // per rank
  int64_t weights = 0, gradients = 0, optimizer = 0;  // model states on the device
  // Working memory on the device: activations, and the ZeRO buffers (stages 2-3: gradient
  // buckets; stage 3: gathered units). See zero_buffer_bytes in planner.cc.
  int64_t activations = 0, buffers = 0;
  int64_t device = 0, host = 0, disk = 0;             // totals
  bool fits = true;
  std::string why;  // when it does not fit
};

struct Plan {
  int64_t parameters = 0;         // real parameters (the whole model)
  int64_t padded_parameters = 0;  // per tensor-parallel rank as laid out (aligned tensors, padded
                                  // vocabulary): the whole model when tensor is 1
  int tensor_parallel = 1;        // T
  int data_parallel = 1;          // DP = world / T: the ranks ZeRO partitions over
  std::vector<PlanRow> rows;      // fastest first
  int recommended = -1;           // index into rows; -1: nothing fits
};

Plan make_plan(const PlanRequest& r);

// The context exchange's workspaces (parallel/cp_exchange.cc) on one of `context` ranks of a
// micro-batch of `micro_batch` sequences of `seq` positions, one of `tensor` ranks, compute
// elements of esz bytes: the sequence's position table, and per attention call Ulysses' six
// (q/k/v or output sized) buffers or the ring's two travelling key/value blocks with their
// gradients. 0 when context is 1.
int64_t context_workspace_bytes(const ModelSpec& spec, int tensor, int micro_batch, int seq,
                                int context, const std::string& impl, size_t esz);

// "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl" (= "gpt2-1.5b"): the GPT-2 family's shapes;
// "llama2-7b", "llama3-8b", "llama3-70b", "mistral-7b", "qwen2-0.5b", "qwen2-7b": the shapes of
// those models' published config.json.
std::optional<ModelSpec> model_preset(const std::string& name);
// "80GiB", "512MiB", "1.5TB", "1000000": bytes (InputError naming `flag` otherwise).
int64_t parse_bytes(const std::string& text, const std::string& flag);
std::string format_bytes(int64_t bytes);  // "1.50 GiB"

}  // namespace zerod
