#include "zero/zero_engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "comm/self/self_communicator.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/optim.h"
#include "zero/compute_comm.h"

namespace zerod {

namespace {
char* at(void* base, int64_t elems, size_t esz) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esz);
}
double mib(int64_t b) {
  return static_cast<double>(b) / (1 << 20);
}
}  // namespace

ZeroEngine::ZeroEngine(const ParamLayout& layout, Backend& backend, const ZeroOptions& options,
                       MemoryTracker* tracker)
    : layout_(layout),
      be_(backend),
      opt_(options),
      tracker_(tracker),
      partition_(layout, options.stage >= 1 ? options.world_size : 1, 16,
                 layout.shard().expert_size == 1 ? 0
                 : options.stage >= 1            ? options.expert_world_size
                                                 : 1),
      esz_(backend.compute_elem_size()) {
  ZD_CHECK(opt_.stage >= 0 && opt_.stage <= 3, "ZeRO stage {}", opt_.stage);
  ZD_CHECK(opt_.world_size >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world_size,
           "rank {} of world {}", opt_.rank, opt_.world_size);
  auto self_comm = [this] {
    SelfCommunicator::Copy copy;
    if (be_.device_memory()) {
      copy = [this](void* dst, const void* src, size_t bytes) { be_.copy(dst, src, bytes); };
    }
    return std::make_unique<SelfCommunicator>(std::chrono::minutes(5), nullptr, copy);
  };
  if (opt_.comm == nullptr) {
    ZD_CHECK(opt_.world_size == 1, "world size {} needs a communicator", opt_.world_size);
    self_comm_ = self_comm();
    opt_.comm = self_comm_.get();
  }
  ZD_CHECK(opt_.comm->size() == opt_.world_size && opt_.comm->rank() == opt_.rank,
           "communicator is rank {} of {}, engine rank {} of {}", opt_.comm->rank(),
           opt_.comm->size(), opt_.rank, opt_.world_size);
  if (expert_groups()) {
    const int ew = opt_.expert_world_size;
    ZD_CHECK(ew >= 1 && opt_.world_size % ew == 0 && opt_.expert_rank >= 0 && opt_.expert_rank < ew,
             "expert-data-parallel rank {} of {} in a data-parallel group of {}", opt_.expert_rank,
             ew, opt_.world_size);
    if (opt_.expert_comm == nullptr) {
      ZD_CHECK(ew == 1, "an expert-data-parallel group of {} needs a communicator", ew);
      expert_self_comm_ = self_comm();
      expert_comm_ = expert_self_comm_.get();
    } else {
      ZD_CHECK(opt_.expert_comm->size() == ew && opt_.expert_comm->rank() == opt_.expert_rank,
               "expert communicator is rank {} of {}, engine expert rank {} of {}",
               opt_.expert_comm->rank(), opt_.expert_comm->size(), opt_.expert_rank, ew);
      expert_comm_ = opt_.expert_comm;
    }
    if (opt_.host_expert_comm == nullptr && !be_.device_memory())
      opt_.host_expert_comm = expert_comm_;
    ZD_CHECK_INPUT(!opt_.powersgd && opt_.onebit == OnebitKind::kNone,
                   "parallelism.expert {}: communication_compression and the 1-bit optimizers do "
                   "not run with expert parallelism yet (the experts' gradients reduce over their "
                   "own group)",
                   layout_.shard().expert_size);
  }
  if (opt_.model_parallel_comm != nullptr && opt_.model_parallel_comm->size() == 1)
    opt_.model_parallel_comm = nullptr;
  // The host communicators default to the groups' own on CPU ranks; one rank on device memory
  // exchanges nothing (its SelfCommunicator copies through the backend).
  if (opt_.host_comm == nullptr) {
    ZD_CHECK(!be_.device_memory() || opt_.world_size == 1,
             "a data-parallel group of {} on device memory needs its host communicator",
             opt_.world_size);
    opt_.host_comm = opt_.comm;
  }
  if (opt_.host_model_parallel_comm == nullptr && !be_.device_memory())
    opt_.host_model_parallel_comm = opt_.model_parallel_comm;
  if (opt_.model_parallel_comm == nullptr) opt_.host_model_parallel_comm = nullptr;
  bool all_counted = true;
  for (int u = 0; u < layout_.num_units(); ++u)
    for (const TensorInfo& t : layout_.unit(u).tensors)
      all_counted &= layout_.counted_in_norm(u, t);
  if (!all_counted) {
    // The counted tensors of each unit, clipped to this rank's shard (shard coordinates).
    for (int u = 0; u < layout_.num_units(); ++u) {
      const UnitPartition& up = partition_.unit(u);
      const int64_t lo = up.begin(owner_rank(u)), hi = lo + up.shard;
      std::vector<std::pair<int64_t, int64_t>> r;
      for (const TensorInfo& t : layout_.unit(u).tensors) {
        if (!layout_.counted_in_norm(u, t)) continue;
        const int64_t b = std::max(lo, t.offset), e = std::min(hi, t.offset + t.numel);
        if (b < e) r.emplace_back(b - lo, e - lo);
      }
      norm_ranges_.push_back(std::move(r));
    }
  }
  place_parameters();
  place_optimizer_states();
  ReducerOptions ro;
  ro.stage = opt_.stage;
  ro.rank = opt_.stage >= 1 ? opt_.rank : 0;
  ro.comm = opt_.comm;
  if (expert_groups()) {
    ro.expert_rank = opt_.stage >= 1 ? opt_.expert_rank : 0;
    ro.expert_comm = expert_comm_;
  }
  ro.reduce_bucket_size = opt_.reduce_bucket_size;
  ro.overlap_comm = opt_.overlap_comm;
  if (opt_.powersgd) {
    ZD_CHECK_INPUT(opt_.stage == 0,
                   "communication_compression: powersgd serves ZeRO stage 0 only, not stage {}",
                   opt_.stage);
    powersgd_ =
        std::make_unique<PowerSgd>(layout_, partition_, be_, opt_.comm, *opt_.powersgd, tracker);
    ro.compression = powersgd_.get();
  }
  reducer_ = std::make_unique<GradReducer>(partition_, be_, ro, tracker);
  if (opt_.onebit != OnebitKind::kNone) {
    // CPU ranks: the states where the model is (fp32). GPU ranks: in host memory, all of them.
    const bool states_ok = be_.device_memory() ? opt_.optimizer_states == StatesHome::kHost &&
                                                     split_ == partition_.shard_elems_total()
                                               : esz_ == 4 && !offloaded();
    ZD_CHECK_INPUT(opt_.stage == 0 && states_ok,
                   "the 1-bit optimizers run at ZeRO stage 0 with their states in host memory "
                   "(stage {}{})",
                   opt_.stage, states_ok ? "" : ", states elsewhere");
    ZD_CHECK(opt_.model_parallel_comm == nullptr || opt_.host_model_parallel_comm != nullptr,
             "the 1-bit optimizers on device memory need the model-parallel host communicator");
    onebit_ =
        std::make_unique<OnebitOptimizer>(opt_.onebit, opt_.onebit_config, layout_, partition_,
                                          *opt_.host_comm, opt_.host_model_parallel_comm);
  }
  if (opt_.stage >= 3) {
    GathererOptions go;
    go.comm = opt_.comm;
    if (expert_groups()) go.expert_comm = expert_comm_;
    go.prefetch_bucket_size = opt_.prefetch_bucket_size;
    go.param_persistence_threshold = opt_.param_persistence_threshold;
    go.max_live_parameters = opt_.max_live_parameters;
    if (param_swapper_ || params_on_host()) {
      go.shard_of = [this](int u, void* in_place) { return shard_in_place(u, in_place); };
    }
    gatherer_ = std::make_unique<ParamGatherer>(partition_, be_, go, weights_.data(), tracker);
  }
}

