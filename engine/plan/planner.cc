#include "engine/plan/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <map>
#include <vector>

#include "core/error.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/shard.h"
#include "zero/partition.h"
#include "zero/zero_engine.h"

namespace zerod {

std::optional<ModelSpec> model_preset(const std::string& name) {
  auto llama = [](ModelArch arch, int C, int I, int L, int NH, int KVH, int V, bool tied, int seq) {
    ModelSpec s;
    s.arch = arch;
    s.n_embd = C;
    s.intermediate_size = I;
    s.n_layer = L;
    s.n_head = NH;
    s.n_kv_head = KVH;
    s.vocab_size = V;
    s.tie_word_embeddings = tied;
    s.qkv_bias = arch == ModelArch::kQwen2;
    s.seq_len = seq;
    return s;
  };
  if (name == "llama2-7b")
    return llama(ModelArch::kLlama, 4096, 11008, 32, 32, 32, 32000, false, 4096);
  if (name == "llama3-8b")
    return llama(ModelArch::kLlama, 4096, 14336, 32, 32, 8, 128256, false, 8192);
  if (name == "llama3-70b")
    return llama(ModelArch::kLlama, 8192, 28672, 80, 64, 8, 128256, false, 8192);
  if (name == "mistral-7b")
    return llama(ModelArch::kMistral, 4096, 14336, 32, 32, 8, 32000, false, 8192);
  if (name == "qwen2-0.5b")
    return llama(ModelArch::kQwen2, 896, 4864, 24, 14, 2, 151936, true, 4096);
  if (name == "qwen2-7b")
    return llama(ModelArch::kQwen2, 3584, 18944, 28, 28, 4, 152064, false, 4096);
  auto make = [](int l, int h, int c) {
    ModelSpec s;
    s.n_layer = l;
    s.n_head = h;
    s.n_embd = c;
    return s;
  };
  if (name == "gpt2" || name == "gpt2-124m") return make(12, 12, 768);
  if (name == "gpt2-medium" || name == "gpt2-350m") return make(24, 16, 1024);
  if (name == "gpt2-large" || name == "gpt2-774m") return make(36, 20, 1280);
  if (name == "gpt2-xl" || name == "gpt2-1.5b") return make(48, 25, 1600);
  return std::nullopt;
}

int64_t parse_bytes(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = -1;
  if (unit.empty() || unit == "b") mult = 1;
  if (unit == "kb") mult = 1e3;
  if (unit == "mb") mult = 1e6;
  if (unit == "gb") mult = 1e9;
  if (unit == "tb") mult = 1e12;
  if (unit == "kib" || unit == "k") mult = 1024.0;
  if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  if (end == text.c_str() || mult < 0 || !(v > 0)) {
    ZD_THROW_INPUT("{} {}: expected a size such as 80GiB, 512MiB or 1.5TB", flag, text);
  }
  return static_cast<int64_t>(v * mult);
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

namespace {

// The ZeRO working buffers of one rank at `stage`, in elements, from its units' padded sizes
// (zero/partition.h) as the buffer pools hold them: a pool hands a freed buffer out again only
// for the same size and keeps it charged, so it holds, per distinct size, the most buffers of
// that size ever in use at once.
//  - Stages 2-3, gradient buckets (zero/grad_reducer.cc): backward finishes the units in
//    decreasing order, each into a bucket that is reduce-scattered when its unit finishes.
//    Without overlap_comm the bucket is returned at once; with it, the oldest buckets are
//    retired only while more than one is in flight and those in flight pass reduce_bucket_size
//    elements, the rest at the end of backward. Replayed here unit by unit. (With gradient
//    accumulation the later micro-batches also take shard-sized partial sums: not counted.)
//  - Stage 3, gathered units (zero/param_gatherer.cc): units of at most the persistence
//    threshold stay gathered for good; of the others, the unit in use and the next one
//    prefetched (prefetching gathers units up to stage3_prefetch_bucket_size), so two of a size
//    several units share (the blocks), one of a size only one unit has (embedding, head).
int64_t zero_buffer_elems(const std::vector<int64_t>& padded, int stage, const PlanRequest& r) {
  if (stage < 2 || padded.empty()) return 0;
  std::map<int64_t, int> count, in_use, most;  // per padded size: units, buckets now, at most
  for (int64_t n : padded) ++count[n];
  std::deque<int64_t> in_flight;  // sizes of the buckets being reduced, oldest first
  int64_t in_flight_elems = 0;
  auto retire_oldest = [&] {
    --in_use[in_flight.front()];
    in_flight_elems -= in_flight.front();
    in_flight.pop_front();
  };
  const bool overlap = r.overlap_comm.value_or(stage == 3);
  for (auto u = padded.rbegin(); u != padded.rend(); ++u) {
    most[*u] = std::max(most[*u], ++in_use[*u]);
    in_flight.push_back(*u);
    in_flight_elems += *u;
    if (!overlap) retire_oldest();
    while (in_flight.size() > 1 && in_flight_elems > r.reduce_bucket_size) retire_oldest();
  }
  int64_t elems = 0;
  for (const auto& [n, buckets] : most) elems += n * buckets;
  if (stage == 3) {
    for (const auto& [n, units] : count) {
      if (n <= r.param_persistence_threshold)
        elems += n * units;
      else
        elems += n * (units >= 2 && n <= r.prefetch_bucket_size ? 2 : 1);
    }
  }
  return elems;
}

}  // namespace

int64_t context_workspace_bytes(const ModelSpec& spec, int tensor, int micro_batch, int seq,
                                int context, const std::string& impl, size_t esz) {
  if (context <= 1) return 0;
  const LocalDims d = local_dims(spec, TensorShard{0, tensor});
  const int64_t rows = int64_t{micro_batch} * (seq / context);
  const int64_t qkv = int64_t{d.n_head + 2 * d.n_kv_head} * d.head_size;
  const int64_t out = int64_t{d.n_head} * d.head_size;
  const int64_t elems =
      impl == "ring" ? 4 * rows * 2 * d.n_kv_head * d.head_size : rows * (4 * qkv + 2 * out);
  return elems * static_cast<int64_t>(esz) + int64_t{seq} * 4;
}

Plan make_plan(const PlanRequest& r) {
  ZD_CHECK_INPUT(r.world >= 1, "--world {}: must be at least 1", r.world);
  ZD_CHECK_INPUT(r.compute_bytes == 2 || r.compute_bytes == 4, "compute element size {}",
                 r.compute_bytes);
  ZD_CHECK_INPUT(r.tensor >= 1 && r.context >= 1 && r.world % (r.tensor * r.context) == 0,
                 "parallelism.tensor {} x parallelism.context {} must divide the world size {} "
                 "(world = tensor x context x data-parallel)",
                 r.tensor, r.context, r.world);
  Plan plan;
  plan.tensor_parallel = r.tensor;
  plan.data_parallel = r.world / (r.tensor * r.context);
  // ZeRO partitions over data x context (the context ranks hold the same parameters).
  const int T = r.tensor, dp = plan.data_parallel * r.context, E = r.expert;
  // psi: this rank's parameters; psi_experts of them in experts units (sharded over dp / E).
  double psi = static_cast<double>(r.params) / T, psi_experts = 0;
  int64_t largest_unit = 0, activations = 0;
  std::vector<int64_t> padded_units;  // each unit's padded size as ZeRO partitions it
  if (r.spec) {
    if (T > 1) {
      const std::string problem = tensor_parallel_problem(*r.spec, T);
      ZD_CHECK_INPUT(problem.empty(), "{}", problem);
    }
    ZD_CHECK_INPUT(E == 1 || r.spec->moe.enabled(),
                   "parallelism.expert {}: expert parallelism needs a model with experts", E);
    ZD_CHECK_INPUT(E == 1 || (r.spec->moe.num_experts % E == 0 && dp % E == 0),
                   "parallelism.expert {} must divide the experts ({}) and the data-parallel "
                   "size ({})",
                   E, r.spec->moe.num_experts, dp);
    // This rank's part of the model as the trainer lays it out (every tensor-parallel and
    // expert-parallel rank's layout has the same units and sizes).
    const ParamLayout layout(*r.spec, 16, TensorShard{0, T, false, 0, E});
    psi = static_cast<double>(layout.total_numel());
    for (int u = 0; u < layout.num_units(); ++u) {
      largest_unit = std::max(largest_unit, layout.unit(u).numel);
      if (layout.unit(u).experts && E > 1) psi_experts += static_cast<double>(layout.unit(u).numel);
    }
    const Partition part(layout, dp, 16, E > 1 ? dp / E : 0);
    for (int u = 0; u < part.num_units(); ++u) padded_units.push_back(part.unit(u).padded);
    plan.parameters = r.spec->num_parameters();
    const int seq = std::min(r.seq, r.spec->seq_len);
    const size_t esz = static_cast<size_t>(r.compute_bytes);
    // The model's own allocation formula for one of T ranks (sequence parallelism: the norm
    // and residual regions hold N / T of the micro-batch's N positions).
    activations = model_activation_bytes(*r.spec, r.micro_batch, seq, r.activation_checkpointing,
                                         esz, T, r.sequence_parallel && T > 1, r.context);
    activations +=
        context_workspace_bytes(*r.spec, T, r.micro_batch, seq, r.context, r.context_impl, esz);
  } else {
    ZD_CHECK_INPUT(r.params > 0, "a model shape or a parameter count is needed");
    plan.parameters = r.params;
    largest_unit = static_cast<int64_t>(psi / 12);  // a guess: a tied embedding or one block
    padded_units.assign(12, largest_unit);          // (the same guess for the ZeRO buffers)
  }
  plan.padded_parameters = static_cast<int64_t>(psi);
  // ZeRO partitions each rank's parameters over its data-parallel group.
  const double n = dp, e = r.compute_bytes;

  struct Choice {
    int stage;
    const char* opt;
    const char* param;
  };
  const Choice choices[] = {{0, "none", "none"}, {1, "none", "none"}, {2, "none", "none"},
                            {3, "none", "none"}, {2, "cpu", "none"},  {3, "cpu", "none"},
                            {3, "cpu", "cpu"},   {3, "nvme", "none"}, {3, "nvme", "nvme"}};
  for (const Choice& c : choices) {
    const std::string off = c.opt;
    if (!r.offload.empty() && r.offload != "all") {
      if (r.offload == "none" && off != "none") continue;
      if ((r.offload == "cpu" || r.offload == "nvme") && off != "none" && off != r.offload)
        continue;
    }
    if (dp == 1 && c.stage > 0 && off == "none") continue;  // the same as stage 0
    PlanRow row;
    row.stage = c.stage;
    row.offload_optimizer = c.opt;
    row.offload_param = c.param;
    // (The experts units over their expert-data-parallel group of dp / E ranks.)
    ModelStateBytes ms = zero_formula_bytes(psi - psi_experts, dp, c.stage, r.compute_bytes);
    if (psi_experts > 0) {
      const ModelStateBytes x = zero_formula_bytes(psi_experts, dp / E, c.stage, r.compute_bytes);
      ms.weights += x.weights;
      ms.gradients += x.gradients;
      ms.master += x.master;
      ms.moments += x.moments;
    }
    row.weights = ms.weights;
    row.gradients = ms.gradients;
    row.activations = activations;
    row.buffers = static_cast<int64_t>(zero_buffer_elems(padded_units, c.stage, r) * e);
    const double opt_psi = c.stage >= 1 ? (psi - psi_experts) / n + psi_experts / (n / E) : psi;
    if (off == "none") {
      row.optimizer = ms.master + ms.moments;
    } else {
      // Offloaded: fp32 master and moments (and an fp32 copy of the gradient shard for the
      // optimizer) live on the host, or on disk with the host holding staging buffers.
      const int64_t states = static_cast<int64_t>(12 * opt_psi);
      const int64_t grads32 = static_cast<int64_t>(4 * opt_psi);
      if (off == "cpu") {
        row.host += states + grads32;
      } else {
        row.disk += states;
        // Staging: two units of master and moments in flight (double-buffered).
        row.host += grads32 + static_cast<int64_t>(std::min(opt_psi, 2.0 * largest_unit) * 12);
      }
      if (std::string(c.param) != "none") {
        // Parameters too: the device keeps only the gathered working set.
        if (std::string(c.param) == "cpu")
          row.host += row.weights;
        else
          row.disk += row.weights;
        row.weights = 0;
      }
    }
    row.device = row.weights + row.gradients + row.optimizer + row.activations + row.buffers;
    row.name =
        c.stage == 0
            ? (dp == 1 ? (T == 1 ? "single rank (no ZeRO)" : "no ZeRO (tensor-parallel only)")
                       : "ZeRO-0 (DDP)")
            : fmt::format("ZeRO-{}", c.stage);
    if (off != "none") {
      row.name += fmt::format(" + optimizer on {}", off);
      if (std::string(c.param) != "none") row.name += fmt::format(" + params on {}", c.param);
    }
    std::vector<std::string> why;
    if (r.device_bytes > 0 && row.device > r.device_bytes) {
      why.push_back(fmt::format("device needs {} of {}", format_bytes(row.device),
                                format_bytes(r.device_bytes)));
    }
    const int64_t host_node = row.host * std::max(1, r.ranks_per_node);
    if (r.host_bytes > 0 && host_node > r.host_bytes) {
      why.push_back(fmt::format("host needs {} per node of {}", format_bytes(host_node),
                                format_bytes(r.host_bytes)));
    }
    row.fits = why.empty();
    row.why = fmt::format("{}", fmt::join(why, "; "));
    plan.rows.push_back(row);
  }
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (plan.rows[i].fits) {
      plan.recommended = static_cast<int>(i);
      break;
    }
  }
  return plan;
}

}  // namespace zerod
