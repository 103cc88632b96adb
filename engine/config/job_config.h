// The typed job configuration: a DeepSpeed ds_config plus zerod's own `model`, `data` and
// `train` sections. Parsed once (parse.h), validated in one place, with derived values filled
// in by resolve(). Everything downstream reads these structs, never JSON.
//
// Field names mirror the JSON keys; defaults are DeepSpeed's where the key is DeepSpeed's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/config/elasticity_config.h"
#include "engine/config/onebit_config.h"

namespace zerod {

// ---- optimizer --------------------------------------------------------------------------------
struct OptimizerConfig {
  // "Adam" | "AdamW" | "SGD" | "Adagrad" | "Lion" | "Lamb" (case-insensitive in the file; canonical
  // here). Parsing fills in the defaults of the type given (torch.optim.SGD / Adagrad,
  // lion-pytorch).
  std::string type = "AdamW";
  double lr = 1e-3;
  double beta1 = 0.9;  // Adam, Lion
  double beta2 = 0.999;
  double eps = 1e-8;  // Adam, Adagrad
  // DeepSpeed's default is 0 (FusedAdam / DeepSpeedCPUAdam) for both types; only with
  // torch_adam: true and decoupled mode does torch.optim.AdamW's 0.01 apply (parse fills it in).
  double weight_decay = 0.0;
  // Effective mode after parsing: "AdamW" is always decoupled; "Adam" is decoupled AdamW unless
  // adam_w_mode: false (DeepSpeed's rule).
  bool adam_w_mode = true;
  bool bias_correction = true;
  bool torch_adam = false;  // accepted for compatibility; no effect on CPU
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adagrad
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
  OnebitConfig onebit;  // OneBitAdam, ZeroOneAdam, OneBitLamb
  // Muon (torch.optim.Muon for the hidden matrices: lr is theirs, "muon_lr" in the file may set
  // it; weight_decay, momentum, nesterov above) and its auxiliary AdamW for every other tensor
  // (DeepSpeed's Muon keys: adam_lr, betas, eps above; adam_weight_decay).
  double adam_lr = 1e-3;
  double adam_weight_decay = 0.1;
  std::vector<double> ns_coefficients = {3.4445, -4.775, 2.0315};
  double ns_eps = 1e-7;
  int ns_steps = 5;
  std::string adjust_lr_fn = "original";  // "original" (torch's None) | "match_rms_adamw"
  // Lamb (DeepSpeed FusedLamb): the trust ratio's clamp, eps under the square root
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;

  bool operator==(const OptimizerConfig&) const = default;
};

// ---- communication_compression ---------------------------------------------------------------
// Gradient compression for data parallelism (zero/powersgd.h). PowerSGD's keys are PyTorch
// PowerSGDState's arguments (start_iter: start_powerSGD_iter, rank:
// matrix_approximation_rank).
struct PowerSgdConfig {
  int rank = 1;
  int64_t start_iter = 1000;  // plain all-reduce before this step
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0.0;
  uint64_t random_seed = 0;

  bool operator==(const PowerSgdConfig&) const = default;
};

struct CommCompressionConfig {
  std::string type;  // "" (the section absent: none) | "powersgd"
  PowerSgdConfig powersgd;

  bool operator==(const CommCompressionConfig&) const = default;
};

// ---- scheduler --------------------------------------------------------------------------------
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR, kOneCycle };
enum class WarmupType { kLog, kLinear };

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR (required there)
  // WarmupCosineLR (ratios of the optimizer lr)
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // defaults to cycle_first_step_size
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = 0;  // absent in the file: the first stair count
  // (DeepSpeed stores both stair counts but its OneCycle never uses them.)
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;

  bool operator==(const SchedulerConfig&) const = default;
};

// ---- mixed precision --------------------------------------------------------------------------
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;       // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;  // dynamic: initial scale 2^power
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;

  bool operator==(const Fp16Config&) const = default;
};

struct Bf16Config {
  bool enabled = false;