ZeroEngine::~ZeroEngine() = default;

// The compute weights: in the compute pool (stages 0-2 whole, stage 3 its shards), or with
// parameter offload (stage 3) in host memory, and with NVMe for the units beyond max_in_cpu in
// the parameter swapper.
void ZeroEngine::place_parameters() {
  const int64_t shard_total = partition_.shard_elems_total();
  ZD_CHECK(opt_.param_states == StatesHome::kDevice || opt_.stage == 3,
           "parameter offload needs stage 3, not {}", opt_.stage);
  if (opt_.param_states == StatesHome::kDevice) {
    const int64_t weight_elems = opt_.stage >= 3 ? shard_total : partition_.padded_elems_total();
    weights_ =
        be_.allocate(static_cast<size_t>(weight_elems) * esz_, MemCategory::kWeights, tracker_);
  } else {
    // Parameter offload: the shards (or, with NVMe, those of the leading units that fit in
    // max_in_cpu) in host memory.
    int64_t resident = shard_total;
    if (opt_.param_states == StatesHome::kNvme) {
      resident_param_units_ = 0;
      while (resident_param_units_ < layout_.num_units() &&
             partition_.shard_offset(resident_param_units_) +
                     partition_.unit(resident_param_units_).shard <=
                 opt_.param_max_in_cpu) {
        ++resident_param_units_;
      }
      resident = resident_shard_elems();
      std::vector<int64_t> regions;
      int64_t most = 0;
      for (int u = 0; u < layout_.num_units(); ++u) {
        const int64_t n = u < resident_param_units_ ? 0 : partition_.unit(u).shard;
        regions.push_back(n * static_cast<int64_t>(esz_));
        most = std::max(most, n);
      }
      ZD_CHECK_INPUT(opt_.param_buffer_size >= most,
                     "zero_optimization.offload_param.buffer_size: {} elements, but the largest "
                     "parameter shard on NVMe has {} (a buffer holds one shard)",
                     opt_.param_buffer_size, most);
      param_swapper_ = std::make_unique<ParamSwapper>(
          opt_.param_swap_path, std::move(regions),
          opt_.param_buffer_size * static_cast<int64_t>(esz_), opt_.param_pin_memory,
          opt_.param_aio, tracker_, host_registrar());
    }
    if (resident > 0)
      weights_ = be_.allocate_host(static_cast<size_t>(resident) * esz_, MemCategory::kOffloaded,
                                   tracker_);
  }
}

// The fp32 master weights and Adam moments (ZeroOptions::optimizer_states).
void ZeroEngine::place_optimizer_states() {
  const int64_t shard_total = partition_.shard_elems_total();
  ZD_CHECK(opt_.offload_ratio > 0 && opt_.offload_ratio <= 1, "offload ratio {}",
           opt_.offload_ratio);
  if (opt_.optimizer_states == StatesHome::kNvme) {
    SwapOptions so = opt_.swap;
    so.registrar = host_registrar();
    swapper_ = std::make_unique<StateSwapper>(opt_.swap_path, shard_total, so, tracker_);
  } else {
    split_ = 0;
    if (opt_.optimizer_states == StatesHome::kHost) {
      // The leading units whose shards fit in offload_ratio of the shard go to the host.
      const double want = opt_.offload_ratio * static_cast<double>(shard_total);
      for (int u = 0; u < layout_.num_units(); ++u) {
        const int64_t end = partition_.shard_offset(u) + partition_.unit(u).shard;
        if (opt_.offload_ratio < 1 && static_cast<double>(end) > want + 0.5) break;
        split_ = end;
      }
    }
    const int64_t dev = shard_total - split_;
    for (int k = fp32_alias() ? 1 : 0; k < 3; ++k) {
      const MemCategory c = k == 0 ? MemCategory::kMaster : MemCategory::kMoments;
      if (split_ > 0)
        host_[k] =
            be_.allocate_host(static_cast<size_t>(split_) * 4, MemCategory::kOffloaded, tracker_);
      if (dev > 0) dev_[k] = be_.allocate(static_cast<size_t>(dev) * 4, c, tracker_);
    }
  }
}

