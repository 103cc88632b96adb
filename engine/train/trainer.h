// The training loop of one rank (DESIGN.md section 3): micro-batches with gradient
// accumulation, mixed precision with fp32 master weights, loss scaling, clipping, the LR
// schedule, periodic validation, the step line every steps_per_print and the CSV monitor.
// With several ranks every rank runs a Trainer over its share of each global batch; the ZeRO
// engine reduces gradients through the communicator; rank 0 alone prints and writes metrics.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/memory.h"
#include "engine/config/job_config.h"
#include "engine/data/dataset.h"
#include "engine/metrics/csv_monitor.h"
#include "engine/metrics/metrics_sink.h"
#include "engine/metrics/tensorboard_monitor.h"
#include "engine/runtime/rank_context.h"
#include "engine/train/checkpointer.h"
#include "engine/train/job_control.h"
#include "model/model.h"
#include "zero/zero_engine.h"

namespace zerod {
class MemorySnapshots;

namespace pipeline {
class PipelineRunner;
class TiedEmbeddingGrads;
}  // namespace pipeline

struct TrainResult {
  std::vector<StepMetrics> steps;
  std::optional<double> final_val_loss;
  int64_t tokens = 0;  // tokens trained on (all steps, all ranks)
  int64_t skipped_steps = 0;
  double seconds = 0;
  double peak_flops = 0;  // what MFU was measured against (per rank)
  double data_seconds = 0, fwd_bwd_seconds = 0, comm_wait_seconds = 0, optimizer_seconds = 0;
  double offload_io_seconds = 0;  // of fwd_bwd + optimizer: blocked on NVMe offload I/O
  int64_t first_step = 1;         // > 1 after a resume
  int64_t last_step = 0;          // the last step trained
  bool stopped = false;           // SIGTERM/SIGUSR1 (or request_stop) ended the run early
  std::optional<std::string> last_checkpoint;  // the last checkpoint this run committed
  double checkpoint_blocked_seconds = 0;       // training time lost to saves (in save, and in
                                               // optimizer steps waiting for async writes)
};

struct TrainerOptions {
  bool log_steps = true;                            // the per-step line and summaries (rank 0)
  std::function<void(const StepMetrics&)> on_step;  // called after every step
  JobControl* control = nullptr;   // the daemon's commands and progress (not owned)
  MetricsSink* metrics = nullptr;  // e.g. the Prometheus endpoint (not owned)
  // The backend to compute on instead of train.device's (tests: a backend that checks the GPU
  // paths on the CPU). Collectives then go through the rank's communicator.
  std::function<std::unique_ptr<Backend>()> backend;
};

// "45s", "3m12s", "1h02m" ("?" for a negative or absurd estimate): the step line's ETA.
std::string format_eta(double seconds);

class Trainer {
 public:
  // cfg must be resolved (resolve_job) for ctx.world_size.
  Trainer(JobConfig cfg, RankContext ctx, TrainerOptions options = {});
  explicit Trainer(JobConfig cfg, TrainerOptions options = {})
      : Trainer(std::move(cfg), RankContext{}, std::move(options)) {}
  ~Trainer();

  TrainResult run();

  // Continues from a checkpoint of train.checkpoint_dir: "latest" or a tag (collective; call
  // before run()). Any world size and ZeRO stage loads any checkpoint of the same model.
  void resume(const std::string& which);
  // Continues from the newest checkpoint of another directory (an in-memory snapshot rebuilt
  // there, memory_snapshot.h), as resume("latest") does from train.checkpoint_dir.
  void resume_from_dir(const std::string& dir);
  // In-memory snapshots taken after each step (elastic workers; null: none). Not owned.
  void set_snapshots(MemorySnapshots* snapshots) { snapshots_ = snapshots; }
  // Saves a checkpoint now (collective, between steps); empty tag: global_step<N>.
  SaveReport save_checkpoint(const std::string& tag = "");
  TrainingProgress progress() const;

  // Mean validation loss over train.eval_batches micro-batches per rank of the validation set,
  // averaged over ranks (nullopt when there is none).
  std::optional<double> evaluate();
  // The validation samples evaluate() runs over (nullptr when there are none).
  const TokenDataset* validation_data() const;
  // Tokens (over all ranks) whose loss the last evaluate() averaged.
  int64_t evaluated_tokens() const { return evaluated_tokens_; }

  const JobConfig& config() const { return cfg_; }
  const RankContext& rank_context() const { return ctx_; }
  Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  ZeroEngine& engine() { return *engine_; }
  // This rank's process groups over the job's mesh (parallelism section).
  const ProcessGroups& groups() const { return *groups_; }
  MemoryTracker& memory() { return memory_; }
  // The pipeline runner (null without pipeline parallelism).
  const pipeline::PipelineRunner* pipeline_runner() const { return runner_.get(); }

 private:
  struct Data;
  StepMetrics train_step(int64_t step);
  double mean_over_ranks(double local);
  bool leader() const { return ctx_.rank == 0; }
  void log_step(const StepMetrics& m);
  void draw_progress(const StepMetrics& m);  // the live line on a terminal (core/log.h)
  void log_breakdown();
  // Every rank: each memory category, current and peak.
  void log_memory(const char* when);

