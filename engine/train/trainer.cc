#include "engine/train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "comm/collective_log.h"
#include "comm/gloo/gloo_groups.h"
#include "comm/staged/staged_communicator.h"
#include "comm/strings.h"
#include "core/error.h"
#include "core/file_write.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/config/input_limits.h"
#include "engine/config/model_spec.h"
#include "engine/data/eval_loader.h"
#include "engine/data/loader.h"
#include "engine/data/train_val.h"
#include "engine/plan/pipeline_plan.h"
#include "engine/runtime/signals.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/memory_preflight.h"
#include "engine/train/memory_snapshot.h"
#include "engine/train/offload_preflight.h"
#include "engine/train/peak_flops.h"
#include "engine/train/rank_device.h"
#include "model/shard.h"
#include "parallel/cp_exchange.h"
#include "parallel/expert_exchange.h"
#include "parallel/pipeline/runner.h"
#include "parallel/pipeline/tied_grads.h"
#include "parallel/pipeline/trace.h"
#include "parallel/tp_exchange.h"
#include "parallel/tp_grads.h"
#include "zero/loss_scaler.h"

namespace zerod {

struct Trainer::Data {
  std::optional<DataLoader> train;
  std::optional<EvalLoader> val;
  std::vector<int32_t> inputs, targets;  // (B,T)
  // Pipeline parallelism: every micro-batch of a step ((B,T) each), handed to the runner.
  std::vector<std::vector<int32_t>> step_inputs, step_targets;
  std::vector<pipeline::MicroBatch> micro_batches;
  std::optional<LrSchedule> schedule;
  std::optional<LossScaler> scaler;
};

namespace {

std::string human_count(double x) {
  if (x >= 1e9) return fmt::format("{:.2f}B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}K", x / 1e3);
  return fmt::format("{:.0f}", x);
}
// Muon's settings (os.lr: the scheduled lr of the hidden matrices): the auxiliary AdamW's lr
// follows the same schedule, scaled by adam_lr / lr.
void set_muon_step(const OptimizerConfig& o, OptimStep& os) {
  os.adam_lr = o.lr > 0 ? o.adam_lr * (os.lr / o.lr) : o.adam_lr;
  os.adam_weight_decay = o.adam_weight_decay;
  os.ns.a = static_cast<float>(o.ns_coefficients.at(0));
  os.ns.b = static_cast<float>(o.ns_coefficients.at(1));
  os.ns.c = static_cast<float>(o.ns_coefficients.at(2));
  os.ns.eps = static_cast<float>(o.ns_eps);
  os.ns.steps = o.ns_steps;
  os.adjust_lr = o.adjust_lr_fn == "match_rms_adamw" ? cpu::MuonLrAdjust::kMatchRmsAdamw
                                                     : cpu::MuonLrAdjust::kOriginal;
}

}  // namespace

namespace {
// The options of this rank's world communicator, for the factories of its sub-groups.
GlooOptions world_gloo_options(const RankContext& ctx) {
  GlooOptions world;
  world.rank = ctx.rank;
  world.size = ctx.world_size;
  world.store = ctx.store;
  world.bind_address = ctx.bind_address;
  world.timeout = ctx.timeout;
  world.monitor = ctx.monitor;
  world.first_local_rank = ctx.rank - ctx.local_rank;  // (a node-scoped throttle's own ranks)
  world.local_ranks = ctx.local_world_size;
  return world;
}
}  // namespace

Communicator& Trainer::device_tensors(Communicator& c) {
  if (!backend_->device_memory()) return c;
  std::unique_ptr<Communicator>& staged = staged_comms_[&c];
  if (!staged) {
    Backend* be = backend_.get();
    staged = make_staged_communicator(
        c, [be](void* dst, const void* src, size_t bytes) { be->copy(dst, src, bytes); });
  }
  return *staged;
}

void Trainer::make_expert_group() {
  // DeepSpeed-MoE's groups over the data-parallel ranks (MoE runs without context parallelism;
  // with tensor parallelism the data-parallel ranks hold one tensor slice of every expert, so
  // each slice is dispatched among its holders; with pipelines, over the data-parallel ranks of
  // this rank's stage): the
  // expert-parallel group of data-parallel rank d is the E consecutive ones [E floor(d/E),
  // E floor(d/E) + E) (one copy of every expert between them; d stores experts d mod E of E);
  // the expert-data-parallel group, the DP/E ranks with the same d mod E, stores the same
  // experts, which ZeRO partitions and reduces over it.
  const int E = cfg_.parallelism.expert;
  const ProcessGroup& dp = groups_->zero();
  const int dp_size = dp.size(), d = dp.rank();
  ZD_CHECK_INPUT(dp_size % E == 0 && !device_comm_, "parallelism.expert {} over {} ranks{}", E,
                 dp_size,
                 device_comm_ ? " on train.device cuda (CPU ranks only)" : " (must divide them)");
  Communicator* comm = &dp.comm();
  if (E < dp_size) {
    std::vector<int> ranks, data_ranks;
    const int first = d / E * E;
    for (int i = 0; i < E; ++i) ranks.push_back(dp.global_rank(first + i));
    for (int j = d % E; j < dp_size; j += E) data_ranks.push_back(dp.global_rank(j));
    GlooGroupFactory factory(world_gloo_options(ctx_), "ep");
    expert_comm_ =
        factory.make("expert." + std::to_string(ranks.front()), "expert", ranks, d - first);
    comm = expert_comm_.get();
    expert_data_comm_ = factory.make("expert_data." + std::to_string(data_ranks.front()),
                                     "expert_data", data_ranks, d / E);
  }
  expert_exchange_ = std::make_unique<ExpertParallelExchange>(device_tensors(*comm), *backend_);
  for_each_model([&](Model& m) { m.set_expert_exchange(expert_exchange_.get()); });
}

Trainer::Trainer(JobConfig cfg, RankContext ctx, TrainerOptions options)
    : cfg_(std::move(cfg)),
      ctx_(ctx),
      options_(std::move(options)),
      data_(std::make_unique<Data>()) {
  ZD_CHECK(cfg_.world_size == ctx_.world_size,
           "the job was resolved for world size {} but this rank is one of {}", cfg_.world_size,
           ctx_.world_size);
  ZD_CHECK(ctx_.world_size == 1 || ctx_.comm != nullptr, "rank {} of {} has no communicator",
           ctx_.rank, ctx_.world_size);
  const ModelSpec spec = model_spec(cfg_.model);
  const int B = static_cast<int>(cfg_.micro_batch());
  const int T = cfg_.model.seq_len;
  const ParallelismConfig& par = cfg_.parallelism;
  const Mesh mesh(MeshShape{.pipeline = par.pipeline,
                            .data = cfg_.data_parallel_size,
                            .context = par.context,
                            .tensor = par.tensor});
  ZD_CHECK(mesh.world() == ctx_.world_size, "mesh {} for a world of {}", mesh.describe(),
           ctx_.world_size);

  // Data first: bad data files are the most common error and cost nothing to find. Every rank
  // of a data-parallel replica (its tensor x context group) reads the same micro-batches (a
  // context-parallel model keeps its positions of them).
  const int dp = cfg_.data_parallel_size, dp_rank = mesh.coord(ctx_.rank).data;
  // The job's tokenizer before its shards: one with more ids than the model is the reason
  // shards made with it hold tokens the model cannot embed (it goes into every checkpoint).
  tokenizer_ = load_job_tokenizer(cfg_);
  TrainValData tv = open_train_val(cfg_.data.train, cfg_.data.val, cfg_.data.val_fraction, T,
                                   cfg_.model.vocab_size, cfg_.data.train_weights);
  data_->train.emplace(std::move(tv.train), cfg_.data.seed, cfg_.data.shuffle, cfg_.global_batch(),
                       B, dp, dp_rank, std::move(tv.train_source_samples), cfg_.data.train_weights);
  if (tv.val) data_->val.emplace(std::move(*tv.val), B, dp, dp_rank);
  // An unusable checkpoint_dir fails now, not at the first save hundreds of steps in (probed
  // where it is or would be created; nothing is created before the first save).
  if (!cfg_.train.checkpoint_dir.empty()) {
    probe_checkpoint_dir(cfg_.train.checkpoint_dir, "train.checkpoint_dir", /*create=*/false,
                         fmt::format("{}-rank{}", ::getpid(), ctx_.rank));
  }
  data_->inputs.resize(static_cast<size_t>(B) * T);
  data_->targets.resize(static_cast<size_t>(B) * T);
  data_->schedule.emplace(cfg_.scheduler, cfg_.optimizer);
  data_->scaler.emplace(cfg_.fp16);

  if (options_.backend) {
    backend_ = options_.backend();
  } else {
    RankDevice device = make_rank_device(cfg_, ctx_);
    backend_ = std::move(device.backend);
    device_comm_ = std::move(device.device_comm);
  }
  // Host memory: refuse now, with what would fit, rather than meet the OOM killer later.
  if (!backend_->device_memory()) {
    host_memory_preflight(cfg_, spec, ctx_.local_world_size,
                          static_cast<int>(backend_->compute_elem_size()),
                          host_memory_available(cfg_.train.memory_limit));
  }
  // The mesh's process groups: sub-communicators of the world (a group as large as the world is
  // the world's communicator, so a job without `parallelism` runs exactly as before).
  if (ctx_.world_size > 1 && mesh.shape().data < ctx_.world_size) {
    ZD_CHECK_INPUT(!device_comm_,
                   "parallelism.tensor {} x context {} x pipeline {} with train.device_comm nccl: "
                   "NCCL sub-groups are not enabled yet (train.device_comm auto or gloo runs them "
                   "over Gloo with host staging)",
                   par.tensor, par.context, par.pipeline);
    GlooGroupFactory factory(world_gloo_options(ctx_));
    groups_ = std::make_unique<ProcessGroups>(mesh, ctx_.rank, ctx_.comm, &factory);
  } else {
    groups_ = std::make_unique<ProcessGroups>(mesh, ctx_.rank, ctx_.comm, nullptr);
  }
  const ProcessGroup& tensor = groups_->tensor();
  const ProcessGroup& context = groups_->context();
  // Pipeline parallelism: this rank's stages (the partition's layers of its pipeline rank: V of
  // them with an interleaved schedule) with activation slots for what its schedule keeps live.
  std::vector<LayerRange> chunks{LayerRange{}};
  pipeline::Schedule schedule;
  const int V = par.virtual_stages;
  if (pipeline_stages() > 1) {
    const PipelinePlan plan = make_pipeline_plan(cfg_);
    chunks.clear();
    for (int c = 0; c < V; ++c) {
      const PipelineStagePlan& sp = plan.stages.at(
          static_cast<size_t>(pipeline::global_stage(groups_->pipeline().rank(), c, plan.ranks)));
      chunks.push_back(LayerRange{sp.first_layer, sp.first_layer + sp.layers});
    }
    pipeline::ScheduleKind kind{};
    ZD_CHECK(pipeline::parse_schedule_name(par.pipeline_schedule, kind), "schedule {}",
             par.pipeline_schedule);
    schedule =
        pipeline::make_schedule(kind, pipeline_stages(), static_cast<int>(cfg_.grad_accum()), V);
  }
  const std::vector<pipeline::Action>* actions =
      schedule.empty() ? nullptr : &schedule.at(static_cast<size_t>(groups_->pipeline().rank()));
  TensorShard tshard{tensor.rank(), tensor.size(), par.sequence_parallel};
  if (par.expert > 1) {  // (make_expert_group: the expert-parallel rank of data-parallel rank d)
    tshard.expert_rank = groups_->zero().rank() % par.expert;
    tshard.expert_size = par.expert;
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int slots = actions ? pipeline::slots_needed(*actions, static_cast<int>(c)) : 1;
    auto m = make_model(spec, *backend_, B, T, cfg_.model.activation_checkpointing, &memory_,
                        tshard, ContextShard{context.rank(), context.size()}, chunks[c], slots);
    if (c == 0) {
      model_ = std::move(m);
    } else {
      chunk_models_.push_back(std::move(m));
    }
  }
  if (chunks.size() > 1) {
    rank_layout_ =
        std::make_unique<ParamLayout>(spec, model_->layout().align_elems(), tshard, chunks);
    std::vector<Model*> models;
    for_each_model([&](Model& m) { models.push_back(&m); });
    runner_ = std::make_unique<pipeline::PipelineRunner>(
        *actions, models, *rank_layout_, *backend_, &device_tensors(groups_->pipeline().comm()),
        &memory_);
  } else if (actions) {
    runner_ = std::make_unique<pipeline::PipelineRunner>(
        *actions, *model_, *backend_, &device_tensors(groups_->pipeline().comm()), &memory_);
  }
  if (cfg_.data.document_masking) {  // (validated: no context split; an EOS id in the vocabulary
                                     // or data.tokenizer)
    std::optional<int64_t> eos = cfg_.data.eos_token_id;
    if (!eos && tokenizer_ && tokenizer_->tokenizer->eos_id()) eos = *tokenizer_->tokenizer->eos_id();
    ZD_CHECK_INPUT(eos.has_value(),
                   "data.document_masking: no data.eos_token_id, and data.tokenizer '{}' ({}) has "
                   "no EOS token to end documents; give data.eos_token_id",
                   cfg_.data.tokenizer, tokenizer_ ? tokenizer_->tokenizer->describe() : "none");
    for_each_model([&](Model& m) { m.set_document_masking(static_cast<int32_t>(*eos)); });
  }
  if (tensor.size() > 1) {
    exchange_ = std::make_unique<TensorParallelExchange>(device_tensors(tensor.comm()), *backend_,
                                                         par.sequence_parallel);
  }
  if (context.size() > 1) {
    // Context parallelism: the attention over the context group; the tensor group's points go
    // to the tensor-parallel exchange.
    context_exchange_ = std::make_unique<ContextParallelExchange>(
        device_tensors(context.comm()), *backend_, parse_context_impl(par.context_impl),
        exchange_.get(), &memory_);
  }
  if (par.expert > 1) make_expert_group();
  if (Exchange* ex = context_exchange_ ? context_exchange_.get() : exchange_.get()) {
    for_each_model([&](Model& m) { m.set_exchange(ex); });
  }
  offload_preflight(cfg_, ctx_, layout(), static_cast<int64_t>(backend_->compute_elem_size()));
  ZeroOptions zo;
  zo.stage = cfg_.zero.stage;
  // ZeRO over the data x context group (a context-parallel rank's gradients are partial sums
  // over its positions, summed there with the data-parallel replicas'); the gradient norm also
  // over the tensor group. Not over tensor x context: ZeRO's reduction already made the context
  // ranks' gradients one (stage 0: identical on each, 1-3: disjoint shards summed over data x
  // context), so summing over context again would count each element C times.
  zo.world_size = groups_->zero().size();
  zo.rank = groups_->zero().rank();
  zo.comm = device_comm_
                ? device_comm_.get()
                : (ctx_.world_size > 1 ? &device_tensors(groups_->zero().comm()) : nullptr);
  // (tensor x pipeline: the stages hold disjoint units, each counted once; a last stage's tied
  // embedding copy is left out, ParamLayout::counted_in_norm.)
  if (ctx_.world_size > 1) zo.host_comm = &groups_->zero().comm();
  if (tensor.size() > 1) zo.host_tensor_comm = &tensor.comm();
  if (tensor.size() > 1 || pipeline_stages() > 1) {
    zo.model_parallel_comm = &device_tensors(groups_->model_norm().comm());
    zo.host_model_parallel_comm = &groups_->model_norm().comm();
  }
  zo.reduce_bucket_size = cfg_.zero.reduce_bucket_size;
  zo.allgather_bucket_size = cfg_.zero.allgather_bucket_size;
  zo.overlap_comm = cfg_.zero.overlap_comm_resolved;
  zo.prefetch_bucket_size = cfg_.zero.stage3_prefetch_bucket_size;
  zo.param_persistence_threshold = cfg_.zero.stage3_param_persistence_threshold;
  zo.max_live_parameters = cfg_.zero.stage3_max_live_parameters;
  if (par.expert > 1) {  // (make_expert_group's groups)
    zo.expert_world_size = zo.world_size / par.expert;
    zo.expert_rank = zo.rank / par.expert;
    zo.expert_comm = expert_data_comm_ ? &device_tensors(*expert_data_comm_) : nullptr;
    zo.host_expert_comm = expert_data_comm_ ? expert_data_comm_.get() : nullptr;
    zo.expert_parallel_comm = expert_comm_ ? &device_tensors(*expert_comm_) : zo.comm;
  }
  if (const CommCompressionConfig& cc = cfg_.communication_compression; cc.type == "powersgd") {
    zo.powersgd = cc.powersgd;
  }
  const OffloadOptimizerConfig& oo = cfg_.zero.offload_optimizer;
  if (oo.device == OffloadDevice::kCpu) zo.optimizer_states = StatesHome::kHost;
  if (oo.device == OffloadDevice::kNvme) {
    zo.optimizer_states = StatesHome::kNvme;
    zo.swap_path = optimizer_swap_path(oo.nvme_path, ctx_.rank);
    zo.swap = swap_options(cfg_);
  }
  zo.offload_ratio = oo.ratio;
  const OffloadParamConfig& op = cfg_.zero.offload_param;
  if (op.device == OffloadDevice::kCpu) zo.param_states = StatesHome::kHost;
  if (op.device == OffloadDevice::kNvme) {
    zo.param_states = StatesHome::kNvme;
    zo.param_swap_path = param_swap_path(op.nvme_path, ctx_.rank);
  }
  zo.param_buffer_size = op.buffer_size;
  zo.param_max_in_cpu = op.max_in_cpu;
  zo.param_pin_memory = op.pin_memory;
  zo.param_aio = swap_options(cfg_).aio;
  zo.onebit = onebit_kind(cfg_.optimizer.type);
  zo.onebit_config = cfg_.optimizer.onebit;
  const bool muon_at_stage0 = cfg_.optimizer.type == "Muon" && zo.stage == 0;
  const bool states_kept_on_host =
      (zo.onebit != OnebitKind::kNone || muon_at_stage0) && backend_->device_memory();
  if (states_kept_on_host) {
    // GPU ranks: the 1-bit optimizers' states and update on the host (zero/onebit.h), and
    // Muon's at stage 0 (its Newton-Schulz runs there; stages 1-3 offload them by config).
    zo.optimizer_states = StatesHome::kHost;
    zo.offload_ratio = 1.0;
  }
  const ProcessGroup& pipe = groups_->pipeline();
  if (pipeline_stages() > 1 && spec.tied() &&
      (pipe.rank() == 0 || pipe.rank() == pipe.size() - 1)) {
    // The first stage's embedding and the last stage's head copy: one gradient, summed once each
    // stage has reduced its own over the data-parallel group.
    tied_ = std::make_unique<pipeline::TiedEmbeddingGrads>(device_tensors(pipe.comm()), *backend_,
                                                           &memory_);
    zo.after_reduce = [this](ZeroEngine& e) {
      const int u = e.layout().embedding_unit();
      tied_->sum(e.grad_shard(u), e.partition().unit(u).shard);
    };
  }
  engine_ = std::make_unique<ZeroEngine>(layout(), *backend_, zo, &memory_);
  if (tensor.size() > 1)
    tp_grads_ = std::make_unique<TensorParallelGrads>(layout(), *engine_, *backend_,
                                                      &device_tensors(tensor.comm()));
  if (cfg_.model.init_from) {
    // Fine-tuning: every rank reads the file and keeps its shard of each unit (tensor-parallel:
    // of its part of each unit).
    Stopwatch sw;
    const ParamLayout global(spec);
    const ParamLayout& local = layout();
    std::vector<int> local_unit(static_cast<size_t>(global.num_units()), -1);  // (pipeline stage)
    for (int u = 0; u < local.num_units(); ++u)
      local_unit[static_cast<size_t>(local.global_unit(u))] = u;
    std::vector<float> part;
    import_hf_model(*cfg_.model.init_from, global, [&](int g, const float* flat) {
      const int u = local_unit[static_cast<size_t>(g)];
      if (u < 0) return;  // another stage's
      if (local.shard() == TensorShard{}) return engine_->set_master_unit(u, flat);
      part.resize(static_cast<size_t>(local.unit(u).numel));
      shard_unit(global, local, u, flat, part.data());
      engine_->set_master_unit(u, part.data());
    });
    engine_->refresh_weights();
    if (leader())
      spdlog::info("init_from: weights from {} ({:.2f} s)", *cfg_.model.init_from, sw.seconds());
  } else {
    engine_->init_weights(cfg_.train.seed);
  }
  for_each_model([&](Model& m) { m.set_timing(cfg_.wall_clock_breakdown); });
  if (!cfg_.train.checkpoint_dir.empty()) {
    ckpt_ = std::make_unique<Checkpointer>(cfg_, ctx_, *engine_, &memory_,
                                           tokenizer_ ? &*tokenizer_ : nullptr);
  }
  std::string peak_source = "train.peak_flops";
  peak_flops_ = cfg_.train.peak_flops;
  if (peak_flops_ <= 0 && backend_->device_memory()) {
    peak_flops_ = gpu_peak_flops(backend_->device_name(), cfg_.compute_dtype());
    peak_source = peak_flops_ > 0 ? backend_->device_name() + " datasheet"
                                  : "unknown GPU: set train.peak_flops for MFU";
  } else if (peak_flops_ <= 0) {
    // The hardware's peak (an upper bound); a start-up sgemm only where the clock is unknown.
    peak_flops_ = cpu_hardware_peak_flops(omp_get_max_threads(), &peak_source);
    if (peak_flops_ <= 0) {
      peak_flops_ = measure_cpu_peak_flops();
      peak_source = "sgemm measured now (the CPU clock is unknown; set train.peak_flops)";
    }
  }

  if (options_.log_steps) {
    if (leader()) {
      spdlog::info(
          "model: {} {} layers, {} heads ({} KV), {} wide, MLP {}, vocab {} (padded {}), seq {}: "
          "{} "
          "parameters",
          model_arch_name(spec.arch), spec.n_layer, spec.n_head, spec.kv_heads(), spec.n_embd,
          spec.ffn(), spec.vocab_size, spec.vp(), spec.seq_len,
          human_count(static_cast<double>(spec.num_parameters())));
      if (spec.moe.enabled()) spdlog::info("{}", describe_moe(spec));
      spdlog::info(
          "batch: {} sequences/step = micro-batch {} x accumulation {} x data-parallel {}{}; {} "
          "tokens/step; {}; ZeRO stage {}{}",
          cfg_.global_batch(), cfg_.micro_batch(), cfg_.grad_accum(), cfg_.data_parallel_size,
          mesh.shape().data < ctx_.world_size ? fmt::format(" (mesh {})", mesh.describe()) : "",
          cfg_.global_batch() * T, dtype_name(cfg_.compute_dtype()), cfg_.zero.stage,
          zo.overlap_comm ? " (overlap_comm)" : "");
      if (states_kept_on_host) {
        spdlog::info(
            "optimizer {}: its states and update in host memory (12 bytes a parameter), the "
            "gradients copied there each step; {} over Gloo",
            cfg_.optimizer.type,
            muon_at_stage0 ? "the matrices' results" : "the compressed momenta");
      }
      if (!staged_comms_.empty()) {
        spdlog::info(
            "device tensors between ranks: through host memory over Gloo ({} group "
            "communicator{}; train.device_comm {}: {})",
            staged_comms_.size(), staged_comms_.size() == 1 ? "" : "s",
            device_comm_name(cfg_.train.device_comm),
            cfg_.train.device_comm == DeviceComm::kGloo ? "asked for"
            : options_.backend ? "the given backend has no device communicator"
            : cfg_.parallelism.model_ranks() == 1 && par.expert == 1
                ? "the PowerSGD hook has not run over NCCL"
                : "NCCL sub-groups for tensor, context and pipeline parallelism are not enabled "
                  "yet");
      }
      spdlog::info("data: {} training samples{}", data_->train->dataset().num_samples(),
                   data_->val ? fmt::format(", {} validation micro-batches per rank",
                                            data_->val->num_micro_batches())
                              : std::string());
      if (const BlendSampler* blend = data_->train->blend()) {
        // The realised proportions: of every kBlendBlock stream positions, and of this run's.
        for (const std::string& line :
             describe_blend(*blend, cfg_.data.train, cfg_.data.train_weights,
                            cfg_.train.steps * cfg_.global_batch())) {
          spdlog::info("data blend: {}", line);
        }
      }
    }
    spdlog::info("{}", engine_->memory_report());
    spdlog::info("memory: {:.1f} MiB in all; MFU against {:.1f} GFLOP/s per rank ({}); device {}",
                 static_cast<double>(memory_.total()) / (1 << 20), peak_flops_ / 1e9, peak_source,
                 backend_->device_memory() ? backend_->device_name() : std::string("cpu"));
  }
}

Trainer::~Trainer() = default;

StepMetrics Trainer::train_step(int64_t step) {
  Stopwatch step_sw;
  StepMetrics m;
  m.step = step;
  const int64_t accum = cfg_.grad_accum();
  LossScaler& scaler = *data_->scaler;
  const double loss_scale = scaler.scale();
  engine_->zero_grad();
  // (NVMe offload I/O of this step only: not the initial writes, not checkpoints.)
  const double io_before = engine_->offload_io_seconds();
  double loss_sum = 0;
  if (runner_) {
    // Pipeline: the step's micro-batches first (every stage of a replica reads the same ones),
    // then this rank's schedule over them.
    Stopwatch sw;
    Data& d = *data_;
    d.step_inputs.resize(static_cast<size_t>(accum));
    d.step_targets.resize(static_cast<size_t>(accum));
    d.micro_batches.clear();
    for (int64_t micro = 0; micro < accum; ++micro) {
      std::vector<int32_t>& in = d.step_inputs[static_cast<size_t>(micro)];
      std::vector<int32_t>& tg = d.step_targets[static_cast<size_t>(micro)];
      in.resize(d.inputs.size());
      tg.resize(d.targets.size());
      d.train->next_micro_batch(in.data(), tg.data());
      d.micro_batches.push_back({in.data(), tg.data()});
    }
    phases_.data += sw.seconds();
    sw.restart();
    const double comm_before = engine_->comm_wait_seconds();
    // (Context ranks weighted C times, as below.)
    const float weight =
        static_cast<float>(loss_scale * model_->context().size / static_cast<double>(accum));
    GradSink& grads = tp_grads_ ? *tp_grads_ : static_cast<GradSink&>(*engine_);
    loss_sum = runner_->run(d.micro_batches, *engine_, grads, weight,
                            [&](int micro) { engine_->begin_micro_batch(micro + 1 == accum); });
    const double comm = engine_->comm_wait_seconds() - comm_before;
    phases_.fwd_bwd += sw.seconds() - comm;
    phases_.comm += comm;
  } else {
    const MoeSpec& moe_spec = model_->spec().moe;
    std::optional<MoeMetricsAccumulator> moe;
    if (moe_spec.enabled()) moe.emplace(moe_spec.top_k);
    for (int64_t micro = 0; micro < accum; ++micro) {
      engine_->begin_micro_batch(micro + 1 == accum);
      Stopwatch sw;
      data_->train->next_micro_batch(data_->inputs.data(), data_->targets.data());
      phases_.data += sw.seconds();
      sw.restart();
      const double comm_before = engine_->comm_wait_seconds();
      // ZeRO divides the gradients summed over data x context by its size; the context ranks'
      // partial gradients add up to their replica's (not C of them), so each is weighted C times.
      const float weight =
          static_cast<float>(loss_scale * model_->context().size / static_cast<double>(accum));
      GradSink& grads = tp_grads_ ? *tp_grads_ : static_cast<GradSink&>(*engine_);
      loss_sum += model_->forward_backward(data_->inputs.data(), data_->targets.data(), *engine_,
                                           grads, weight);
      if (moe) moe->add(model_->moe_stats());
      const double comm = engine_->comm_wait_seconds() - comm_before;
      phases_.fwd_bwd += sw.seconds() - comm;
      phases_.comm += comm;
    }
    // (Over the world: the context ranks route their own rows, the tensor ranks the same rows
    // alike, counted once. Pipeline stages' MoE blocks are not reported yet.)
    if (moe)
      m.moe = moe->reduce(ctx_.world_size > 1 ? ctx_.comm : nullptr, ctx_.world_size,
                          model_->layout().shard().size);
  }
  const double comm_before = engine_->comm_wait_seconds();
  Stopwatch opt_sw;
  const LrSchedule& sched = *data_->schedule;
  OptimStep os;
  os.lr = sched.lr(steps_taken_);
  os.beta1 = sched.beta1(steps_taken_);
  os.beta2 = sched.beta2(steps_taken_);
  os.eps = cfg_.optimizer.eps;
  os.weight_decay = cfg_.optimizer.weight_decay;
  os.adam_w_mode = cfg_.optimizer.adam_w_mode;
  os.bias_correction = cfg_.optimizer.bias_correction;
  os.kind = optimizer_kind(cfg_.optimizer.type);
  os.momentum = cfg_.optimizer.momentum;
  os.dampening = cfg_.optimizer.dampening;
  os.nesterov = cfg_.optimizer.nesterov;
  os.lr_decay = cfg_.optimizer.lr_decay;
  os.initial_accumulator_value = cfg_.optimizer.initial_accumulator_value;
  if (os.kind == OptimizerKind::kMuon) set_muon_step(cfg_.optimizer, os);
  os.max_coeff = cfg_.optimizer.max_coeff;
  os.min_coeff = cfg_.optimizer.min_coeff;
  os.eps_inside_sqrt = cfg_.optimizer.eps_inside_sqrt;
  os.loss_scale = loss_scale;
  os.max_grad_norm = cfg_.gradient_clipping;
  const StepResult r = engine_->step(os);
  phases_.offload_io += engine_->offload_io_seconds() - io_before;
  const double step_comm = engine_->comm_wait_seconds() - comm_before;
  phases_.optim += opt_sw.seconds() - step_comm;
  phases_.comm += step_comm;
  m.skipped = scaler.update(r.overflow);
  if (m.skipped) {
    ++skipped_;
  } else {
    ++steps_taken_;
  }
  // (Pipeline: only the last stage's ranks have losses, 1 / P of the world.)
  m.loss = mean_over_ranks(loss_sum / static_cast<double>(accum)) * pipeline_stages();
  if (runner_) m.pipeline_bubble = mean_over_ranks(runner_->bubble_fraction());
  m.lr = os.lr;
  m.grad_norm = r.grad_norm;
  m.loss_scale = loss_scale;
  backend_->synchronize();  // (a GPU's queued optimizer work belongs to this step's time)
  m.seconds = step_sw.seconds();
  const double tokens = static_cast<double>(cfg_.global_batch()) * cfg_.model.seq_len;
  m.tokens_per_s = tokens / m.seconds;
  m.mfu = peak_flops_ > 0 ? model_->spec().flops_per_token(cfg_.model.seq_len) * m.tokens_per_s /
                                (peak_flops_ * ctx_.world_size)
                          : 0.0;
  step_seconds_ += m.seconds;
  ++timed_steps_;
  if (m.mfu > 1.0) {
    // Above the peak it was measured against: the peak was too low (a train.peak_flops below the
    // hardware's, or an unknown clock). Never report more than 100%; say so once.
    if (!mfu_clamped_ && leader()) {
      spdlog::warn(
          "MFU {:.0f}% exceeds the peak it is measured against ({:.1f} GFLOP/s per rank); "
          "reporting 100%: set train.peak_flops to this machine's peak",
          100 * m.mfu, peak_flops_ / 1e9);
    }
    mfu_clamped_ = true;
    m.mfu = 1.0;
  }
  ++breakdown_steps_;
  return m;
}

double Trainer::mean_over_ranks(double local) {
  if (ctx_.world_size == 1) return local;
  ctx_.comm->all_reduce(&local, 1, CommType::kF64, ReduceOp::kSum);
  return local / ctx_.world_size;
}

const TokenDataset* Trainer::validation_data() const {
  return data_->val ? &data_->val->dataset() : nullptr;
}

std::optional<double> Trainer::evaluate() {
  if (!data_->val) return std::nullopt;
  EvalLoader& val = *data_->val;
  val.restart();
  const int64_t batches = std::min(cfg_.train.eval_batches, val.num_micro_batches());
  double sum = 0;
  if (runner_) {
    // Pipeline: the micro-batches through the stages, forward only; the last stage has the loss.
    Data& d = *data_;
    std::vector<std::vector<int32_t>> in, tg;
    std::vector<pipeline::MicroBatch> mbs;
    for (int64_t i = 0; i < batches; ++i) {
      in.emplace_back(d.inputs.size());
      tg.emplace_back(d.targets.size());
      if (!val.next_micro_batch(in.back().data(), tg.back().data())) {
        in.pop_back();
        tg.pop_back();
        break;
      }
    }
    for (size_t i = 0; i < in.size(); ++i) mbs.push_back({in[i].data(), tg[i].data()});
    sum = runner_->forward_only(mbs, *engine_);
  } else {
    for (int64_t i = 0; i < batches; ++i) {
      if (!val.next_micro_batch(data_->inputs.data(), data_->targets.data())) break;
      sum += model_->forward(data_->inputs.data(), data_->targets.data(), *engine_);
    }
  }
  evaluated_tokens_ = batches * int64_t{model_->batch()} * model_->seq() * cfg_.data_parallel_size;
  if (batches == 0) return std::nullopt;
  return mean_over_ranks(sum / static_cast<double>(batches)) * pipeline_stages();
}

std::string format_eta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

void Trainer::log_step(const StepMetrics& m) {
  const int64_t total = cfg_.train.steps;
  const int width = static_cast<int>(std::to_string(total).size());
  // ETA: the steps left at this run's mean step time so far.
  const double mean = timed_steps_ > 0 ? step_seconds_ / static_cast<double>(timed_steps_) : 0.0;
  std::string line = fmt::format(
      "step {:>{}}/{} | loss {:.6f} | lr {:.3e} | norm {:.4f} | scale {:g} | {:.0f} tok/s | MFU "
      "{:.1f}% | ETA {}",
      m.step, width, total, m.loss, m.lr, m.grad_norm, m.loss_scale, m.tokens_per_s, m.mfu * 100,
      format_eta(mean * static_cast<double>(total - m.step)));
  if (m.pipeline_bubble) line += fmt::format(" | bubble {:.1f}%", *m.pipeline_bubble * 100);
  if (m.moe) line += moe_log_fields(*m.moe);
  if (m.skipped) line += " | skipped (overflow)";
  if (m.val_loss) line += fmt::format(" | val {:.6f}", *m.val_loss);
  spdlog::info("{}", line);
}

void Trainer::draw_progress(const StepMetrics& m) {
  // At most 5 redraws a second: a terminal, not a log, and cheap next to a step.
  const auto now = std::chrono::steady_clock::now();
  if (m.step != cfg_.train.steps && now - progress_drawn_ < std::chrono::milliseconds(200)) return;
  if (!log::progress_enabled()) return;
  progress_drawn_ = now;
  const int64_t total = cfg_.train.steps;
  const double mean = timed_steps_ > 0 ? step_seconds_ / static_cast<double>(timed_steps_) : 0.0;
  constexpr int kBar = 20;
  const int filled = static_cast<int>(kBar * static_cast<double>(m.step) / total);
  log::set_progress(fmt::format("[{}{}] step {}/{} | loss {:.4f} | {:.0f} tok/s | ETA {}",
                                std::string(filled, '#'), std::string(kBar - filled, '.'), m.step,
                                total, m.loss, m.tokens_per_s,
                                format_eta(mean * static_cast<double>(total - m.step))));
}

void Trainer::write_pipeline_trace(int64_t step) {
  const std::string mine = pipeline::chrome_trace_events(
      runner_->timeline(), runner_->step_start_seconds(), ctx_.rank, groups_->pipeline().rank());
  const std::vector<std::string> all =
      ctx_.world_size > 1 ? all_gather_strings(*ctx_.comm, mine) : std::vector<std::string>{mine};
  if (!leader()) return;
  // Beside the metrics when a monitor writes them, else in the working directory.
  std::string dir = ".";
  if (csv_) {
    dir = monitor_run_dir(cfg_.csv_monitor, csv_run_);
  } else if (tb_) {
    dir = monitor_run_dir(cfg_.tensorboard, tb_run_);
  }
  const std::string path = (std::filesystem::path(dir) / "pipeline_trace.json").string();
  try {
    write_file_atomically(path, pipeline::chrome_trace_document(all));
  } catch (const Error& e) {
    spdlog::warn("pipeline trace of step {} not written: {}", step, e.what());
    return;
  }
  if (!trace_announced_) {
    spdlog::info(
        "pipeline timeline of each printed step (Chrome trace, chrome://tracing or "
        "ui.perfetto.dev): {}",
        path);
    trace_announced_ = true;
  }
}

void Trainer::log_breakdown() {
  if (breakdown_steps_ == 0) return;
  const double n = static_cast<double>(breakdown_steps_);
  OpTimes t;
  for_each_model([&](Model& m) { t += m.times(); });
  spdlog::info(
      "time/step: data {:.1f} ms | forward {:.1f} ms | backward {:.1f} ms | comm wait {:.1f} ms | "
      "optimizer {:.1f} ms | offload I/O wait {:.1f} ms || "
      "matmul fwd {:.1f} bwd {:.1f} | attention fwd {:.1f} bwd {:.1f} | layernorm {:.1f} | "
      "gelu {:.1f} | residual {:.1f} | classifier {:.1f} | encoder {:.1f} | rounding {:.1f} ms",
      (phases_.data - printed_phases_.data) / n * 1e3, t.forward / n * 1e3, t.backward / n * 1e3,
      (phases_.comm - printed_phases_.comm) / n * 1e3,
      (phases_.optim - printed_phases_.optim) / n * 1e3,
      (phases_.offload_io - printed_phases_.offload_io) / n * 1e3, t.matmul_fwd / n * 1e3,
      t.matmul_bwd / n * 1e3, t.attention_fwd / n * 1e3, t.attention_bwd / n * 1e3,
      t.layernorm / n * 1e3, t.gelu / n * 1e3, t.residual / n * 1e3, t.classifier / n * 1e3,
      t.encoder / n * 1e3, t.rounding / n * 1e3);
  printed_phases_ = phases_;
  breakdown_steps_ = 0;
  for_each_model([](Model& m) { m.reset_times(); });
}

void Trainer::log_memory(const char* when) {
  std::string device;
  int64_t free_bytes = 0, total_bytes = 0;
  if (backend_->device_memory_info(&free_bytes, &total_bytes)) {
    device = fmt::format("; GPU {}: {:.1f} of {:.1f} MiB in use (the device allocator's count)",
                         backend_->device_name(),
                         static_cast<double>(total_bytes - free_bytes) / (1 << 20),
                         static_cast<double>(total_bytes) / (1 << 20));
  }
  spdlog::info("memory {} (MiB, current/peak): {}{}", when, memory_.describe(), device);
}

TrainingProgress Trainer::progress() const {
  TrainingProgress p;
  p.global_step = global_step_;
  p.skipped_steps = skipped_;
  p.adam_steps = steps_taken_;
  const LoaderState ls = data_->train->state();
  p.samples_seen = ls.position;
  p.data_seed = ls.seed;
  p.data_num_samples = ls.num_samples;
  p.data_blend = ls.blend_weights;
  p.init_seed = cfg_.train.seed;
  const LossScaler::State ss = data_->scaler->state();
  p.loss_scale = ss.scale;
  p.loss_scale_hysteresis_left = ss.hysteresis_left;
  p.loss_scale_iter = ss.iter;
  p.loss_scale_last_overflow_iter = ss.last_overflow_iter;
  p.csv_run = csv_run_;
  p.tensorboard_run = tb_run_;
  return p;
}

void Trainer::open_monitors() {
  // A fresh run takes the first free run directory; a resumed one (from a checkpoint that
  // recorded its directory) appends there. Monitors sharing OUTPUT_PATH/JOB_NAME share the run.
  const bool resumed = global_step_ > 0;
  const MonitorConfig& csv = cfg_.csv_monitor;
  const MonitorConfig& tb = cfg_.tensorboard;
  auto where = [&](const MonitorConfig& m, int64_t recorded) {
    return resumed && recorded >= 0 ? recorded : next_monitor_run(m);
  };
  if (csv.enabled) {
    csv_run_ = where(csv, csv_run_);
    const std::string dir = monitor_run_dir(csv, csv_run_);
    csv_ = std::make_unique<CsvMonitor>(dir, global_step_, model_->spec().moe.num_experts);
    if (options_.log_steps) {
      spdlog::info("metrics: {} (csv_monitor{})", csv_->path(),
                   resumed        ? fmt::format(", appending after step {}", global_step_)
                   : csv_run_ > 0 ? fmt::format(", a new run directory: {} holds an earlier run's",
                                                monitor_run_dir(csv, csv_run_ - 1))
                                  : std::string());
    }
  }
  if (tb.enabled && !tb_) {
    const bool shared = csv.enabled && monitor_dir(csv) == monitor_dir(tb);
    tb_run_ = shared ? csv_run_ : where(tb, tb_run_);
    tb_ = std::make_unique<TensorBoardMonitor>(monitor_run_dir(tb, tb_run_));
    if (options_.log_steps) spdlog::info("tensorboard events: {}", tb_->path());
  }
}

void Trainer::resume(const std::string& which) {
  ZD_CHECK_INPUT(ckpt_ != nullptr, "--resume {}: the job has no train.checkpoint_dir",
                 config::clip_input(which));
  const std::optional<TrainingProgress> loaded = ckpt_->load(which);
  if (loaded) apply_progress(*loaded);  // (none: "auto" and nothing saved yet)
}

void Trainer::resume_from_dir(const std::string& dir) {
  JobConfig from = cfg_;
  from.train.checkpoint_dir = dir;
  from.checkpoint.async = false;  // (an async Checkpointer would take the engine's update guard)
  Checkpointer reader(from, ctx_, *engine_, &memory_);
  const std::optional<TrainingProgress> loaded = reader.load("latest");
  ZD_CHECK(loaded.has_value(), "no checkpoint in {}", dir);
  apply_progress(*loaded);
}

void Trainer::apply_progress(const TrainingProgress& p) {
  ZD_CHECK(p.adam_steps == engine_->adam_steps(), "adam steps {} vs {}", p.adam_steps,
           engine_->adam_steps());
  global_step_ = p.global_step;
  skipped_ = p.skipped_steps;
  steps_taken_ = p.adam_steps;
  data_->train->restore({p.samples_seen, p.data_seed, p.data_num_samples, p.data_blend});
  LossScaler::State ss;
  ss.scale = p.loss_scale;
  ss.hysteresis_left = p.loss_scale_hysteresis_left;
  ss.iter = p.loss_scale_iter;
  ss.last_overflow_iter = p.loss_scale_last_overflow_iter;
  data_->scaler->set_state(ss);
  csv_run_ = p.csv_run;
  tb_run_ = p.tensorboard_run;
}

SaveReport Trainer::save_checkpoint(const std::string& tag) {
  ZD_CHECK_INPUT(ckpt_ != nullptr, "saving a checkpoint needs train.checkpoint_dir");
  const SaveReport r =
      ckpt_->save(tag.empty() ? default_tag(global_step_) : tag, progress(), tag.empty());
  ++checkpoints_saved_;
  if (leader() && options_.log_steps) {
    spdlog::info("checkpoint {}{}: {:.1f} MB on rank 0, training blocked {:.3f} s", r.tag,
                 r.committed ? " saved" : " writing in the background",
                 static_cast<double>(r.bytes) / 1e6, r.blocked_seconds);
  }
  return r;
}

// comms_logger, rank 0: the totals of every communicator this rank issues collectives on, one
// block per communicator. Each is named by the first process group in the build order that uses
// it (tensor, context, data, data x context, tensor x context, pipeline, world), with the other
// groups sharing it listed after it; one-rank groups (a SelfCommunicator: copies, no traffic) are
// left out. On GPU ranks, ZeRO's collectives run on the device communicator (NCCL), printed last.
void Trainer::log_comms(int64_t steps) const {
  const CommsLoggerConfig& c = cfg_.comms_logger;
  if (!c.enabled || !leader() || !groups_) return;
  const std::vector<std::string> only = c.prof_all ? std::vector<std::string>{} : c.prof_ops;
  struct Block {
    const Communicator* comm;
    const ProcessGroup* first;         // names the block
    std::vector<std::string> sharing;  // the other groups on this communicator
  };
  std::vector<Block> blocks;
  for (const ProcessGroup& g : groups_->all()) {
    const Communicator* comm = &g.comm();
    if (dynamic_cast<const SelfCommunicator*>(comm) != nullptr) continue;
    auto it =
        std::find_if(blocks.begin(), blocks.end(), [&](const Block& b) { return b.comm == comm; });
    if (it != blocks.end()) {
      it->sharing.push_back(g.name());
    } else {
      blocks.push_back({comm, &g, {}});
    }
  }
  std::string out;
  auto add = [&](const std::string& title, const CollectiveLog* log) {
    if (log == nullptr) return;
    const std::string totals = log->describe_totals(only, steps);
    out += fmt::format("\n {}:{}", title, totals.empty() ? "\n  (no collectives)" : totals);
  };
  for (const Block& b : blocks) {
    std::string title = b.first->describe();
    for (size_t i = 0; i < b.sharing.size(); ++i)
      title += fmt::format("{}'{}'", i == 0 ? ", also " : ", ", b.sharing[i]);
    if (b.first->is_world()) title += " (the world communicator)";
    add(title, b.comm->collective_log());
  }
  if (device_comm_)
    add("the device communicator (ZeRO on GPU ranks)", device_comm_->collective_log());
  if (out.empty()) return;  // one rank: no communicator keeps a log
  spdlog::info("communication of rank 0 so far (comms_logger), per communicator, {} step{}:{}",
               steps, steps == 1 ? "" : "s", out);
}

// Every rank learns whether any rank was asked to stop, so all stop at the same step.
JobControl::Command Trainer::control_point() {
  JobControl::Command c;
  if (options_.control && leader()) c = options_.control->take();
  // A signal stops with a checkpoint; the controller's stop only when asked.
  int32_t flags[3] = {c.save ? 1 : 0, (c.stop || stop_requested()) ? 1 : 0,
                      (c.stop_checkpoint || stop_requested()) ? 1 : 0};
  if (ctx_.world_size > 1) ctx_.comm->all_reduce(flags, 3, CommType::kI32, ReduceOp::kMax);
  JobControl::Command agreed;
  agreed.save = flags[0] != 0;
  agreed.stop = flags[1] != 0;
  agreed.stop_checkpoint = flags[2] != 0;
  if (agreed.save) {
    agreed.tag = ctx_.world_size > 1 ? broadcast_string(*ctx_.comm, c.tag, 0) : c.tag;
  }
  return agreed;
}

TrainResult Trainer::run() {
  TrainResult result;
  result.peak_flops = peak_flops_;
  result.first_step = global_step_ + 1;
  if (leader()) open_monitors();
  if (ctx_.world_size > 1 && (cfg_.csv_monitor.enabled || cfg_.tensorboard.enabled)) {
    // Every rank records the leader's run directories in the checkpoints it writes: a restore
    // from another rank's manifest (an in-memory snapshot whose rank 0 was lost) appends there.
    const std::string runs =
        broadcast_string(*ctx_.comm, fmt::format("{} {}", csv_run_, tb_run_), 0);
    std::sscanf(runs.c_str(), "%" SCNd64 " %" SCNd64, &csv_run_, &tb_run_);
  }
  if (options_.control)
    options_.control->set_world(ctx_.world_size, cfg_.train.steps, cfg_.global_batch());
  if (options_.log_steps) log_memory("at the start");
  // The live progress line (a terminal only) goes away however the run ends.
  struct ProgressGuard {
    ~ProgressGuard() { log::clear_progress(); }
  } progress_guard;
  Stopwatch total;
  const double update_blocked_before = ckpt_ ? ckpt_->update_blocked_seconds() : 0.0;
  const int64_t steps = cfg_.train.steps;
  if (global_step_ >= steps && leader()) {
    // A resume at or past the end: nothing runs, which must not look like a run that worked.
    spdlog::warn(
        "nothing to train: resumed at step {} and train.steps is {}. To continue, raise "
        "train.steps (zerod train: --steps N with N > {})",
        global_step_, steps, global_step_);
  }
  const int64_t print_every = std::max<int64_t>(1, cfg_.steps_per_print);
  int64_t saved_at = -1;
  bool stop_checkpoint = false;  // the stop that ended the run asked for a checkpoint
  auto save = [&]() {
    const SaveReport r = save_checkpoint();
    result.checkpoint_blocked_seconds += r.blocked_seconds;
    if (r.committed) result.last_checkpoint = r.tag;
    saved_at = global_step_;
  };
  for (int64_t step = global_step_ + 1; step <= steps; ++step) {
    StepMetrics m = train_step(step);
    global_step_ = step;
    const bool eval_now =
        cfg_.train.eval_interval > 0 && (step % cfg_.train.eval_interval == 0 || step == steps);
    if (eval_now) m.val_loss = evaluate();
    if (options_.log_steps && leader() &&
        (step % print_every == 0 || step == result.first_step || step == steps || m.val_loss)) {
      log_step(m);
      if (cfg_.wall_clock_breakdown) log_breakdown();
      if (cfg_.comms_logger.verbose) log_comms(step - result.first_step + 1);
    }
    if (runner_ && cfg_.wall_clock_breakdown && (step % print_every == 0 || step == steps))
      write_pipeline_trace(step);
    if (options_.log_steps && leader()) draw_progress(m);
    if (csv_) csv_->write(m);
    if (tb_) tb_->write(m, memory_.total());
    if (options_.on_step) options_.on_step(m);
    if (options_.control) {
      options_.control->on_step(ctx_.rank, m, {memory_.total(), memory_.total_peak()});
    }
    if (options_.metrics) {
      RankCounters c;
      c.memory_bytes = memory_.total();
      c.memory_peak_bytes = memory_.total_peak();
      c.steps = static_cast<int64_t>(result.steps.size()) + 1;
      c.skipped_steps = skipped_;
      c.checkpoints = checkpoints_saved_;
      if (ctx_.comm && ctx_.comm->collective_log())
        c.collectives = ctx_.comm->collective_log()->totals();
      options_.metrics->on_step(ctx_.rank, m, c);
    }
    result.steps.push_back(m);
    result.last_step = step;
    if (ckpt_) {
      if (auto committed = ckpt_->poll()) {
        result.last_checkpoint = *committed;
        if (leader() && options_.log_steps)
          spdlog::info("checkpoint {} saved (background write done)", *committed);
      }
      if (cfg_.train.save_interval > 0 && step % cfg_.train.save_interval == 0) save();
      if (snapshots_) snapshots_->after_step(step, *ckpt_, progress());
    }
    const JobControl::Command cmd = control_point();
    if (cmd.save) {
      // Asked for by the controller, which waits for a committed checkpoint. A refusal (no
      // checkpoint dir, a bad tag: the same on every rank) goes back to it; the job goes on.
      std::string err, tag;
      try {
        const SaveReport r = save_checkpoint(cmd.tag);
        result.checkpoint_blocked_seconds += r.blocked_seconds;
        saved_at = global_step_;
        tag = r.tag;
        if (!r.committed) ckpt_->finish();
        result.last_checkpoint = tag;
      } catch (const InputError& e) {
        err = e.what();
      }
      if (options_.control && leader()) options_.control->on_saved(tag, global_step_, err);
    }
    if (step < steps && cmd.stop) {
      result.stopped = true;
      stop_checkpoint = cmd.stop_checkpoint;
      if (ckpt_ && cmd.stop_checkpoint && saved_at != step) save();
      break;
    }
  }
  // Never lose the end of a run: save the last step unless it was just saved.
  if (ckpt_ && !result.stopped && cfg_.train.save_interval > 0 && saved_at != global_step_ &&
      result.last_step > 0) {
    save();
  }
  if (ckpt_) {
    if (auto committed = ckpt_->finish()) result.last_checkpoint = *committed;
    result.checkpoint_blocked_seconds += ckpt_->update_blocked_seconds() - update_blocked_before;
  }
  if (result.stopped && leader()) {
    // A signal, or the controller's Stop (zeroctl stop, with or without --checkpoint).
    const std::string by = stop_signal() != 0 ? fmt::format("signal {}", stop_signal())
                                              : std::string("by the controller");
    if (ckpt_ && stop_checkpoint && result.last_checkpoint) {
      spdlog::info("stop requested ({}): checkpoint {} saved at step {}; exiting", by,
                   *result.last_checkpoint, global_step_);
    } else if (ckpt_ && !stop_checkpoint) {
      spdlog::info("stop requested ({}) at step {} without a checkpoint: nothing saved{}; exiting",
                   by, global_step_,
                   result.last_checkpoint ? ", the last checkpoint is " + *result.last_checkpoint
                                          : std::string());
    } else if (ckpt_) {
      spdlog::warn("stop requested ({}) at step {}: the checkpoint was not committed; exiting", by,
                   global_step_);
    } else {
      spdlog::warn("stop requested ({}) at step {}: no train.checkpoint_dir, nothing saved", by,
                   global_step_);
    }
  }
  result.seconds = total.seconds();
  result.skipped_steps = skipped_;
  result.data_seconds = phases_.data;
  result.fwd_bwd_seconds = phases_.fwd_bwd;
  result.comm_wait_seconds = phases_.comm;
  result.optimizer_seconds = phases_.optim;
  result.offload_io_seconds = phases_.offload_io;
  result.tokens =
      static_cast<int64_t>(result.steps.size()) * cfg_.global_batch() * cfg_.model.seq_len;
  if (!result.steps.empty()) result.final_val_loss = result.steps.back().val_loss;
  if (options_.log_steps) log_memory("at the end");
  if (options_.log_steps && leader() && !result.steps.empty()) {
    const StepMetrics& first = result.steps.front();
    const StepMetrics& last = result.steps.back();
    spdlog::info(
        "done: {} steps ({} skipped), {} tokens in {:.1f} s ({:.0f} tok/s); loss {:.4f} -> "
        "{:.4f}{}",
        result.steps.size(), skipped_, human_count(static_cast<double>(result.tokens)),
        result.seconds, static_cast<double>(result.tokens) / result.seconds, first.loss, last.loss,
        result.final_val_loss ? fmt::format(", val {:.4f}", *result.final_val_loss) : "");
    if (csv_) spdlog::info("metrics: {}", csv_->path());
    if (tb_) spdlog::info("tensorboard events: {}", tb_->path());
    log_comms(static_cast<int64_t>(result.steps.size()));
  }
  return result;
}

}  // namespace zerod