void* ZeroEngine::weight_region(int u) {
  const UnitPartition& up = partition_.unit(u);
  if (param_on_nvme(u)) return nullptr;
  if (opt_.stage >= 3) return at(weights_.data(), partition_.shard_offset(u), esz_);
  return at(weights_.data(), partition_.padded_offset(u) + up.begin(owner_rank(u)), esz_);
}

int64_t ZeroEngine::resident_shard_elems() const {
  if (resident_param_units_ >= layout_.num_units()) return partition_.shard_elems_total();
  return partition_.shard_offset(resident_param_units_);
}

void* ZeroEngine::weight_target(int u) {
  return param_on_nvme(u) ? param_swapper_->stage(u) : weight_region(u);
}

void ZeroEngine::weight_written(int u, int64_t hi) {
  if (param_on_nvme(u) && hi == partition_.unit(u).shard) param_swapper_->write_staged(u);
}

float* ZeroEngine::state(int which, int u) {
  ZD_CHECK(states_resident(), "the optimizer states of unit {} are on NVMe", u);
  const int64_t off = partition_.shard_offset(u);
  if (off < split_) return host_[which].as<float>() + off;
  return dev_[which].as<float>() + (off - split_);
}

float* ZeroEngine::master(int u) {
  if (fp32_alias()) return static_cast<float*>(weight_region(u));
  return state(0, u);
}
float* ZeroEngine::exp_avg(int u) {
  return state(1, u);
}
float* ZeroEngine::exp_avg_sq(int u) {
  return state(2, u);
}

void ZeroEngine::visit_states(StatesMode mode, int u0, int u1, const StatesVisitor& fn) {
  if (u0 >= u1) return;
  if (states_resident()) {
    for (int u = u0; u < u1; ++u) {
      const int64_t n = partition_.unit(u).shard;
      if (n > 0) fn(u, 0, n, master(u), exp_avg(u), exp_avg_sq(u));
    }
    return;
  }
  // NVMe: sub-group pieces of the shard range of units [u0, u1), cut at unit boundaries.
  const int64_t begin = partition_.shard_offset(u0);
  const int64_t end = partition_.shard_offset(u1 - 1) + partition_.unit(u1 - 1).shard;
  int u = u0;
  swapper_->visit(mode, begin, end, [&](int64_t b, int64_t e, float* pm, float* pa, float* pv) {
    while (partition_.shard_offset(u) + partition_.unit(u).shard <= b) ++u;
    for (int w = u; w < u1 && partition_.shard_offset(w) < e; ++w) {
      const int64_t so = partition_.shard_offset(w);
      const int64_t lo = std::max(b, so), hi = std::min(e, so + partition_.unit(w).shard);
      if (lo >= hi) continue;
      fn(w, lo - so, hi - so, pm + (lo - b), pa + (lo - b), pv + (lo - b));
    }
  });
}

bool ZeroEngine::states_on_host(int u) const {
  if (!be_.device_memory() || swapper_) return true;
  return partition_.shard_offset(u) < split_;
}

bool ZeroEngine::states_addressable() const {
  return swapper_ == nullptr && (!be_.device_memory() || split_ == partition_.shard_elems_total());
}

void ZeroEngine::visit_states_host(StatesMode mode, int u0, int u1, const StatesVisitor& fn) {
  visit_states(mode, u0, u1, [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
    if (states_on_host(u)) return fn(u, lo, hi, pm, pa, pv);
    // Device states: through a host copy of the piece.
    const int64_t n = hi - lo;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    float* host = host_stage(3 * n);
    float* dev[3] = {pm, pa, pv};
    if (mode != StatesMode::kOverwrite) {
      for (int k = 0; k < 3; ++k) be_.copy(host + k * n, dev[k], bytes);
    }
    fn(u, lo, hi, host, host + n, host + 2 * n);
    if (mode != StatesMode::kRead) {
      for (int k = 0; k < 3; ++k) be_.copy(dev[k], host + k * n, bytes);
    }
  });
}

float* ZeroEngine::host_stage(int64_t floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (host_stage_.bytes() < bytes) {
    host_stage_.reset();
    host_stage_ = be_.allocate_host(bytes, MemCategory::kPinned, tracker_);
  }
  return host_stage_.as<float>();
}

HostRegistrar ZeroEngine::host_registrar() {
  if (!be_.device_memory()) return {};
  return {[this](void* p, size_t bytes) { be_.register_host(p, bytes); },
          [this](void* p) { be_.unregister_host(p); }};
}

bool ZeroEngine::params_on_host() const {
  return opt_.param_states != StatesHome::kDevice && be_.device_memory();
}

const void* ZeroEngine::shard_in_place(int u, void* in_place) {
  const size_t bytes = static_cast<size_t>(partition_.unit(u).shard) * esz_;
  if (param_on_nvme(u)) {
    if (!be_.device_memory()) {
      param_swapper_->read(u, in_place);
    } else {  // NVMe -> a host buffer -> the device
      void* staged = host_stage((static_cast<int64_t>(bytes) + 3) / 4);
      param_swapper_->read(u, staged);
      be_.copy(in_place, staged, bytes);
    }
    return in_place;
  }
  if (params_on_host()) {  // host -> the device, where the collective runs
    be_.copy(in_place, weight_region(u), bytes);
    return in_place;
  }
  return weight_region(u);
}

