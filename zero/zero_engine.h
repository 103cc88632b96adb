// ZeRO model states of one rank (DESIGN.md section 3) and the optimizer step over them.
//
// One partitioning for every stage (zero/partition.h); the stages differ in what stays resident:
//
//   stage | compute weights        | gradients            | fp32 master, Adam m and v
//   0     | full                   | full, all-reduced    | full (every rank updates all)
//   1     | full                   | full, reduced to the owner of each shard | shard
//   2     | full                   | shard (reduce-scattered during backward) | shard
//   3     | shard (gathered per unit around its use, zero/param_gatherer.h) | shard | shard
//
// The engine is the model's ParamSource and GradSink. After the optimizer updates a shard,
// stages 1-2 all-gather the compute weights; stage 3 keeps the shard. In fp32 the master is the
// compute weight itself (no second copy, as in DeepSpeed's fp32 training); with bf16/fp16 it is
// a separate fp32 array. The global gradient norm and the overflow check are all-reduced, so
// every rank clips, skips and scales identically.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "kernels/backend.h"
#include "kernels/cpu/muon.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "offload/param_swapper.h"
#include "offload/state_swapper.h"
#include "zero/grad_reducer.h"
#include "zero/onebit.h"
#include "zero/muon_exchange.h"
#include "zero/param_gatherer.h"
#include "zero/partition.h"
#include "zero/powersgd.h"
#include "zero/update_guard.h"

