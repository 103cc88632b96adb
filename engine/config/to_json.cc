// job_to_json: every field of a JobConfig in the job file's own format, so `zerod check` shows
// each default and derived value and its output parses back to the same config. Derived values
// that are not keys of any section are printed under "resolved".
#include "comm/mesh.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "engine/config/sections.h"

namespace zerod {

namespace {

using config::Json;

template <class T>
Json optional_json(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// Only the parameters of the chosen type (the others are not keys of its params).
// DeepSpeed's 1-bit optimizers: the keys of the type only.
Json onebit_json(const OptimizerConfig& o) {
  const OnebitConfig& b = o.onebit;
  Json p = {{"lr", o.lr},
            {"betas", {o.beta1, o.beta2}},
            {"eps", o.eps},
            {"weight_decay", o.weight_decay},
            {"cuda_aware", b.cuda_aware},
            {"comm_backend_name", b.comm_backend_name}};
  if (o.type == "ZeroOneAdam") {
    p["var_freeze_step"] = b.var_freeze_step;
    p["var_update_scaler"] = b.var_update_scaler;
    p["local_step_scaler"] = b.local_step_scaler;
    p["local_step_clipper"] = b.local_step_clipper;
  } else {
    p["freeze_step"] = b.freeze_step;
  }
  if (o.type == "OneBitLamb") {
    p["max_coeff"] = b.max_coeff;
    p["min_coeff"] = b.min_coeff;
    p["coeff_beta"] = b.coeff_beta;
    p["factor_max"] = b.factor_max;
    p["factor_min"] = b.factor_min;
    p["factor_threshold"] = b.factor_threshold;
  }
  return {{"type", o.type}, {"params", p}};
}

Json optimizer_json(const OptimizerConfig& o) {
  if (o.type == "SGD") {
    return {{"type", o.type},
            {"params",
             {{"lr", o.lr},
              {"momentum", o.momentum},
              {"dampening", o.dampening},
              {"weight_decay", o.weight_decay},
              {"nesterov", o.nesterov}}}};
  }
  if (o.type == "Adagrad") {
    return {{"type", o.type},
            {"params",
             {{"lr", o.lr},
              {"lr_decay", o.lr_decay},
              {"weight_decay", o.weight_decay},
              {"initial_accumulator_value", o.initial_accumulator_value},
              {"eps", o.eps}}}};
  }
  if (o.type == "Muon") {
    return {{"type", o.type},
            {"params",
             {{"lr", o.lr},
              {"adam_lr", o.adam_lr},
              {"weight_decay", o.weight_decay},
              {"adam_weight_decay", o.adam_weight_decay},
              {"momentum", o.momentum},
              {"nesterov", o.nesterov},
              {"ns_coefficients", o.ns_coefficients},
              {"ns_eps", o.ns_eps},
              {"ns_steps", o.ns_steps},
              {"adjust_lr_fn", o.adjust_lr_fn},
              {"betas", {o.beta1, o.beta2}},
              {"eps", o.eps}}}};
  }
  if (o.type == "Lamb") {
    return {{"type", o.type},
            {"params",
             {{"lr", o.lr},
              {"betas", {o.beta1, o.beta2}},
              {"eps", o.eps},
              {"eps_inside_sqrt", o.eps_inside_sqrt},
              {"weight_decay", o.weight_decay},
              {"bias_correction", o.bias_correction},
              {"max_coeff", o.max_coeff},
              {"min_coeff", o.min_coeff}}}};
  }
  if (o.type == "Lion") {
    return {{"type", o.type},
            {"params",
             {{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"weight_decay", o.weight_decay}}}};
  }
  if (is_onebit_optimizer(o.type)) return onebit_json(o);
  return {{"type", o.type},
          {"params",
           {{"lr", o.lr},
            {"betas", {o.beta1, o.beta2}},
            {"eps", o.eps},
            {"weight_decay", o.weight_decay},
            {"bias_correction", o.bias_correction},
            {"adam_w_mode", o.adam_w_mode},
            {"torch_adam", o.torch_adam}}}};
}

// Only the parameters of the chosen schedule (the others are not keys of its params).
Json scheduler_json(const SchedulerConfig& s) {
  if (s.type == SchedulerType::kNone) return nullptr;
  Json p = Json::object();
  switch (s.type) {
    case SchedulerType::kWarmupDecayLR:
      p["total_num_steps"] = s.total_num_steps;
      [[fallthrough]];
    case SchedulerType::kWarmupLR:
      p["warmup_min_lr"] = s.warmup_min_lr;
      p["warmup_max_lr"] = s.warmup_max_lr;
      p["warmup_num_steps"] = s.warmup_num_steps;
      p["warmup_type"] = config::warmup_type_name(s.warmup_type);
      break;
    case SchedulerType::kWarmupCosineLR:
      p["total_num_steps"] = s.total_num_steps;
      p["warmup_min_ratio"] = s.warmup_min_ratio;
      p["warmup_num_steps"] = s.warmup_num_steps;
      p["cos_min_ratio"] = s.cos_min_ratio;
      p["warmup_type"] = config::warmup_type_name(s.warmup_type);
      break;
    case SchedulerType::kOneCycle:
      p["cycle_min_lr"] = s.cycle_min_lr;
      p["cycle_max_lr"] = s.cycle_max_lr;
      p["decay_lr_rate"] = s.decay_lr_rate;
      p["cycle_first_step_size"] = s.cycle_first_step_size;
      p["cycle_second_step_size"] = optional_json(s.cycle_second_step_size);
      p["cycle_first_stair_count"] = s.cycle_first_stair_count;
      p["cycle_second_stair_count"] = s.cycle_second_stair_count;
      p["decay_step_size"] = s.decay_step_size;
      p["cycle_momentum"] = s.cycle_momentum;
      p["cycle_min_mom"] = s.cycle_min_mom;
      p["cycle_max_mom"] = s.cycle_max_mom;
      p["decay_mom_rate"] = s.decay_mom_rate;
      break;
    case SchedulerType::kNone:
      break;
  }
  return {{"type", config::scheduler_type_name(s.type)}, {"params", p}};
}

Json nvme_path_json(const std::string& path) {
  return path.empty() ? Json(nullptr) : Json(path);
}

Json zero_json(const ZeroConfig& z) {
  const OffloadParamConfig& op = z.offload_param;
  const OffloadOptimizerConfig& oo = z.offload_optimizer;
  return {
      {"stage", z.stage},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_scatter", z.reduce_scatter},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"allgather_partitions", z.allgather_partitions},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"overlap_comm", optional_json(z.overlap_comm)},
      {"load_from_fp32_weights", z.load_from_fp32_weights},
      {"sub_group_size", z.sub_group_size},
      {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"stage3_max_live_parameters", z.stage3_max_live_parameters},
      {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
      {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
      {"round_robin_gradients", z.round_robin_gradients},
      {"offload_param",
       {{"device", config::offload_device_name(op.device)},
        {"nvme_path", nvme_path_json(op.nvme_path)},
        {"buffer_count", op.buffer_count},
        {"buffer_size", op.buffer_size},
        {"max_in_cpu", op.max_in_cpu},
        {"pin_memory", op.pin_memory}}},
      {"offload_optimizer",
       {{"device", config::offload_device_name(oo.device)},
        {"nvme_path", nvme_path_json(oo.nvme_path)},
        {"buffer_count", oo.buffer_count},
        {"pin_memory", oo.pin_memory},
        {"pipeline_read", oo.pipeline_read},
        {"pipeline_write", oo.pipeline_write},
        {"fast_init", oo.fast_init},
        {"ratio", oo.ratio}}},
  };
}

Json monitor_json(const MonitorConfig& m) {
  return {{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
}

}  // namespace

const char* train_device_name(TrainDevice d) {
  return d == TrainDevice::kCuda ? "cuda" : "cpu";
}

const char* device_comm_name(DeviceComm c) {
  switch (c) {
    case DeviceComm::kNccl:
      return "nccl";
    case DeviceComm::kGloo:
      return "gloo";
    case DeviceComm::kAuto:
      break;
  }
  return "auto";
}

bool device_comm_is_nccl(const JobConfig& cfg) {
  if (cfg.train.device != TrainDevice::kCuda) return false;
  switch (cfg.train.device_comm) {
    case DeviceComm::kNccl:
      return true;
    case DeviceComm::kGloo:
      return false;
    case DeviceComm::kAuto:
      break;
  }
  // auto: NCCL for a job that is data parallel only, without PowerSGD (whose hook has not run
  // over NCCL); Gloo with host staging for the rest.
  return cfg.parallelism.model_ranks() == 1 && cfg.parallelism.expert == 1 &&
         cfg.communication_compression.type.empty();
}

bool nccl_between_ranks(const JobConfig& cfg) {
  return cfg.world_size > 1 && device_comm_is_nccl(cfg);
}

namespace config {
Json rank_layout_json(const JobConfig& cfg) {
  const ParallelismConfig& p = cfg.parallelism;
  if (int64_t{cfg.data_parallel_size} * p.model_ranks() != cfg.world_size) return nullptr;
  const Mesh mesh(MeshShape{.pipeline = p.pipeline,
                            .data = cfg.data_parallel_size,
                            .context = p.context,
                            .tensor = p.tensor});
  Json out = {{"tensor", mesh.groups({MeshAxis::kTensor})},
              {"context", mesh.groups({MeshAxis::kContext})},
              {"data", mesh.groups({MeshAxis::kData})},
              {"zero", mesh.groups({MeshAxis::kData, MeshAxis::kContext})}};
  if (p.pipeline > 1) out["pipeline"] = mesh.groups({MeshAxis::kPipeline});
  return out;
}
}  // namespace config

namespace {
// GPT-2 with zerod's keys, the Llama family with Hugging Face config.json names.
Json data_json(const DataConfig& d) {
  Json train = d.train;
  if (!d.train_weights.empty()) {  // a blend
    train = Json::array();
    for (size_t i = 0; i < d.train.size(); ++i)
      train.push_back({{"path", d.train[i]}, {"weight", d.train_weights[i]}});
  }
  Json out = {{"train", train},
              {"val", d.val},
              {"val_fraction", d.val_fraction},
              {"seed", d.seed},
              {"shuffle", d.shuffle},
              {"document_masking", d.document_masking},
              {"eos_token_id", optional_json(d.eos_token_id)}};
  if (!d.tokenizer.empty()) out["tokenizer"] = d.tokenizer;
  return out;
}

Json moe_json(const MoeConfig& e) {
  return {{"num_experts", e.num_experts},
          {"top_k", e.top_k},
          {"capacity_factor", e.capacity_factor},
          {"eval_capacity_factor", e.eval_capacity_factor},
          {"min_capacity", e.min_capacity},
          {"drop_tokens", e.drop_tokens},
          {"aux_loss_coef", e.aux_loss_coef},
          {"router_z_loss_coef", e.router_z_loss_coef},
          {"moe_layer_frequency", e.moe_layer_frequency},
          {"shared_experts", e.shared_experts}};
}

Json model_json(const ModelConfig& m) {
  if (!m.llama_family()) {
    Json g = {{"type", m.type},
              {"n_layer", m.n_layer},
              {"n_head", m.n_head},
              {"n_embd", m.n_embd},
              {"vocab_size", m.vocab_size},
              {"seq_len", m.seq_len},
              {"init_from", optional_json(m.init_from)},
              {"activation_checkpointing", m.activation_checkpointing},
              {"init_std", m.init_std}};
    if (m.moe.num_experts > 0) g["moe"] = moe_json(m.moe);
    return g;
  }
  const Json rope = rope_scaling_json(model_spec(m).rope_scaling);
  Json j = {{"type", m.type},
            {"hidden_size", m.n_embd},
            {"intermediate_size", m.intermediate_size},
            {"num_hidden_layers", m.n_layer},
            {"num_attention_heads", m.n_head},
            {"num_key_value_heads", m.n_kv_head > 0 ? m.n_kv_head : m.n_head},
            {"head_dim", m.head_dim > 0 ? Json(m.head_dim) : Json(nullptr)},
            {"vocab_size", m.vocab_size},
            {"rms_norm_eps", m.rms_norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", rope},
            {"tie_word_embeddings", m.tie_word_embeddings},
            {"initializer_range", m.init_std}};
  if (m.max_position_embeddings > 0) j["max_position_embeddings"] = m.max_position_embeddings;
  if (m.type == "llama") {
    j["attention_bias"] = m.attention_bias;
    j["mlp_bias"] = m.mlp_bias;
  }
  if (m.type == "mistral" || m.type == "qwen2") {
    j["sliding_window"] = m.sliding_window > 0 ? Json(m.sliding_window) : Json(nullptr);
  }
  if (m.type == "qwen2") {
    j["use_sliding_window"] = m.use_sliding_window;
    j["max_window_layers"] = m.max_window_layers;
    if (!m.layer_types.empty()) j["layer_types"] = m.layer_types;
  }
  if (m.type == "mixtral") {
    j["num_local_experts"] = m.moe.num_experts;
    j["num_experts_per_tok"] = m.moe.top_k;
    j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
    j["output_router_logits"] = m.moe.output_router_logits;
  } else if (m.moe.num_experts > 0) {
    j["moe"] = moe_json(m.moe);
  }
  j["seq_len"] = m.seq_len;
  j["init_from"] = optional_json(m.init_from);
  j["activation_checkpointing"] = m.activation_checkpointing;
  return j;
}
}  // namespace

nlohmann::json job_to_json(const JobConfig& cfg) {
  const Fp16Config& f = cfg.fp16;
  const AioConfig& a = cfg.aio;
  const CheckpointConfig& ck = cfg.checkpoint;
  const ActivationCheckpointingConfig& ac = cfg.activation_checkpointing;
  const CommsLoggerConfig& cl = cfg.comms_logger;
  const ModelConfig& m = cfg.model;
  const DataConfig& d = cfg.data;
  const TrainConfig& t = cfg.train;
  Json j = {
      {"train_batch_size", optional_json(cfg.train_batch_size)},
      {"train_micro_batch_size_per_gpu", optional_json(cfg.train_micro_batch_size_per_gpu)},
      {"gradient_accumulation_steps", optional_json(cfg.gradient_accumulation_steps)},
      {"steps_per_print", cfg.steps_per_print},
      {"wall_clock_breakdown", cfg.wall_clock_breakdown},
      {"dump_state", cfg.dump_state},
      {"gradient_clipping", cfg.gradient_clipping},
      {"prescale_gradients", cfg.prescale_gradients},
      {"gradient_predivide_factor", cfg.gradient_predivide_factor},
      {"optimizer", optimizer_json(cfg.optimizer)},
      {"scheduler", scheduler_json(cfg.scheduler)},
      {"fp16",
       {{"enabled", f.enabled},
        {"auto_cast", f.auto_cast},
        {"loss_scale", f.loss_scale},
        {"initial_scale_power", f.initial_scale_power},
        {"loss_scale_window", f.loss_scale_window},
        {"hysteresis", f.hysteresis},
        {"consecutive_hysteresis", f.consecutive_hysteresis},
        {"min_loss_scale", f.min_loss_scale}}},
      {"bf16", {{"enabled", cfg.bf16.enabled}}},
      {"zero_optimization", zero_json(cfg.zero)},
      {"aio",
       {{"block_size", a.block_size},
        {"queue_depth", a.queue_depth},
        {"intra_op_parallelism", a.intra_op_parallelism},
        {"single_submit", a.single_submit},
        {"overlap_events", a.overlap_events},
        {"use_gds", a.use_gds}}},
      {"checkpoint",
       {{"tag_validation", ck.tag_validation},
        {"load_universal", ck.load_universal},
        {"use_node_local_storage", ck.use_node_local_storage},
        {"async", ck.async}}},
      {"activation_checkpointing",
       {{"partition_activations", ac.partition_activations},
        {"cpu_checkpointing", ac.cpu_checkpointing},
        {"contiguous_memory_optimization", ac.contiguous_memory_optimization},
        {"number_checkpoints", optional_json(ac.number_checkpoints)},
        {"synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary},
        {"profile", ac.profile}}},
      {"csv_monitor", monitor_json(cfg.csv_monitor)},
      {"tensorboard", monitor_json(cfg.tensorboard)},
      {"comms_logger",
       {{"enabled", cl.enabled},
        {"verbose", cl.verbose},
        {"prof_all", cl.prof_all},
        {"debug", cl.debug},
        {"prof_ops", cl.prof_ops}}},
      {"model", model_json(m)},
      {"data", data_json(d)},
      {"train",
       {{"steps", t.steps},
        {"device", train_device_name(t.device)},
        {"device_comm", device_comm_name(t.device_comm)},
        {"checkpoint_dir", t.checkpoint_dir},
        {"save_interval", t.save_interval},
        {"keep_last", t.keep_last},
        {"eval_interval", t.eval_interval},
        {"eval_batches", t.eval_batches},
        {"seed", t.seed},
        {"peak_flops", t.peak_flops},
        {"memory_limit", t.memory_limit},
        {"collective_timeout", t.collective_timeout},
        {"rendezvous_timeout", t.rendezvous_timeout},
        {"allow_batch_change", t.allow_batch_change}}},
      {"parallelism",
       {{"tensor", cfg.parallelism.tensor},
        {"sequence_parallel", cfg.parallelism.sequence_parallel},
        {"context", cfg.parallelism.context},
        {"context_impl", cfg.parallelism.context_impl},
        {"expert", cfg.parallelism.expert},
        {"pipeline", cfg.parallelism.pipeline},
        {"pipeline_schedule", cfg.parallelism.pipeline_schedule},
        {"virtual_stages", cfg.parallelism.virtual_stages},
        {"pipeline_partition", cfg.parallelism.pipeline_partition == "explicit"
                                   ? Json(cfg.parallelism.pipeline_layers)
                                   : Json(cfg.parallelism.pipeline_partition)}}},
      {"resolved",
       {{"world_size", cfg.world_size},
        {"compute_dtype", std::string(dtype_name(cfg.compute_dtype()))},
        {"padded_vocab_size", m.padded_vocab_size},
        {"overlap_comm", cfg.zero.overlap_comm_resolved},
        {"data_parallel_size", cfg.data_parallel_size},
        {"layout", config::rank_layout_json(cfg)}}},
  };
  const CommCompressionConfig& cc = cfg.communication_compression;
  if (!cc.type.empty()) {
    j["communication_compression"] = {
        {"type", cc.type},
        {"rank", cc.powersgd.rank},
        {"start_iter", cc.powersgd.start_iter},
        {"min_compression_rate", cc.powersgd.min_compression_rate},
        {"use_error_feedback", cc.powersgd.use_error_feedback},
        {"warm_start", cc.powersgd.warm_start},
        {"orthogonalization_epsilon", cc.powersgd.orthogonalization_epsilon},
        {"random_seed", cc.powersgd.random_seed}};
  }
  // Only when it says something (a DeepSpeed file rarely has one; a disabled one that sets keys
  // keeps them).
  const ElasticityConfig& e = cfg.elasticity;
  if (!(e == ElasticityConfig{})) {
    j["elasticity"] = {{"enabled", e.enabled},
                       {"max_train_batch_size", e.max_train_batch_size},
                       {"micro_batch_sizes", e.micro_batch_sizes},
                       {"min_gpus", e.min_gpus},
                       {"max_gpus", e.max_gpus},
                       {"min_time", e.min_time},
                       {"version", e.version},
                       {"prefer_larger_batch", e.prefer_larger_batch},
                       {"ignore_non_elastic_batch_info", e.ignore_non_elastic_batch_info},
                       {"num_gpus_per_node", e.num_gpus_per_node},
                       {"model_parallel_size", e.model_parallel_size}};
  }
  if (cfg.snapshot.enabled) {
    j["snapshot"] = {
        {"enabled", true}, {"interval", cfg.snapshot.interval}, {"dir", cfg.snapshot.dir}};
  }
  return j;
}

}  // namespace zerod