  bool operator==(const Bf16Config&) const = default;
};

// ---- ZeRO and offload -------------------------------------------------------------------------
enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;  // 1e8
  int64_t max_in_cpu = 1000000000;  // 1e9
  bool pin_memory = false;

  bool operator==(const OffloadParamConfig&) const = default;
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;

  bool operator==(const OffloadOptimizerConfig&) const = default;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;  // 5e8 elements
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;  // 5e8 elements
  std::optional<bool> overlap_comm;           // DeepSpeed: default true at stage 3, else false
  bool overlap_comm_resolved = false;         // derived
  bool load_from_fp32_weights = true;
  int64_t sub_group_size = 1000000000;  // 1e9
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool round_robin_gradients = false;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;

  bool operator==(const ZeroConfig&) const = default;
};

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // alias thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;

  bool operator==(const AioConfig&) const = default;
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";  // Ignore | Warn | Fail
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool async = false;  // zerod extension: background save

  bool operator==(const CheckpointConfig&) const = default;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;

  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

struct MonitorConfig {  // csv_monitor, tensorboard
  bool enabled = false;
  std::string output_path;  // "" -> "./"
  std::string job_name = "DeepSpeedJobName";

  bool operator==(const MonitorConfig&) const = default;
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
  std::vector<std::string> prof_ops;

  bool operator==(const CommsLoggerConfig&) const = default;
};

// ---- zerod sections ---------------------------------------------------------------------------
// The model section. GPT-2 ("type": "gpt2") takes zerod's keys (n_layer, n_head, n_embd, ...,
// which are also GPT2Config's); the Llama family ("llama", "mistral", "qwen2") takes Hugging
// Face config.json key names (hidden_size, num_hidden_layers, ...), stored here in the same
// fields. With init_from a Hugging Face directory, its config.json fills every key the job does
// not give.
// Mixture of experts (model/moe_spec.h): Mixtral's keys (model.type "mixtral": num_local_experts,
// num_experts_per_tok, router_aux_loss_coef, output_router_logits) or a "moe" section on GPT-2
// or the Llama family (DeepSpeed-MoE's names and defaults). engine/config/moe_section.cc.
struct MoeConfig {
  int num_experts = 0;  // 0: dense (num_local_experts for mixtral)
  int top_k = 1;        // num_experts_per_tok for mixtral
  double capacity_factor = 1.0;
  double eval_capacity_factor = 1.0;
  int64_t min_capacity = 4;
  bool drop_tokens = true;      // mixtral: false (dropless)
  double aux_loss_coef = 0.01;  // mixtral: router_aux_loss_coef (0.001), if output_router_logits
  double router_z_loss_coef = 0.0;
  int moe_layer_frequency = 1;
  int shared_experts = 0;
  bool output_router_logits = false;  // mixtral: whether the aux loss joins the objective

  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  std::string type = "gpt2";  // gpt2 | llama | mistral | qwen2 | mixtral
  int n_layer = 12;           // num_hidden_layers
  int n_head = 12;            // num_attention_heads
  int n_embd = 768;           // hidden_size
  int vocab_size = 50257;
  int seq_len = 1024;
  int padded_vocab_size = 0;              // derived: vocab_size rounded up to a multiple of 128
  std::optional<std::string> init_from;   // HF safetensors file or save_pretrained directory
  bool activation_checkpointing = false;  // recompute each block in backward
  double init_std = 0.02;                 // initializer_range