namespace zerod {

enum class StatesHome { kDevice, kHost, kNvme };
class ZeroEngine;

struct ZeroOptions {
  int stage = 0;
  // The data-parallel group ZeRO partitions and reduces over (the world without model
  // parallelism): its size, this rank's index in it, and its communicator.
  int world_size = 1;
  int rank = 0;
  Communicator* comm = nullptr;  // required when world_size > 1 or stage 3
  // The ranks holding the other parts of this rank's model (the tensor group; null: none). The
  // global gradient norm and the overflow check also sum over them, each element counted once
  // (ParamLayout::counted_in_norm), so every rank of the world clips and skips alike.
  Communicator* model_parallel_comm = nullptr;
  // The host communicators of the same two groups (Gloo, without host staging), for the
  // exchanges of host buffers: Muon's matrices and the 1-bit optimizers' compressed momenta. On a
  // GPU, `comm` moves device tensors (NCCL, or Gloo behind host staging) and cannot take them.
  // Null: `comm` / `model_parallel_comm` themselves (CPU ranks: they are host communicators).
  Communicator* host_comm = nullptr;
  Communicator* host_model_parallel_comm = nullptr;
  // The tensor-parallel group's host communicator when the layout's matrices are slices (null:
  // none): Muon orthogonalises each whole matrix over it (zero/muon_exchange.h).
  Communicator* host_tensor_comm = nullptr;
  // The expert-data-parallel group's host communicator (with expert_comm; Muon's experts).
  Communicator* host_expert_comm = nullptr;
  // Expert parallelism (the layout's shard().expert_size > 1: its experts units hold this rank's
  // experts only): those units are partitioned and reduced over the expert-data-parallel group,
  // the data-parallel ranks holding the same experts (its size, this rank's index in it and its
  // communicator, null for one rank), and the stage-0 gradient norm sums their part over the
  // expert-parallel group (the ranks holding the other experts; null: one rank).
  int expert_world_size = 1;
  int expert_rank = 0;
  Communicator* expert_comm = nullptr;
  Communicator* expert_parallel_comm = nullptr;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;
  int64_t prefetch_bucket_size = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  // communication_compression powersgd (stage 0 only): the engine's reducer hands each step's
  // gradients to a PowerSgd hook (zero/powersgd.h) from start_iter on.
  std::optional<PowerSgdOptions> powersgd;
  // offload_optimizer.device: where the fp32 master weights and Adam moments live.
  //   kDevice: the compute pool (in fp32 the master is the compute weights themselves);
  //   kHost (cpu): host memory (MemCategory::kOffloaded). With offload_ratio < 1 only the leading
  //     units holding that fraction of the shard go to the host; the rest stay in the compute
  //     pool and are updated there (whole units: the split falls on a unit boundary);
  //   kNvme: the swap file swap_path (offload/state_swapper.h), which the optimizer step streams
  //     through swap.buffer_count host buffers of one sub-group each.
  // Offloaded, the optimizer updates the states where they are and writes the compute weights
  // in the same pass (the master is a separate fp32 copy even in fp32).
  StatesHome optimizer_states = StatesHome::kDevice;
  double offload_ratio = 1.0;
  std::string swap_path;
  SwapOptions swap;
  // offload_param.device (stage 3): where the compute-dtype weight shards live.
  //   kHost (cpu): host memory (MemCategory::kOffloaded), gathered from there;
  //   kNvme: the leading units whose shards fit in param_max_in_cpu elements stay in host
  //     memory, the others live in param_swap_path (offload/param_swapper.h) and are read into
  //     their gather buffer when gathered; the optimizer writes them back unit by unit.
  StatesHome param_states = StatesHome::kDevice;
  std::string param_swap_path;
  int64_t param_buffer_size = 100000000;  // elements per swap buffer (>= the largest shard)
  int64_t param_max_in_cpu = 1000000000;  // elements
  bool param_pin_memory = false;
  AioOptions param_aio;
  // DeepSpeed's 1-bit optimizers (zero/onebit.h; stage 0, states in host memory: on a GPU,
  // optimizer_states kHost with offload_ratio 1, the update on the host as ZeRO-Offload's):
  // kNone for the others.
  OnebitKind onebit = OnebitKind::kNone;
  OnebitConfig onebit_config;
  // Called in step() once this rank's reduced gradient shards are final, before the norm: a
  // pipeline sums the tied embedding's gradient of its first and last stage there
  // (parallel/pipeline/tied_grads.h). Null: nothing.
  std::function<void(ZeroEngine&)> after_reduce;
};

// Hyper-parameters of one optimizer step.
// The kernel of an optimizer.type (canonical spelling: "Adam" and "AdamW" are both kAdam, the
// mode is OptimStep::adam_w_mode); an unknown type is an InputError.
OptimizerKind optimizer_kind(const std::string& type);

struct OptimStep {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // applied to 2-D weights only (matmuls and embeddings)
  bool adam_w_mode = true;
  bool bias_correction = true;
  double momentum = 0.0, dampening = 0.0;  // SGD
  bool nesterov = false;
  double lr_decay = 0.0, initial_accumulator_value = 0.0;  // Adagrad
  // Muon: lr, weight_decay, momentum, nesterov above are the hidden matrices'; the other tensors
  // take AdamW with adam_lr, adam_weight_decay and beta1, beta2, eps above.
  double adam_lr = 1e-3, adam_weight_decay = 0.0;
  cpu::MuonNs ns;
  cpu::MuonLrAdjust adjust_lr = cpu::MuonLrAdjust::kOriginal;
  double max_coeff = 10.0, min_coeff = 0.01;  // Lamb
  bool eps_inside_sqrt = false;
  double loss_scale = 1.0;     // gradients are divided by it
  double max_grad_norm = 0.0;  // gradient_clipping; 0: off
};

struct StepResult {
  bool overflow = false;   // inf/NaN in the gradients of any rank: step skipped
  double grad_norm = 0.0;  // global L2 norm of the unscaled, averaged gradients, before clipping
  double clip_coef = 1.0;  // factor applied by clipping (1: none)
};

// Model-state bytes of a rank: measured, and what the ZeRO formula predicts.
struct ModelStateBytes {
  int64_t weights = 0, gradients = 0, master = 0, moments = 0;  // resident model states
  int64_t buckets = 0, gathered = 0;                            // communication buffers (peak)
  int64_t host = 0;  // offloaded to host memory (master and moments with offload_optimizer)
  int64_t swap_buffers = 0, nvme = 0;  // NVMe offload: host buffers, and the swap file on disk
  int64_t states() const { return weights + gradients + master + moments; }  // compute pool
};

// The ZeRO formula (the paper's table): per-rank bytes of the model states of psi parameters at
// `stage` on `world` ranks, with compute weights and gradients of compute_bytes each and fp32
// master weights (none when the compute dtype is fp32: the weights are the master) and Adam
// moments. Used for the start-of-run report and by the planner (engine/plan/).
ModelStateBytes zero_formula_bytes(double psi, int world, int stage, int compute_bytes);

class ZeroEngine : public ParamSource, public GradSink {
 public:
  ZeroEngine(const ParamLayout& layout, Backend& backend, const ZeroOptions& options,
             MemoryTracker* tracker);
  ~ZeroEngine() override;