double ZeroEngine::sum_over_ranks(double local, Communicator* comm) {
  sum_over_ranks(&local, 1, comm);
  return local;
}

void ZeroEngine::sum_over_ranks(double* values, int64_t n, Communicator* comm) {
  if (comm == nullptr) comm = opt_.comm;
  if (!be_.device_memory()) {
    comm->all_reduce(values, n, CommType::kF64, ReduceOp::kSum);
    return;
  }
  // Collectives on a GPU backend run on device memory.
  const size_t bytes = static_cast<size_t>(n) * sizeof(double);
  if (scalar_.bytes() < bytes) {
    scalar_.reset();
    scalar_ = be_.allocate(bytes, MemCategory::kWorkspace, tracker_);
  }
  be_.copy(scalar_.data(), values, bytes);
  comm->all_reduce(scalar_.data(), n, CommType::kF64, ReduceOp::kSum);
  be_.copy(values, scalar_.data(), bytes);
}

double ZeroEngine::shard_sum_squares(bool experts) {
  // One call over every piece: a device backend waits for the device once, not per unit.
  std::vector<std::pair<const void*, int64_t>> pieces;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (partition_.unit(u).experts != experts) continue;
    if (norm_ranges_.empty()) {
      pieces.emplace_back(reducer_->shard(u), partition_.unit(u).shard);
      continue;
    }
    const char* g = static_cast<const char*>(reducer_->shard(u));
    for (const auto& [b, e] : norm_ranges_[static_cast<size_t>(u)])
      pieces.emplace_back(g + static_cast<size_t>(b) * esz_, e - b);
  }
  return be_.sum_squares_pieces(pieces);
}

double ZeroEngine::global_sum_squares() {
  const bool distributed = opt_.comm->size() > 1;
  if (!expert_groups()) {
    // Stage 0 ranks hold identical reduced gradients; the others hold disjoint shards.
    const double s = shard_sum_squares();
    return distributed && opt_.stage >= 1 ? sum_over_ranks(s) : s;
  }
  // Stages 1-3: the data-parallel group's shards of the other units, and the expert-data-parallel
  // groups' shards of each one's experts, every element once. Stage 0: the other units the same
  // on every rank, the experts differing by expert-parallel rank.
  const double dense = shard_sum_squares(false), experts = shard_sum_squares(true);
  if (opt_.stage >= 1) return distributed ? sum_over_ranks(dense + experts) : dense + experts;
  if (opt_.expert_parallel_comm == nullptr) return dense + experts;
  return dense + sum_over_ranks(experts, opt_.expert_parallel_comm);
}

void ZeroEngine::init_weights(uint64_t seed) {
  visit_states_host(StatesMode::kOverwrite, 0, layout_.num_units(),
                    [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                      const UnitPartition& up = partition_.unit(u);
                      const int owner = owner_rank(u);
                      const int64_t begin = up.begin(owner), valid = std::min(up.valid(owner), hi);
                      std::fill(pm, pm + (hi - lo), 0.0f);
                      std::fill(pa, pa + (hi - lo), 0.0f);
                      std::fill(pv, pv + (hi - lo), 0.0f);
                      if (valid > lo) layout_.init_range(u, pm, begin + lo, begin + valid, seed);
                      if (fp32_alias()) return;
                      be_.cast_to_compute(at(weight_target(u), lo, esz_), pm, hi - lo);
                      weight_written(u, hi);
                    });
  publish_weights();
}

void ZeroEngine::set_master_unit(int u, const float* unit_flat) {
  const UnitPartition& up = partition_.unit(u);
  const int64_t begin = up.begin(owner_rank(u)), valid = up.valid(owner_rank(u));
  visit_states_host(StatesMode::kUpdate, u, u + 1,
                    [&](int, int64_t lo, int64_t hi, float* pm, float*, float*) {
                      const int64_t v = std::clamp(valid, lo, hi);
                      std::copy(unit_flat + begin + lo, unit_flat + begin + v, pm);
                      std::fill(pm + (v - lo), pm + (hi - lo), 0.0f);
                    });
}

void ZeroEngine::refresh_weights() {
  if (!fp32_alias()) {
    visit_states(StatesMode::kRead, 0, layout_.num_units(),
                 [&](int u, int64_t lo, int64_t hi, float* pm, float*, float*) {
                   be_.cast_to_compute(at(weight_target(u), lo, esz_), pm, hi - lo);
                   weight_written(u, hi);
                 });
  }
  publish_weights();
}

void ZeroEngine::publish_weights() {
  if (opt_.stage == 1 || opt_.stage == 2) gather_weights();
  if (gatherer_) gatherer_->shards_changed();
}

void ZeroEngine::gather_weights() {
  // Every unit's shard is gathered in place over its group; at most allgather_bucket_size
  // elements in flight.
  std::deque<std::pair<WorkPtr, int64_t>> in_flight;
  int64_t elems = 0;
  Stopwatch sw;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitPartition& up = partition_.unit(u);
    Communicator& comm = unit_comm(u);
    if (comm.size() == 1) continue;
    void* full = at(weights_.data(), partition_.padded_offset(u), esz_);
    in_flight.emplace_back(
        comm.all_gather_async(weight_region(u), full, up.shard, compute_comm_type(be_)), up.padded);
    elems += up.padded;
    while (in_flight.size() > 1 && elems > opt_.allgather_bucket_size) {
      in_flight.front().first->wait();
      elems -= in_flight.front().second;
      in_flight.pop_front();
    }
  }
  for (auto& w : in_flight) w.first->wait();
  gather_wait_seconds_ += sw.seconds();
}