  // Llama family.
  int n_kv_head = 0;          // num_key_value_heads (0: num_attention_heads)
  int head_dim = 0;           // 0: hidden_size / num_attention_heads
  int intermediate_size = 0;  // required for the Llama family
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::string rope_type = "default";  // default | linear | llama3 | dynamic | yarn
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int rope_original_max_position_embeddings = 0;  // 0: not given (llama3: 8192)
  double rope_attention_factor = 0.0;             // yarn; 0: not given
  double rope_beta_fast = 32.0;                   // yarn
  double rope_beta_slow = 1.0;                    // yarn
  // config.json's max_position_embeddings, kept only where the rotary frequencies depend on it
  // (rope dynamic and yarn); 0 otherwise.
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // llama: q/k/v and o biases (qwen2 always has q/k/v biases)
  bool mlp_bias = false;
  int sliding_window = 0;  // mistral; qwen2 (only with use_sliding_window); 0: none
  // Qwen2 (transformers 4.57): with use_sliding_window, the layers of layer_types
  // "sliding_attention", or without layer_types those from max_window_layers on, attend to the
  // last sliding_window positions; the others to all.
  bool use_sliding_window = false;
  int max_window_layers = 28;
  std::vector<std::string> layer_types;  // "full_attention" | "sliding_attention"; empty: derived
  MoeConfig moe;           // num_experts 0: dense

  bool llama_family() const { return type != "gpt2"; }
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::vector<std::string> train;  // globs of llm.c .bin shards
  // Empty, or one weight > 0 per `train` glob: the samples are blended in these proportions
  // (data.train as [{"path": GLOB, "weight": W}, ...]; engine/data/blend.h).
  std::vector<double> train_weights;
  std::string tokenizer;           // "" or a tokenizer (file or directory, engine/tokenizer)
  std::vector<std::string> val;    // globs; empty: carve val_fraction out of train
  double val_fraction = 0.0;       // share of train samples held out when `val` is empty
  uint64_t seed = 1337;
  bool shuffle = true;  // false: training samples in file order, epoch after epoch
  // Packed documents: attention stays inside each document of a sample and positions restart
  // after each eos_token_id among the inputs (model/document_mask.h).
  bool document_masking = false;
  std::optional<int64_t> eos_token_id;  // required with document_masking; in [0, vocab_size)

  bool operator==(const DataConfig&) const = default;
};

// Where a rank's model runs: the CPU backend (kernels/cpu/) or one GPU per local rank
// (kernels/cuda/, NCCL between ranks).
enum class TrainDevice { kCpu, kCuda };
const char* train_device_name(TrainDevice d);

// How GPU ranks move their device tensors between them (train.device_comm):
//   auto  NCCL when the job is data parallel only (every group is the world's) and each local
//         rank has a GPU of its own; Gloo with host staging otherwise (tensor, context, pipeline
//         parallelism: NCCL sub-groups are not enabled yet).
//   nccl  NCCL; refused with tensor, context or pipeline parallelism and with more local ranks
//         than GPUs.
//   gloo  Gloo with host staging for every group (comm/staged/): slower, but any mesh, and ranks
//         may share a GPU (local rank r on GPU r mod the visible GPUs).
enum class DeviceComm { kAuto, kNccl, kGloo };
const char* device_comm_name(DeviceComm c);

struct TrainConfig {
  int64_t steps = 0;                       // optimizer steps to run (required)
  TrainDevice device = TrainDevice::kCpu;  // "cpu" or "cuda" (local rank r on GPU r)
  DeviceComm device_comm = DeviceComm::kAuto;  // GPU ranks: "auto", "nccl" or "gloo"
  std::string checkpoint_dir;              // "" -> no checkpoints
  int64_t save_interval = 0;               // steps; 0: off
  int64_t keep_last = 0;                   // 0: keep all
  int64_t eval_interval = 0;               // steps; 0: off
  int64_t eval_batches = 20;               // micro-batches per validation pass
  uint64_t seed = 1337;                    // weight initialisation
  double peak_flops = 0.0;  // per rank, for MFU; 0: measured (CPU) or the GPU's table
  // Host memory this process may use, bytes (zerod train --memory-limit); 0: what the machine
  // and its cgroup have available. The start of a CPU job checks its planned memory against it.
  int64_t memory_limit = 0;
  double collective_timeout = 300.0;  // seconds a collective may take before the job fails
  double rendezvous_timeout = 300.0;  // seconds to wait for every node/rank to join
  // Resuming from a checkpoint trained with another global batch (train_batch_size) is refused
  // unless this is true (a world size that changes the batch derived from the micro-batch).
  bool allow_batch_change = false;