  // Master weights from the GPT-2 initialisation for seed (each rank its own shard, every value
  // a function of the seed only), then the compute weights.
  void init_weights(uint64_t seed);
  // Master weights of unit u from the unit's whole flat buffer (layout().unit(u).numel floats,
  // e.g. a model file being imported): this rank keeps its shard. After every unit has been
  // set, refresh_weights() (collective) makes the compute weights.
  void set_master_unit(int u, const float* unit_flat);
  // Zeroes the gradients (start of a gradient-accumulation window).
  void zero_grad();
  // Before each micro-batch; `last`: the last micro-batch of the step (stages 0-1 reduce then).
  void begin_micro_batch(bool last);
  // Finish reductions, unscale, global overflow check and norm, clip, AdamW on this rank's
  // shard, refresh (and gather) the compute weights. On overflow nothing is updated and the
  // Adam step count does not advance.
  StepResult step(const OptimStep& s);
  int64_t adam_steps() const { return adam_steps_; }
  void set_adam_steps(int64_t steps) { adam_steps_ = steps; }  // (loading a checkpoint)
  // The 1-bit optimizer's per-rank state (null for the others).
  OnebitOptimizer* onebit() { return onebit_.get(); }
  // Called before each unit's optimizer states change (nullptr: none). Not owned.
  void set_update_guard(UpdateGuard* guard) { guard_ = guard; }

  // ParamSource
  const void* acquire(int unit) override;
  void release(int unit) override;
  void prefetch(int unit) override;
  // GradSink
  void* grad_buffer(int unit) override { return reducer_->grad_buffer(unit); }
  void unit_done(int unit) override { reducer_->unit_done(unit); }

  const ParamLayout& layout() const { return layout_; }
  const Partition& partition() const { return partition_; }
  const ZeroOptions& options() const { return opt_; }
  // The rank whose optimizer shard of unit u this rank holds: its index in the unit's group
  // (stages 1-3: the data-parallel group, or for an experts unit the expert-data-parallel
  // group) or 0 (stage 0: all of it).
  int owner_rank(int u) const {
    if (opt_.stage == 0) return 0;
    return partition_.unit(u).experts ? opt_.expert_rank : opt_.rank;
  }
  // Whether the experts units are this rank's experts only, on their own groups (ZeroOptions).
  bool expert_groups() const { return layout_.shard().expert_size > 1; }
  // The group unit u's gradients are reduced and its weights gathered over.
  Communicator& unit_comm(int u) const {
    return partition_.unit(u).experts ? *expert_comm_ : *opt_.comm;
  }
  // This rank's optimizer shard of unit u: fp32 master and Adam moments (shard elements). Only
  // when the states are in memory (states_resident()); NVMe states are reached by visit_states.
  // On a GPU backend they may be device memory (see states_addressable()).
  float* master(int u);
  float* exp_avg(int u);
  float* exp_avg_sq(int u);
  bool states_resident() const { return swapper_ == nullptr; }
  // True when master(u), exp_avg(u), exp_avg_sq(u) of every unit are host memory the caller may
  // read and write (in memory, and on the CPU backend or offloaded to the host).
  bool states_addressable() const;
  // Visits this rank's optimizer states of units [u0, u1) in order, a piece at a time: fn(u, lo,
  // hi, master, exp_avg, exp_avg_sq) gets elements [lo, hi) of unit u's shard (pointers at lo).
  // In memory a piece is a whole unit shard; on NVMe, the part of one sub-group in that unit.
  // mode as StateSwapper's (kOverwrite: every element of the range is written).
  using StatesMode = StateSwapper::Mode;
  using StatesVisitor = std::function<void(int u, int64_t lo, int64_t hi, float* master,
                                           float* exp_avg, float* exp_avg_sq)>;
  void visit_states(StatesMode mode, int u0, int u1, const StatesVisitor& fn);
  // As visit_states, but the pointers are always host memory: states in device memory pass
  // through a pinned host copy of the piece (read before fn unless kOverwrite, written back
  // after fn unless kRead).
  void visit_states_host(StatesMode mode, int u0, int u1, const StatesVisitor& fn);
  const StateSwapper* swapper() const { return swapper_.get(); }
  // This rank's reduced gradient shard of unit u (sum over ranks; valid after the reductions).
  void* grad_shard(int u) { return reducer_->shard(u); }
  // The PowerSGD hook (null without communication_compression), for checkpoints and stats.
  PowerSgd* powersgd() { return powersgd_.get(); }
  // Refreshes the compute weights from the master (after loading a checkpoint) and gathers them.
  void refresh_weights();
  // The full compute weights of unit u gathered into `out` (padded elements, memory of the
  // backend: device memory on a GPU), any stage. Collective at stage 3.
  void gather_unit(int u, void* out);