void ZeroEngine::gather_unit(int u, void* out) {
  const UnitPartition& up = partition_.unit(u);
  if (opt_.stage < 3) {
    be_.copy(out, at(weights_.data(), partition_.padded_offset(u), esz_),
             static_cast<size_t>(up.padded) * esz_);
    return;
  }
  Communicator& comm = unit_comm(u);
  void* in_place = at(out, static_cast<int64_t>(comm.rank()) * up.shard, esz_);
  comm.all_gather(shard_in_place(u, in_place), out, up.shard, compute_comm_type(be_));
}

void ZeroEngine::zero_grad() {
  reducer_->zero_grad();
}
void ZeroEngine::begin_micro_batch(bool last) {
  if (onebit_) reducer_->set_reduce(onebit_->reduces_gradients(adam_steps_ + 1));
  reducer_->begin_micro_batch(last);
  // NVMe optimizer states: the step's first sub-groups are read during this micro-batch.
  if (last && swapper_) swapper_->prefetch();
}

const void* ZeroEngine::acquire(int unit) {
  if (gatherer_) return gatherer_->acquire(unit);
  return at(weights_.data(), partition_.padded_offset(unit), esz_);
}
void ZeroEngine::release(int unit) {
  if (gatherer_) gatherer_->release(unit);
}
void ZeroEngine::prefetch(int unit) {
  if (gatherer_) gatherer_->prefetch(unit);
}

OptimizerKind optimizer_kind(const std::string& type) {
  if (type == "Adam" || type == "AdamW") return OptimizerKind::kAdam;
  if (type == "SGD") return OptimizerKind::kSgd;
  if (type == "Adagrad") return OptimizerKind::kAdagrad;
  if (type == "Lion") return OptimizerKind::kLion;
  if (type == "Muon") return OptimizerKind::kMuon;
  if (type == "Lamb") return OptimizerKind::kLamb;
  // The 1-bit optimizers' warm-up steps are Adam's kernel (zero/onebit.h).
  if (onebit_kind(type) != OnebitKind::kNone) return OptimizerKind::kAdam;
  ZD_THROW_INPUT(
      "optimizer type '{}' is not supported (Adam, AdamW, SGD, Adagrad, Lion, Muon, Lamb)", type);
}

namespace {

// The step's result from the global norm of the unscaled, averaged gradients: inf/NaN (from
// inf/NaN gradients on any rank) is an overflow; otherwise DeepSpeed / torch clip_grad_norm_'s
// coef = max_norm / (norm + 1e-6) when below 1 (max_grad_norm 0: no clipping).
StepResult norm_and_clip(double grad_norm, double max_grad_norm) {
  StepResult r;
  if (!std::isfinite(grad_norm)) {
    r.overflow = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    return r;
  }
  r.grad_norm = grad_norm;
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (grad_norm + 1e-6);
    if (coef < 1.0) r.clip_coef = coef;
  }
  return r;
}

}  // namespace

StepResult ZeroEngine::onebit_step(const OptimStep& s) {
  StepResult r;
  // Warm-up (OneBitLamb's LAMB): gradients all-reduced, identical on every rank, their sum.
  // After: each rank holds its own, so the overflow check and the norm sum over the ranks (the
  // norm reported and clipped to is the root mean square of the ranks' local norms).
  // (Pipeline stages hold disjoint units: their sums add over the stages' group.)
  const bool warm = onebit_->reduces_gradients(adam_steps_ + 1);
  const double local = shard_sum_squares();
  double sumsq = warm ? local : sum_over_ranks(local);
  if (opt_.model_parallel_comm != nullptr) sumsq = sum_over_ranks(sumsq, opt_.model_parallel_comm);
  const double divisor = s.loss_scale * (warm ? opt_.world_size : 1);
  r = norm_and_clip(
      warm ? std::sqrt(sumsq) / divisor : std::sqrt(sumsq / opt_.world_size) / divisor,
      s.max_grad_norm);
  if (r.overflow) return r;
  ++adam_steps_;
  OnebitStep os;
  os.step = adam_steps_;
  os.lr = s.lr;
  os.beta1 = s.beta1;
  os.beta2 = s.beta2;
  os.eps = s.eps;
  os.weight_decay = s.weight_decay;
  os.grad_scale = static_cast<float>(r.clip_coef / divisor);
  // GPU ranks: the states are in host memory (the constructor) and the update runs there on an
  // fp32 host copy of the gradients, as offloaded states' does; the new master is converted into
  // the device's compute weights below.
  float* host_grads =
      be_.device_memory() ? host_stage(partition_.shard_elems_total()) : nullptr;  // (whole)
  std::vector<OnebitUnit> units;
  for (int u = 0; u < layout_.num_units(); ++u) {
    if (guard_) guard_->before_update(u);
    const int64_t n = partition_.unit(u).shard;
    const float* grad = static_cast<const float*>(reducer_->shard(u));
    if (be_.device_memory()) {
      float* host = host_grads + partition_.shard_offset(u);
      be_.cast_from_compute(host, reducer_->shard(u), n);
      grad = host;
    }
    units.push_back({master(u), exp_avg(u), exp_avg_sq(u), grad, n});
  }
  if (warm) {
    onebit_->warmup_step(units, os);
  } else {
    onebit_->compressed_step(units, os);
  }
  if (!fp32_alias()) {
    for (int u = 0; u < layout_.num_units(); ++u)
      be_.cast_to_compute(weight_region(u), master(u), partition_.unit(u).shard);
  }
  publish_weights();
  return r;
}