  bool operator==(const TrainConfig&) const = default;
};

// ---- the whole job ----------------------------------------------------------------------------
// "parallelism": how the world's ranks split the model besides data parallelism (DESIGN.md
// section 8). The data-parallel size is world / (pipeline x tensor x context), derived with the
// world size; DeepSpeed's tensor_parallel.autotp_size and sequence_parallel_size are aliases of
// tensor and context (Ulysses).
struct ParallelismConfig {
  int tensor = 1;
  bool sequence_parallel = false;  // Megatron SP in the tensor group
  int context = 1;
  std::string context_impl = "ulysses";  // ulysses | ring
  // Pipeline parallelism (parallel/pipeline/): P stages of V chunks each, the micro-batches of a
  // step (gradient_accumulation_steps) run in the named schedule's order.
  int expert = 1;  // expert parallelism (issue 23 item 3): E ranks share the experts
  int pipeline = 1;
  std::string pipeline_schedule = "1f1b";      // gpipe | 1f1b | interleaved_1f1b | zero_bubble
  int virtual_stages = 1;                      // V chunks per rank (interleaved_1f1b)
  std::string pipeline_partition = "uniform";  // uniform | parameters | explicit
  std::vector<int> pipeline_layers;            // "explicit": layers per stage (P x V of them)

  // The ranks of one model replica (the data-parallel size is the world over this).
  int model_ranks() const { return pipeline * tensor * context; }

  bool operator==(const ParallelismConfig&) const = default;
};

// zerod's "snapshot" section (docs/elastic.md): in-memory snapshots of an elastic job's state
// every `interval` steps, each rank's copy kept on its node and on a buddy node, restored from
// after a node failure instead of the disk checkpoint.
struct SnapshotConfig {
  bool enabled = false;
  int64_t interval = 0;          // steps between snapshots (required when enabled)
  std::string dir = "/dev/shm";  // a memory file system on every node (tmpfs)
  bool operator==(const SnapshotConfig&) const = default;
};

struct JobConfig;
// Whether the job's GPU ranks exchange device tensors over NCCL (train.device cuda, more than one
// rank, and train.device_comm nccl, or auto on a mesh that is data parallel only without
// communication_compression); false: Gloo with host staging, or no device tensors between ranks.
bool nccl_between_ranks(const JobConfig& cfg);
// The same whatever the world size (what a job would use with several ranks).
bool device_comm_is_nccl(const JobConfig& cfg);

struct JobConfig {
  // batch triangle (after resolve(): all three set and consistent), over the data-parallel size
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  int world_size = 1;          // the world size the triangle was resolved for
  int data_parallel_size = 1;  // world_size / (tensor x context), derived with it
  ParallelismConfig parallelism;

  int64_t steps_per_print = 10;  // DeepSpeed's documented default; 0 (or null in the file): never
  bool wall_clock_breakdown = false;
  bool dump_state = false;
  double gradient_clipping = 0.0;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;

  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero;
  AioConfig aio;
  CheckpointConfig checkpoint;
  ActivationCheckpointingConfig activation_checkpointing;
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  CommsLoggerConfig comms_logger;
  CommCompressionConfig communication_compression;
  ElasticityConfig elasticity;
  SnapshotConfig snapshot;

  ModelConfig model;
  DataConfig data;
  TrainConfig train;

  // Derived
  DType compute_dtype() const {
    return fp16.enabled ? DType::kF16 : (bf16.enabled ? DType::kBF16 : DType::kF32);
  }
  int64_t micro_batch() const { return train_micro_batch_size_per_gpu.value_or(0); }
  int64_t grad_accum() const { return gradient_accumulation_steps.value_or(0); }
  int64_t global_batch() const { return train_batch_size.value_or(0); }

  std::string source;  // the file it came from (for messages), "" for built-ins

  bool operator==(const JobConfig&) const = default;
};

}  // namespace zerod