  // Seconds spent waiting for communication (gradient reductions, weight gathers).
  double comm_wait_seconds() const;
  // Seconds spent blocked on NVMe offload I/O (optimizer sub-groups, parameter shards).
  double offload_io_seconds() const;
  ModelStateBytes measured_bytes() const;
  // The ZeRO formula for this stage, world size and element sizes, over the padded parameters.
  ModelStateBytes formula_bytes() const;
  // A few lines comparing the two, for the start-of-run log.
  std::string memory_report() const;

 private:
  bool fp32_alias() const {
    return be_.compute_dtype() == DType::kF32 && opt_.optimizer_states == StatesHome::kDevice &&
           opt_.param_states == StatesHome::kDevice;
  }
  bool param_on_nvme(int u) const { return param_swapper_ && u >= resident_param_units_; }
  // Where the optimizer writes unit u's compute weights (the staging buffer for NVMe units),
  // and the notice that elements [.., hi) of it are written (hi == shard: write it out).
  void* weight_target(int u);
  int64_t resident_shard_elems() const;  // parameter NVMe offload: shard elements kept in RAM
  void weight_written(int u, int64_t hi);
  bool offloaded() const { return opt_.optimizer_states != StatesHome::kDevice; }
  // Unit u's optimizer states are host memory (always on the CPU backend; on a GPU when
  // offloaded to the host or NVMe).
  bool states_on_host(int u) const;
  // Stage 3 on a GPU backend with the weight shards offloaded (cpu or nvme).
  bool params_on_host() const;
  // Unit u's weight shard where a collective can read it: its place in the compute pool, or
  // (NVMe, or host memory on a GPU) copied to `in_place` first.
  const void* shard_in_place(int u, void* in_place);
  // The swappers' buffers are page-locked for the GPU's copies (empty on the CPU).
  HostRegistrar host_registrar();
  // A pinned host scratch of at least `floats` floats (grown on demand).
  float* host_stage(int64_t floats);
  // local summed over the ranks of comm (default: the data-parallel group), through device
  // memory on a GPU backend; the second form sums n values in place.
  double sum_over_ranks(double local, Communicator* comm = nullptr);
  void sum_over_ranks(double* values, int64_t n, Communicator* comm = nullptr);
  // The Lamb step (zero/lamb_step.cc): two passes over this rank's states with every tensor's
  // trust ratio, from its partial norms summed over the data-parallel group, in between.
  void lamb_step(const OptimStep& s, OptimizerParams p);
  // Sum of squares of this rank's reduced gradient shards, over the elements it counts in the
  // global norm (all of them without model parallelism): of the experts units (experts) or of
  // the others.
  double shard_sum_squares(bool experts = false);
  // The sum of squares of the whole gradient's parts this rank's model part holds, the same on
  // every rank of the data-parallel group (before the model-parallel sum).
  double global_sum_squares();
  void place_parameters();        // allocates weights_ (and the parameter swapper)
  void place_optimizer_states();  // allocates host_/dev_ (or the state swapper)
  void* weight_region(int u);     // the compute weights this rank's optimizer writes for unit u
  void gather_weights();          // stages 1-2: all-gather every unit's updated shard
  void publish_weights();  // after the compute weights changed: gather (1-2) or re-gather (3)
  // A 1-bit optimizer's step past its warm-up (gradients local to each rank), or one of its
  // own warm-up steps (OneBitLamb).
  StepResult onebit_step(const OptimStep& s);
  float* state(int which, int u);  // 0 master, 1 exp_avg, 2 exp_avg_sq of unit u (in memory)
  // Muon, before the update pass: the momentum of this rank's pieces of every hidden matrix,
  // then the matrices orthogonalised whole (zero/muon_exchange.h; collective at stages 1-3).
  void muon_orthogonalise(const OptimStep& s, float grad_scale);
  // The update of unit u's elements [a, b) (pm, pa, pv, grad at a; out at a or null), a range of
  // one decay setting: p's kernel, or with Muon the matrices' update from the orthogonalised
  // values and AdamW elsewhere. host: the CPU kernels on host memory (else the backend's).
  void update_range(int u, int64_t a, int64_t b, bool decay, float* pm, float* pa, float* pv,
                    const void* grad, void* out, const OptimStep& s, OptimizerParams p, bool host);

