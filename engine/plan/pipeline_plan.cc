// pipeline_plan.h: the partition over the model's layout, the ZeRO formula per rank and the
// schedule's simulation.
#include "engine/plan/pipeline_plan.h"

#include <fmt/format.h>

#include "engine/config/model_spec.h"
#include "engine/plan/planner.h"
#include "model/layout.h"
#include "model/model.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/simulate.h"
#include "zero/zero_engine.h"

namespace zerod {

namespace {

int64_t real_parameters(const UnitLayout& u) {
  int64_t n = 0;
  for (const TensorInfo& t : u.tensors) n += t.numel;
  return n;
}

}  // namespace

PipelinePlan make_pipeline_plan(const JobConfig& cfg) {
  const ParallelismConfig& par = cfg.parallelism;
  PipelinePlan plan;
  plan.schedule = par.pipeline_schedule;
  plan.ranks = par.pipeline;
  plan.virtual_stages = par.virtual_stages;
  plan.micro_batches = static_cast<int>(cfg.grad_accum());
  const int P = plan.ranks, V = plan.virtual_stages, S = P * V;
  const ParamLayout layout(model_spec(cfg.model), 16, TensorShard{0, par.tensor});
  const int L = layout.spec().n_layer;

  pipeline::PartitionRequest req;
  req.layers = L;
  req.stages = S;
  req.method = par.pipeline_partition == "explicit"     ? pipeline::PartitionMethod::kExplicit
               : par.pipeline_partition == "parameters" ? pipeline::PartitionMethod::kParameters
                                                        : pipeline::PartitionMethod::kUniform;
  req.counts = par.pipeline_layers;
  for (int l = 0; l < L; ++l) {
    const int e = layout.experts_unit(l);  // (a MoE block's routed experts)
    req.layer_params.push_back(real_parameters(layout.unit(layout.block_unit(l))) +
                               (e >= 0 ? real_parameters(layout.unit(e)) : 0));
  }
  const UnitLayout& emb = layout.unit(layout.embedding_unit());
  req.first_params = real_parameters(emb);
  // The head: the final unit (norm, and lm_head when untied), or with a tied embedding the
  // final norm plus a copy of the embedding matrix (its first tensor).
  const bool tied = layout.lm_head_offset() < 0;
  req.last_params =
      real_parameters(layout.unit(layout.final_unit())) + (tied ? emb.tensors.front().numel : 0);
  const std::vector<int> counts = pipeline::partition_layers(req);
  const std::vector<int> first = pipeline::stage_first_layers(counts);

  plan.rank_parameters.assign(static_cast<size_t>(P), 0);
  for (int s = 0; s < S; ++s) {
    PipelineStagePlan st;
    st.stage = s;
    st.rank = pipeline::stage_rank(s, P);
    st.chunk = pipeline::stage_chunk(s, P);
    st.first_layer = first[s];
    st.layers = counts[s];
    st.embedding = s == 0;
    st.head = s == S - 1;
    for (int l = first[s]; l < first[s + 1]; ++l) st.parameters += req.layer_params[l];
    if (st.embedding) st.parameters += req.first_params;
    if (st.head) st.parameters += req.last_params;
    plan.rank_parameters[st.rank] += st.parameters;
    plan.stages.push_back(st);
  }
  const int zero_group = cfg.data_parallel_size * par.context;
  const int compute_bytes = static_cast<int>(dtype_size(cfg.compute_dtype()));
  for (int64_t p : plan.rank_parameters) {
    plan.rank_state_bytes.push_back(
        zero_formula_bytes(static_cast<double>(p), zero_group, cfg.zero.stage, compute_bytes)
            .states());
  }

  pipeline::ScheduleKind kind{};
  if (pipeline::parse_schedule_name(par.pipeline_schedule, kind)) {
    const pipeline::Schedule schedule = pipeline::make_schedule(kind, P, plan.micro_batches, V);
    const pipeline::Simulation sim = pipeline::simulate(schedule, plan.micro_batches, V);
    plan.bubble = sim.bubble;
    plan.live_micro_batches = sim.peak_live;
    // Each rank's stage models (one per chunk) with a slot per live micro-batch of each
    // (compute elements: fp32 arrays on CPU ranks whatever the dtype, 16-bit on GPUs);
    // zero-bubble: plus the split backward's copies of the micro-batches between Bi and W.
    const ModelSpec spec = model_spec(cfg.model);
    const size_t esz = cfg.train.device == TrainDevice::kCuda ? dtype_size(cfg.compute_dtype()) : 4;
    const int B = static_cast<int>(cfg.micro_batch());
    const int T = cfg.model.seq_len;
    for (int r = 0; r < P; ++r) {
      const std::vector<pipeline::Action>& actions = schedule[static_cast<size_t>(r)];
      // (Context parallelism: a rank's stage models hold T / C positions of each sequence, and
      // its context exchange one set of workspaces.)
      int64_t bytes =
          context_workspace_bytes(spec, par.tensor, B, T, par.context, par.context_impl, esz);
      for (int c = 0; c < V; ++c) {
        const PipelineStagePlan& st =
            plan.stages[static_cast<size_t>(pipeline::global_stage(r, c, P))];
        const LayerRange range{st.first_layer, st.first_layer + st.layers};
        bytes += model_activation_bytes(spec, B, T, cfg.model.activation_checkpointing, esz,
                                        par.tensor, par.sequence_parallel && par.tensor > 1,
                                        par.context, range, pipeline::slots_needed(actions, c)) +
                 pipeline::weight_passes_pending(actions) *
                     split_backward_bytes(spec, B, T / par.context, esz, par.tensor, range);
      }
      plan.rank_activation_bytes.push_back(bytes);
    }
  }
  return plan;
}

std::string format_pipeline_plan(const PipelinePlan& p) {
  std::string out = fmt::format(
      "pipeline: {} stages on {} ranks ({} virtual stage{} each), schedule {}, {} micro-batches "
      "per step: simulated bubble {:.4f} (unit costs F = 1, B = 2; Bi = W = 1)\n",
      p.ranks * p.virtual_stages, p.ranks, p.virtual_stages, p.virtual_stages == 1 ? "" : "s",
      p.schedule, p.micro_batches, p.bubble);
  for (const PipelineStagePlan& s : p.stages) {
    out += fmt::format("  stage {} (rank {}, chunk {}): layers {}-{} ({}){}{}, {} parameters\n",
                       s.stage, s.rank, s.chunk, s.first_layer, s.first_layer + s.layers - 1,
                       s.layers, s.embedding ? " + embedding" : "",
                       s.head ? " + final norm and head" : "", s.parameters);
  }
  for (size_t r = 0; r < p.rank_parameters.size(); ++r) {
    out += fmt::format(
        "  rank {}: {} parameters, model states {} per rank (ZeRO formula: weights, gradients, "
        "optimizer), activations {} (at most {} micro-batch activations live)\n",
        r, p.rank_parameters[r], format_bytes(p.rank_state_bytes[r]),
        r < p.rank_activation_bytes.size() ? format_bytes(p.rank_activation_bytes[r])
                                           : std::string("not estimated (virtual stages)"),
        r < p.live_micro_batches.size() ? p.live_micro_batches[r] : 0);
  }
  return out;
}

}  // namespace zerod
