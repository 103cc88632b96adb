// Internal to engine/config: one reader per group of job file sections. Each reads its keys from
// the top-level object into the JobConfig and records problems; none throws.
#pragma once

#include "engine/config/job_config.h"
#include "engine/config/json_reader.h"

namespace zerod::config {

// optimizer, scheduler (optimizer_sections.cc)
void read_optimizer(ObjectReader& top, JobConfig& cfg);
void read_scheduler(ObjectReader& top, JobConfig& cfg);
// optimizer.params.betas (two numbers in [0, 1)).
void read_betas(ObjectReader& p, OptimizerConfig& o);
// optimizer.params of OneBitAdam / ZeroOneAdam / OneBitLamb (onebit_section.cc), and their rules.
void read_onebit_params(ObjectReader& p, OptimizerConfig& o);
void validate_onebit(const JobConfig& cfg, Problems& problems);
// fp16, bf16 (and the older "bfloat16"), gradient/batch scalars stay in parse_job.cc
void read_precision(ObjectReader& top, JobConfig& cfg);
// zero_optimization with offload_param / offload_optimizer, aio (zero_sections.cc)
void read_zero(ObjectReader& top, JobConfig& cfg);
void read_aio(ObjectReader& top, JobConfig& cfg);
// checkpoint, activation_checkpointing, csv_monitor, tensorboard, comms_logger
// (runtime_sections.cc)
void read_runtime_sections(ObjectReader& top, JobConfig& cfg);
// communication_compression (compression_section.cc); its rules against the ZeRO stage,
// offload and precision.
void read_communication_compression(ObjectReader& top, JobConfig& cfg);
void validate_communication_compression(const JobConfig& cfg, Problems& problems);
// elasticity (elasticity_section.cc). validate_elasticity, after read_resolved: its rules against
// the batch keys (removed, with a warning, under ignore_non_elastic_batch_info; with a
// "resolved" section they must be the ones derived for resolved.world_size) and parallelism.
void read_elasticity(ObjectReader& top, JobConfig& cfg);
// snapshot (snapshot_section.cc): zerod's in-memory snapshots of an elastic job.
void read_snapshot(ObjectReader& top, JobConfig& cfg);
void validate_elasticity(JobConfig& cfg, bool resolved_given, Problems& problems);
// DeepSpeed sections and keys zerod recognises but does not support (unsupported_sections.cc)
void read_unsupported(ObjectReader& top);
// model (model_section.cc); data, train (zerod_sections.cc)
void read_model(ObjectReader& top, JobConfig& cfg);
// One model object at `path` (a job's "model", or a checkpoint manifest's copy of it). With
// load_hf_config, an init_from directory's config.json fills the keys the object does not give.
void read_model_object(const Json& obj, const std::string& path, ModelConfig& m, Problems& p,
                       bool load_hf_config);
// Mixture of experts (moe_section.cc): MixtralConfig's defaults and keys (model.type "mixtral"),
// the model's "moe" section (GPT-2 and the Llama family), and their rules against the job.
void set_mixtral_defaults(ModelConfig& m);
void read_mixtral_keys(ObjectReader& r, ModelConfig& m);
void read_moe_section(ObjectReader& model, ModelConfig& m);
void validate_moe(const JobConfig& cfg, Problems& problems);
void read_data(ObjectReader& top, JobConfig& cfg);
void read_train(ObjectReader& top, JobConfig& cfg);
// "resolved": derived values as job_to_json prints them (zerod_sections.cc). Call after
// derive_values(): world_size is taken, every other value must match what was derived.
void read_resolved(ObjectReader& top, JobConfig& cfg);

// parallelism, tensor_parallel (DeepSpeed's alias), sequence_parallel_size
// (parallelism_section.cc); validate_parallelism: its rules against the model.
void read_parallelism(ObjectReader& top, JobConfig& cfg);
void validate_parallelism(const JobConfig& cfg, Problems& problems);
// "parallelism.tensor T x parallelism.context C", with "parallelism.pipeline P x " before it
// when P > 1: the ranks of one model replica, for messages.
std::string model_ranks_text(const ParallelismConfig& p);

// Cross-field rules that need no world size (validate.cc).
void validate_job(const JobConfig& cfg, Problems& problems);
// The derived values that need no world size (validate.cc).
void derive_values(JobConfig& cfg);
// vocab_size rounded up to a multiple of 128 x tensor (Megatron's padding for tensor
// parallelism: every tensor rank holds an equal, 128-aligned slice).
int padded_vocab_size(int vocab_size, int tensor = 1);
// The rules that need the derived values (validate.cc): parallelism against the model.
void validate_derived(const JobConfig& cfg, Problems& problems);
// The groups of global ranks along each mesh axis for the resolved world (to_json.cc):
// {"tensor": [[0, 1], ...], "context": ..., "data": ..., "zero": (data x context)}; null when
// the config is not resolved for its parallelism.
Json rank_layout_json(const JobConfig& cfg);

// Canonical spellings shared by the readers and job_to_json.
const char* scheduler_type_name(SchedulerType t);
const char* warmup_type_name(WarmupType t);
const char* offload_device_name(OffloadDevice d);

}  // namespace zerod::config