  JobConfig cfg_;
  RankContext ctx_;
  TrainerOptions options_;
  MemoryTracker memory_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> device_comm_;   // NCCL between GPU ranks (engine_ uses it)
  std::unique_ptr<ProcessGroups> groups_;       // the mesh's groups over ctx_.comm
  // Device memory without a device communicator for a group: the group's communicator behind
  // host staging (comm/staged/), one per host communicator (device_tensors()).
  std::map<Communicator*, std::unique_ptr<Communicator>> staged_comms_;
  std::unique_ptr<Exchange> exchange_;          // tensor-parallel: the model's collectives
  std::unique_ptr<Exchange> context_exchange_;  // context-parallel: around exchange_
  // Expert parallelism (parallelism.expert > 1): the expert-parallel group's communicator (null
  // when it is the world) and the MoE layers' dispatch over it.
  std::unique_ptr<Communicator> expert_comm_;
  // Its expert-data-parallel group (null: one rank), over which ZeRO shards the experts.
  std::unique_ptr<Communicator> expert_data_comm_;
  std::unique_ptr<ExpertExchange> expert_exchange_;
  void make_expert_group();
  // The communicator to move this rank's tensors over `c` (a group's): `c` itself on CPU ranks,
  // else `c` behind host staging (made once per communicator, kept in staged_comms_).
  Communicator& device_tensors(Communicator& c);
  std::unique_ptr<GradSink> tp_grads_;          // tensor-parallel: drops rank-0-only gradients
  std::unique_ptr<Model> model_;  // (a pipeline stage's with parallelism.pipeline > 1)
  // Interleaved pipelines (virtual_stages V > 1): the models of chunks 1..V-1 (model_ is chunk
  // 0's) and the layout of all of them, which the ZeRO engine and checkpoints use.
  std::vector<std::unique_ptr<Model>> chunk_models_;
  std::unique_ptr<ParamLayout> rank_layout_;
  // This rank's parameter layout (every chunk's units), and f over every model of the rank.
  const ParamLayout& layout() const { return rank_layout_ ? *rank_layout_ : model_->layout(); }
  template <typename F>
  void for_each_model(F&& f) {
    f(*model_);
    for (auto& m : chunk_models_) f(*m);
  }
  // Pipeline parallelism: this rank's schedule over its stage, and the tied embedding's sync
  // between the first and last stage.
  std::unique_ptr<pipeline::PipelineRunner> runner_;
  std::unique_ptr<pipeline::TiedEmbeddingGrads> tied_;
  int pipeline_stages() const { return cfg_.parallelism.pipeline; }
  // wall_clock_breakdown: every rank's timeline of this step, written by rank 0 as a Chrome
  // trace (collective).
  void write_pipeline_trace(int64_t step);
  bool trace_announced_ = false;
  int64_t evaluated_tokens_ = 0;
  std::unique_ptr<ZeroEngine> engine_;
  std::unique_ptr<Data> data_;
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<TensorBoardMonitor> tb_;  // rank 0, with tensorboard.enabled
  // The monitors' run directories (csv_monitor.h): -1 until opened, or from the checkpoint
  // resumed from (recorded in every checkpoint, so a resumed run appends where it left off).
  int64_t csv_run_ = -1, tb_run_ = -1;
  // Rank 0: opens the enabled monitors in their run directories and says where they write.
  void open_monitors();
  int64_t checkpoints_saved_ = 0;       // by this trainer
  std::optional<JobTokenizer> tokenizer_;  // data.tokenizer, when the job has one
  std::unique_ptr<Checkpointer> ckpt_;     // when train.checkpoint_dir is set
  MemorySnapshots* snapshots_ = nullptr;
  void apply_progress(const TrainingProgress& p);
  int64_t global_step_ = 0;             // optimizer steps done (skipped ones included)
  // At every step boundary, collectively: what the ranks agree to do (signals and the
  // controller's commands, offered by rank 0).
  JobControl::Command control_point();
  // comms_logger: rank 0's collectives per communicator (each process group with one of its
  // own) and per kind: calls, bytes, time, bus bandwidth, and bytes per step over `steps` (the
  // steps this run has trained so far).
  void log_comms(int64_t steps) const;
  double peak_flops_ = 0;
  bool mfu_clamped_ = false;
  double step_seconds_ = 0;  // this run's steps: their time, and how many (the ETA)
  int64_t timed_steps_ = 0;
  std::chrono::steady_clock::time_point
      progress_drawn_{};     // an MFU above 100% was reported as 100% (warned once)
  int64_t steps_taken_ = 0;  // non-skipped optimizer steps (drives the LR schedule)
  int64_t skipped_ = 0;
  // Seconds in each phase over the whole run, and their values at the last breakdown print.
  struct PhaseTimes {
    double data = 0, fwd_bwd = 0, comm = 0, optim = 0;
    double offload_io = 0;  // blocked on NVMe offload I/O (inside fwd_bwd and optim)
  };
  PhaseTimes phases_, printed_phases_;
  int64_t breakdown_steps_ = 0;
};

}  // namespace zerod