StepResult ZeroEngine::step(const OptimStep& s) {
  reducer_->finish();
  if (opt_.after_reduce) opt_.after_reduce(*this);
  if (onebit_ && (onebit_->owns_warmup() || !onebit_->reduces_gradients(adam_steps_ + 1)))
    return onebit_step(s);
  StepResult r;
  double sumsq = global_sum_squares();
  const bool distributed = opt_.comm->size() > 1;
  // The other parts of the model (disjoint, replicated tensors counted on one rank only).
  if (opt_.model_parallel_comm != nullptr) sumsq = sum_over_ranks(sumsq, opt_.model_parallel_comm);
  // Reduced gradients are sums over the ranks: the mean divides by the world size.
  const double divisor = s.loss_scale * (distributed ? opt_.world_size : 1);
  r = norm_and_clip(std::sqrt(sumsq) / divisor, s.max_grad_norm);
  if (r.overflow) return r;
  ++adam_steps_;
  OptimizerParams p;
  p.kind = s.kind;
  p.lr = s.lr;
  p.beta1 = s.beta1;
  p.beta2 = s.beta2;
  p.eps = s.eps;
  p.adam_w_mode = s.adam_w_mode;
  p.bias_correction = s.bias_correction;
  p.step = adam_steps_;
  p.momentum = s.momentum;
  p.dampening = s.dampening;
  p.nesterov = s.nesterov;
  p.lr_decay = s.lr_decay;
  p.initial_accumulator_value = s.initial_accumulator_value;
  p.max_coeff = s.max_coeff;
  p.min_coeff = s.min_coeff;
  p.eps_inside_sqrt = s.eps_inside_sqrt;
  p.grad_scale = static_cast<float>(r.clip_coef / divisor);
  if (s.kind == OptimizerKind::kMuon) muon_orthogonalise(s, p.grad_scale);
  if (s.kind == OptimizerKind::kLamb) {
    lamb_step(s, p);
    publish_weights();
    return r;
  }
  visit_states(StatesMode::kUpdate, 0, layout_.num_units(),
               [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                 // Elements [lo, hi) of the shard: [sb + lo, sb + hi) of the unit.
                 const int64_t sb = partition_.unit(u).begin(owner_rank(u));
                 char* grads = static_cast<char*>(reducer_->shard(u));
                 void* weights = fp32_alias() ? nullptr : weight_target(u);
                 if (guard_ && lo == 0) guard_->before_update(u);
                 if (be_.device_memory() && states_on_host(u)) {
                   // Offloaded states of a GPU run: CPU Adam on a host copy of the gradients,
                   // then the new master converted into the device's compute weights.
                   float* g = host_stage(hi - lo);
                   be_.cast_from_compute(g, at(grads, lo, esz_), hi - lo);
                   for (const DecayRange& d : partition_.decay_ranges(u)) {
                     const int64_t a = std::max(d.begin, sb + lo), b = std::min(d.end, sb + hi);
                     if (a >= b) continue;
                     const int64_t off = a - (sb + lo);
                     update_range(u, a, b, d.decay, pm + off, pa + off, pv + off, g + off, nullptr,
                                  s, p, /*host=*/true);
                   }
                   be_.cast_to_compute(at(weights, lo, esz_), pm, hi - lo);
                   weight_written(u, hi);
                   return;
                 }
                 // (A GPU kernel cannot write weights offloaded to the host: converted after.)
                 void* out = params_on_host() ? nullptr : weights;
                 for (const DecayRange& d : partition_.decay_ranges(u)) {
                   const int64_t a = std::max(d.begin, sb + lo), b = std::min(d.end, sb + hi);
                   if (a >= b) continue;
                   const int64_t off = a - (sb + lo);  // into the piece
                   update_range(u, a, b, d.decay, pm + off, pa + off, pv + off,
                                at(grads, a - sb, esz_), out ? at(out, a - sb, esz_) : nullptr, s,
                                p, /*host=*/false);
                 }
                 if (weights && !out) be_.cast_to_compute(at(weights, lo, esz_), pm, hi - lo);
                 weight_written(u, hi);
               });
  publish_weights();
  return r;
}

void ZeroEngine::update_range(int u, int64_t a, int64_t b, bool decay, float* pm, float* pa,
                              float* pv, const void* grad, void* out, const OptimStep& s,
                              OptimizerParams p, bool host) {
  // grad and out at element a, in the compute dtype (fp32 with host: a host copy).
  auto run = [&](int64_t x, int64_t y, const OptimizerParams& q) {
    const int64_t off = x - a;
    if (host) {
      cpu::optimizer_update(pm + off, pa + off, pv + off, static_cast<const float*>(grad) + off,
                            nullptr, y - x, q, DType::kF32);
    } else {
      be_.optimizer_update(pm + off, pa + off, pv + off, at(const_cast<void*>(grad), off, esz_),
                           out ? at(out, off, esz_) : nullptr, y - x, q);
    }
  };
  if (p.kind != OptimizerKind::kMuon) {
    p.weight_decay = decay ? s.weight_decay : 0.0;
    return run(a, b, p);
  }
  // Muon: the pieces of hidden matrices from the orthogonalised values, AdamW in the gaps.
  OptimizerParams adam = p;
  adam.kind = OptimizerKind::kAdam;
  adam.lr = s.adam_lr;
  adam.adam_w_mode = true;
  adam.bias_correction = true;
  adam.weight_decay = decay ? s.adam_weight_decay : 0.0;
  ZD_CHECK(host || !be_.device_memory(), "Muon's update runs on host memory");
  int64_t x = a;
  MuonExchange& mx = muon_for(u);
  for (const MuonPiece& piece : mx.pieces(u)) {
    const int64_t lo = std::max(piece.begin, a), hi = std::min(piece.end, b);
    if (lo >= hi) continue;
    if (x < lo) run(x, lo, adam);
    const MuonMatrix& m = mx.matrices()[static_cast<size_t>(piece.matrix)];
    float* param_out = out ? reinterpret_cast<float*>(at(out, lo - a, esz_)) : nullptr;
    cpu::muon_apply(pm + (lo - a), mx.local() + piece.slot + (lo - piece.begin), param_out, hi - lo,
                    s.lr, s.weight_decay,
                    cpu::muon_adjusted_lr(s.lr, s.adjust_lr, m.global_rows, m.global_cols),
                    be_.compute_dtype());
    x = hi;
  }
  if (x < b) run(x, b, adam);
}