  const ParamLayout& layout_;
  Backend& be_;
  ZeroOptions opt_;
  MemoryTracker* tracker_;
  Partition partition_;  // the optimizer partition: world 1 at stage 0, the world otherwise
  // Per unit: the element ranges [begin, end) of this rank's shard counted in the norm (empty
  // vector of vectors when every element counts).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> norm_ranges_;
  size_t esz_;
  Buffer weights_;  // stages 0-2: every unit's padded weights; stage 3: every unit's shard
  // Optimizer states in memory, shard elements [0, split_) in host_ and [split_, total) in dev_:
  // master (none when fp32 aliases weights_), exp_avg, exp_avg_sq.
  Buffer host_[3], dev_[3];
  int64_t split_ = 0;
  std::unique_ptr<StateSwapper> swapper_;        // NVMe
  std::unique_ptr<ParamSwapper> param_swapper_;  // stage 3 parameters on NVMe
  int resident_param_units_ = 0;  // with param_swapper_: units [0, this) stay in weights_
  std::unique_ptr<Communicator> self_comm_;  // world 1 without a communicator given
  // The experts units' group (expert_groups()): ZeroOptions::expert_comm, or for one rank
  // expert_self_comm_.
  Communicator* expert_comm_ = nullptr;
  std::unique_ptr<Communicator> expert_self_comm_;
  std::unique_ptr<PowerSgd> powersgd_;       // ZeroOptions::powersgd (before reducer_: it uses it)
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ParamGatherer> gatherer_;  // stage 3
  std::unique_ptr<OnebitOptimizer> onebit_;
  std::unique_ptr<MuonExchange> muon_;  // optimizer Muon (made at its first step)
  // With expert groups: muon_ serves the other units, this the experts units (over the
  // expert-data-parallel group).
  std::unique_ptr<MuonExchange> muon_experts_;
  MuonExchange& muon_for(int u);
  Buffer host_stage_;                        // host_stage()
  Buffer scalar_;                            // sum_over_ranks() on a GPU
  int64_t adam_steps_ = 0;
  UpdateGuard* guard_ = nullptr;
  double gather_wait_seconds_ = 0;
};

}  // namespace zerod