MuonExchange& ZeroEngine::muon_for(int u) {
  return muon_experts_ && partition_.unit(u).experts ? *muon_experts_ : *muon_;
}

void ZeroEngine::muon_orthogonalise(const OptimStep& s, float grad_scale) {
  if (!muon_) {
    Communicator* host = opt_.host_comm;
    if (!expert_groups()) {
      muon_ = std::make_unique<MuonExchange>(layout_, partition_, owner_rank(0), host,
                                             opt_.host_tensor_comm);
    } else {
      // Expert parallelism: the experts units over their expert-data-parallel group, as their
      // gradients and shards are (one rank of it: each rank orthogonalises its own experts).
      muon_ = std::make_unique<MuonExchange>(layout_, partition_, opt_.stage == 0 ? 0 : opt_.rank,
                                             host, opt_.host_tensor_comm, MuonUnits::kDense);
      Communicator* experts = opt_.host_expert_comm;
      ZD_CHECK(opt_.expert_world_size == 1 || experts != nullptr,
               "Muon over an expert-data-parallel group of {} needs its host communicator",
               opt_.expert_world_size);
      muon_experts_ = std::make_unique<MuonExchange>(
          layout_, partition_, opt_.stage == 0 ? 0 : opt_.expert_rank,
          opt_.expert_world_size > 1 ? experts : nullptr, opt_.host_tensor_comm,
          MuonUnits::kExperts, opt_.stage == 0 ? 1 : opt_.expert_world_size);
    }
  }
  int first = muon_->first_unit(), last = muon_->last_unit();
  if (muon_experts_ && muon_experts_->first_unit() <= muon_experts_->last_unit()) {
    first = std::min(first, muon_experts_->first_unit());
    last = std::max(last, muon_experts_->last_unit());
  }
  visit_states_host(
      StatesMode::kUpdate, first, last + 1,
      [&](int u, int64_t lo, int64_t hi, float* /*pm*/, float* pa, float* /*pv*/) {
        MuonExchange& mx = muon_for(u);
        float* local = mx.local();
        const int64_t sb = partition_.unit(u).begin(owner_rank(u));
        const char* grads = static_cast<const char*>(reducer_->shard(u));
        for (const MuonPiece& piece : mx.pieces(u)) {
          const int64_t a = std::max(piece.begin, sb + lo), b = std::min(piece.end, sb + hi);
          if (a >= b) continue;
          const void* grad = grads + (a - sb) * static_cast<int64_t>(esz_);
          const float* g = static_cast<const float*>(grad);  // the CPU's: fp32 arrays
          if (be_.device_memory()) {  // (a GPU's compute-dtype gradients, to the host in fp32)
            float* h = mx.scratch(b - a);
            be_.cast_from_compute(h, grad, b - a);
            g = h;
          }
          cpu::muon_momentum(pa + (a - sb - lo), g, local + piece.slot + (a - piece.begin), b - a,
                             grad_scale, s.momentum, s.nesterov);
        }
      });
  muon_->orthogonalise(s.ns);
  if (muon_experts_) muon_experts_->orthogonalise(s.ns);
}

double ZeroEngine::comm_wait_seconds() const {
  return reducer_->wait_seconds() + gather_wait_seconds_ +
         (gatherer_ ? gatherer_->wait_seconds() : 0);
}

double ZeroEngine::offload_io_seconds() const {
  return (swapper_ ? swapper_->stats().wait_seconds : 0) +
         (param_swapper_ ? param_swapper_->io_seconds() : 0);
}

ModelStateBytes ZeroEngine::measured_bytes() const {
  ModelStateBytes b;
  if (tracker_ == nullptr) return b;
  b.weights = tracker_->current(MemCategory::kWeights);
  b.gradients = tracker_->current(MemCategory::kGradients);
  b.master = tracker_->current(MemCategory::kMaster);
  b.moments = tracker_->current(MemCategory::kMoments);
  b.host = tracker_->current(MemCategory::kOffloaded);
  b.swap_buffers = tracker_->peak(MemCategory::kSwap);
  b.nvme =
      (swapper_ ? swapper_->file_bytes() : 0) + (param_swapper_ ? param_swapper_->file_bytes() : 0);
  b.buckets = tracker_->peak(MemCategory::kBuckets);
  b.gathered = tracker_->peak(MemCategory::kGathered);
  return b;
}

ModelStateBytes zero_formula_bytes(double psi, int world, int stage, int compute_bytes) {
  const double n = world, e = compute_bytes;
  ModelStateBytes b;
  b.weights = static_cast<int64_t>(e * (stage >= 3 ? psi / n : psi));
  b.gradients = static_cast<int64_t>(e * (stage >= 2 ? psi / n : psi));
  const double opt_psi = stage >= 1 ? psi / n : psi;
  b.master = compute_bytes == 4 ? 0 : static_cast<int64_t>(4 * opt_psi);
  b.moments = static_cast<int64_t>(8 * opt_psi);
  return b;
}

ModelStateBytes ZeroEngine::formula_bytes() const {
  // Psi: the parameters as laid out (units with their aligned tensors, vocabulary padded),
  // before padding units to a multiple of the world size.
  // With expert groups, the experts units' Psi over their group.
  double psi = 0, psi_experts = 0;
  for (int u = 0; u < layout_.num_units(); ++u)
    (partition_.unit(u).experts ? psi_experts : psi) += static_cast<double>(layout_.unit(u).numel);
  auto formula = [&](int bytes) {
    ModelStateBytes f = zero_formula_bytes(psi, opt_.world_size, opt_.stage, bytes);
    if (psi_experts > 0) {
      const ModelStateBytes x =
          zero_formula_bytes(psi_experts, opt_.expert_world_size, opt_.stage, bytes);
      f.weights += x.weights;
      f.gradients += x.gradients;
      f.master += x.master;
      f.moments += x.moments;
    }
    return f;
  };
  // (bf16/fp16 emulated in fp32 arrays store 4-byte weights but keep a separate master.)
  ModelStateBytes b = formula(static_cast<int>(esz_));
  if (!fp32_alias() && esz_ == 4) b.master = formula(2).master;
  const int64_t offloaded_states = b.master + b.moments;
  if (opt_.optimizer_states == StatesHome::kHost) {  // the leading split_ elements on the host
    const double total = static_cast<double>(partition_.shard_elems_total());
    const double host_frac = total > 0 ? static_cast<double>(split_) / total : 1.0;
    b.host = static_cast<int64_t>(static_cast<double>(offloaded_states) * host_frac);
    b.master = static_cast<int64_t>(static_cast<double>(b.master) * (1 - host_frac));
    b.moments = static_cast<int64_t>(static_cast<double>(b.moments) * (1 - host_frac));
  } else if (opt_.optimizer_states == StatesHome::kNvme) {
    b.nvme = offloaded_states;
    b.swap_buffers = swapper_->buffer_bytes();
    b.master = b.moments = 0;
  }
  if (opt_.param_states != StatesHome::kDevice) {  // stage 3 weight shards
    const double total = static_cast<double>(partition_.shard_elems_total());
    const double resident = param_swapper_ ? static_cast<double>(resident_shard_elems()) : total;
    const double frac = total > 0 ? resident / total : 1.0;
    b.host += static_cast<int64_t>(static_cast<double>(b.weights) * frac);
    if (param_swapper_) {
      b.nvme += static_cast<int64_t>(static_cast<double>(b.weights) * (1 - frac));
      b.swap_buffers += param_swapper_->buffer_bytes();
    }
    b.weights = 0;
  }
  return b;
}

std::string ZeroEngine::memory_report() const {
  if (offloaded() || opt_.param_states != StatesHome::kDevice) {
    auto home = [](StatesHome h) {
      return h == StatesHome::kHost ? "cpu" : h == StatesHome::kNvme ? "nvme" : "device";
    };
    const ModelStateBytes m = measured_bytes(), f = formula_bytes();
    std::string where = fmt::format("optimizer states on {}", home(opt_.optimizer_states));
    if (opt_.optimizer_states == StatesHome::kHost && opt_.offload_ratio < 1)
      where += fmt::format(" (ratio {})", opt_.offload_ratio);
    if (opt_.param_states != StatesHome::kDevice)
      where += fmt::format(", parameters on {}", home(opt_.param_states));
    std::string report = fmt::format(
        "model states (ZeRO-{}, N={}, {}): compute pool: weights {:.2f} + gradients {:.2f} + "
        "master {:.2f} + moments {:.2f} = {:.2f} MiB (formula {:.2f}); host: {:.2f} MiB "
        "(formula {:.2f})",
        opt_.stage, opt_.world_size, where, mib(m.weights), mib(m.gradients), mib(m.master),
        mib(m.moments), mib(m.states()), mib(f.states()), mib(m.host), mib(f.host));
    if (m.nvme > 0 || f.nvme > 0) {
      report += fmt::format(
          "; NVMe: {:.2f} MiB on disk (formula {:.2f}) through {:.2f} MiB of "
          "swap buffers",
          mib(m.nvme), mib(f.nvme), mib(f.swap_buffers));
      if (swapper_)
        report += fmt::format(" (optimizer: {} of {:.2f} MiB, sub-groups of {} elements)",
                              std::min(opt_.swap.buffer_count, swapper_->num_groups()),
                              mib(3 * 4 * swapper_->group_elems()), swapper_->group_elems());
    }
    return report;
  }
  const ModelStateBytes m = measured_bytes(), f = formula_bytes();
  const int st = opt_.stage;
  const int e = static_cast<int>(esz_), k = fp32_alias() ? 8 : 12;
  const std::string per_n = "/N";
  std::string formula = fmt::format("{}Psi{} + {}Psi{} + {}Psi{}", e, st >= 3 ? per_n : "", e,
                                    st >= 2 ? per_n : "", k, st >= 1 ? per_n : "");
  return fmt::format(
      "model states (ZeRO-{}, N={}): weights {:.2f} + gradients {:.2f} + master {:.2f} + moments "
      "{:.2f} = {:.2f} MiB; formula {} = {:.2f} MiB ({:+.1f}%); buckets {:.2f} MiB, gathered "
      "{:.2f} "
      "MiB",
      st, opt_.world_size, mib(m.weights), mib(m.gradients), mib(m.master), mib(m.moments),
      mib(m.states()), formula, mib(f.states()),
      f.states() > 0
          ? 100.0 * (static_cast<double>(m.states()) / static_cast<double>(f.states()) - 1)
          : 0.0,
      mib(m.buckets), mib(m.gathered));
}

}  // namespace zerod
