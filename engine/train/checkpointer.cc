#include "engine/train/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "comm/mesh.h"
#include "comm/strings.h"
#include "core/error.h"
#include "core/fault_points.h"
#include "core/file_write.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/dir_lock.h"
#include "engine/checkpoint/unit_reader.h"
#include "engine/config/input_limits.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "model/shard.h"

namespace zerod {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The 1-bit optimizer's rank-independent state in a checkpoint (OneBitLamb's).
constexpr const char* kOnebitSharedFile = "onebit_state.bin";

// The 1-bit optimizer's rank-independent state is per pipeline stage (each holds its own units):
// onebit_state.bin without pipelines, onebit_state_stage{s}_of_{P}.bin with P stages, written
// by the stage's first data-parallel rank. (The 1-bit optimizers run without tensor and context
// parallelism, so a stage's ranks are its data-parallel group.)
struct OnebitSharedFile {
  std::string name;
  bool writer = false;
};
OnebitSharedFile onebit_shared_file(const JobConfig& cfg, int rank) {
  const ParallelismConfig& par = cfg.parallelism;
  if (par.pipeline <= 1) return {kOnebitSharedFile, rank == 0};
  const Mesh mesh(MeshShape{.pipeline = par.pipeline,
                            .data = cfg.data_parallel_size,
                            .context = par.context,
                            .tensor = par.tensor});
  const MeshCoord c = mesh.coord(rank);
  return {fmt::format("onebit_state_stage{}_of_{}.bin", c.pipeline, par.pipeline),
          c.data == 0 && c.context == 0 && c.tensor == 0};
}

std::string read_whole_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// How a rank's failed write travels to the others in the gathered file list: '!' + a kind +
// the message. Kinds: 'E' an environment error (InputError: a full disk, quota, an unwritable
// directory), 'S' the machine failing (EIO), '!' anything else (a bug).
char failure_kind(const Error& e) {
  if (dynamic_cast<const InputError*>(&e) != nullptr) return 'E';
  return e.kind() == ErrorKind::kSystem ? 'S' : '!';
}

std::string failure_record(const Error& e) {
  return std::string("!") + failure_kind(e) + e.what();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The batch triangle: global = micro-batch x accumulation x data-parallel size.
struct BatchTriangle {
  int64_t global = 0, micro = 0, accum = 0, dp = 0;
  std::string text() const {
    return fmt::format("{} sequences/step = micro-batch {} x accumulation {} x data-parallel {}",
                       global, micro, accum, dp);
  }
};

std::optional<int64_t> json_int(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
  return j[key].get<int64_t>();
}

// The triangle a checkpoint was trained with, from the manifest's copy of the resolved job
// (none when it has no train_batch_size: an older or foreign job section).
std::optional<BatchTriangle> saved_batch(const Manifest& m) {
  const std::optional<int64_t> global = json_int(m.job, "train_batch_size");
  if (!global) return std::nullopt;
  BatchTriangle t;
  t.global = *global;
  t.micro = json_int(m.job, "train_micro_batch_size_per_gpu").value_or(0);
  t.accum = json_int(m.job, "gradient_accumulation_steps").value_or(0);
  t.dp = m.job.contains("resolved")
             ? json_int(m.job["resolved"], "data_parallel_size").value_or(m.world_size)
             : m.world_size;
  return t;
}

// Resuming with another global batch changes the run (the optimizer's steps see another number
// of samples; the LR schedule, in steps, no longer matches the data seen): refused, saying how to
// keep the checkpoint's batch, unless train.allow_batch_change.
void check_batch_change(const std::string& path, const BatchTriangle& saved,
                        const BatchTriangle& ours, bool allowed) {
  if (saved.global == ours.global || allowed) return;
  const int64_t per_step = ours.micro * ours.dp;
  std::string keep;
  if (saved.global % ours.dp != 0) {
    keep =
        fmt::format("{} is not divisible by the data-parallel size {}, so no micro-batch keeps it",
                    saved.global, ours.dp);
  } else if (saved.global % per_step != 0) {
    keep = fmt::format(
        "train_batch_size {} is not divisible by train_micro_batch_size_per_gpu {} x data-parallel "
        "size {} = {}: set train_batch_size {} with a train_micro_batch_size_per_gpu that divides "
        "{}",
        saved.global, ours.micro, ours.dp, per_step, saved.global, saved.global / ours.dp);
  } else {
    keep = fmt::format(
        "set train_batch_size {} (gradient_accumulation_steps then follows: {} / "
        "(train_micro_batch_size_per_gpu {} x data-parallel size {}) = {})",
        saved.global, saved.global, ours.micro, ours.dp, saved.global / per_step);
  }
  ZD_THROW_INPUT(
      "train_batch_size: {} was trained with a global batch of {}; this job's is {}. To keep the "
      "checkpoint's global batch: {}. To train on with {} sequences per step: train.allow_batch_"
      "change: true",
      path, saved.text(), ours.text(), keep, ours.global);
}

json file_to_json(const CheckpointFile& f) {
  json slices = json::array();
  for (const auto& s : f.slices) slices.push_back({s.unit, s.begin, s.end});
  return {{"name", f.name},   {"rank", f.rank},     {"tensor_rank", f.tensor_rank},
          {"bytes", f.bytes}, {"crc32c", f.crc32c}, {"slices", slices}};
}

CheckpointFile file_from_json(const json& j) {
  CheckpointFile f;
  f.name = j.at("name").get<std::string>();
  f.rank = j.at("rank").get<int>();
  f.tensor_rank = j.at("tensor_rank").get<int>();
  f.bytes = j.at("bytes").get<int64_t>();
  f.crc32c = j.at("crc32c").get<uint32_t>();
  for (const auto& s : j.at("slices"))
    f.slices.push_back({s[0].get<int>(), s[1].get<int64_t>(), s[2].get<int64_t>()});
  return f;
}

}  // namespace

// A save in progress: the manifest to write and (async) its writer thread.
struct Checkpointer::Pending {
  Manifest manifest;
  std::future<CheckpointFile> written;
  Buffer copy;  // GPU states: the host copy the background writer writes from
};

Checkpointer::Checkpointer(const JobConfig& cfg, const RankContext& ctx, ZeroEngine& engine,
                           MemoryTracker* tracker, const JobTokenizer* tokenizer)
    : cfg_(cfg), ctx_(ctx), engine_(engine), tracker_(tracker), tokenizer_(tokenizer) {
  // One job per checkpoint directory: rank 0 holds its lock for the job's life, and every rank
  // learns whether it got it.
  std::string err;
  if (ctx_.rank == 0) {
    try {
      lock_ = std::make_unique<CheckpointDirLock>(
          dir(), "train.checkpoint_dir", cfg_.source.empty() ? "(no job file)" : cfg_.source);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  if (ctx_.world_size > 1) err = broadcast_string(*ctx_.comm, err, 0);
  if (!err.empty()) throw InputError(err);
  if (cfg_.checkpoint.async && !engine_.states_resident()) {
    if (ctx_.rank == 0)
      spdlog::info("checkpoint.async: the optimizer states are on NVMe, so saves are synchronous");
  } else if (cfg_.checkpoint.async && engine_.states_addressable()) {
    snapshot_ = std::make_unique<StateSnapshot>(engine_.layout().num_units(), tracker_);
    engine_.set_update_guard(snapshot_.get());
  }
}

Checkpointer::~Checkpointer() {
  // A background write still running references our snapshot: let it end (errors are moot).
  if (pending_ && pending_->written.valid()) pending_->written.wait();
  if (snapshot_) engine_.set_update_guard(nullptr);
}

std::vector<std::string> Checkpointer::gather(const std::string& mine) {
  if (ctx_.world_size == 1) return {mine};
  return all_gather_strings(*ctx_.comm, mine);
}

void Checkpointer::barrier() {
  if (ctx_.world_size > 1) ctx_.comm->barrier();
}

bool Checkpointer::all_true(bool mine) {
  if (ctx_.world_size == 1) return mine;
  int32_t v = mine ? 0 : 1;
  ctx_.comm->all_reduce(&v, 1, CommType::kI32, ReduceOp::kMax);
  return v == 0;
}

namespace {
// Shard d's master, exp_avg and exp_avg_sq (d.end - d.begin floats each, back to back) read
// into `out` (host memory) wherever the engine keeps them; d's pointers then point there.
void copy_states(ZeroEngine& engine, ShardData& d, float* out) {
  const int64_t n = d.end - d.begin;
  engine.visit_states_host(ZeroEngine::StatesMode::kRead, d.unit, d.unit + 1,
                           [&](int, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                             const int64_t k = std::min(hi, n) - lo;  // (past n: padding)
                             if (k <= 0) return;
                             std::copy(pm, pm + k, out + lo);
                             std::copy(pa, pa + k, out + n + lo);
                             std::copy(pv, pv + k, out + 2 * n + lo);
                           });
  d.master = out;
  d.exp_avg = out + n;
  d.exp_avg_sq = out + 2 * n;
}
}  // namespace

// The shards of a save, read from NVMe or GPU memory one unit at a time into one host buffer
// (kCheckpoint) sized for the largest unit shard.
class Checkpointer::StagedStates : public ShardSource {
 public:
  StagedStates(ZeroEngine& engine, const std::vector<ShardData>& shards, MemoryTracker* tracker)
      : engine_(engine), shards_(shards) {
    int64_t most = 0;
    for (const ShardData& d : shards) most = std::max(most, d.end - d.begin);
    buf_ = host_alloc(static_cast<size_t>(3 * most) * sizeof(float), MemCategory::kCheckpoint,
                      tracker);
  }
  ShardData acquire(size_t i) override {
    ShardData d = shards_.at(i);
    copy_states(engine_, d, buf_.as<float>());
    return d;
  }
  void release(size_t) override {}

 private:
  ZeroEngine& engine_;
  const std::vector<ShardData>& shards_;
  Buffer buf_;
};

std::vector<ShardData> Checkpointer::my_shards() {
  std::vector<ShardData> out;
  // Stage 0: every rank of the data-parallel group holds all of it; its rank 0 alone writes
  // (one writer per tensor rank), and with expert groups each expert-data-parallel group's
  // rank 0 writes its experts.
  const ZeroOptions& zo = engine_.options();
  // A pipeline stage saves its own units under their whole-model indices; the last stage's copy
  // of a tied embedding is the first stage's (the same states), which saves it. An experts unit
  // holding this rank's experts is saved where they lie in the unit of every expert (the files
  // are laid out as at parallelism.expert 1, so any E loads them).
  const Partition& part = engine_.partition();
  const ParamLayout& layout = engine_.layout();
  for (int u = 0; u < part.num_units(); ++u) {
    const UnitPartition& up = part.unit(u);
    const bool own_experts = up.experts;  // (on their own group: this rank's experts)
    if (zo.stage == 0 && (own_experts ? zo.expert_rank : zo.rank) != 0) continue;
    const int owner = engine_.owner_rank(u);
    const int64_t valid = up.valid(owner);
    if (valid <= 0 || u == layout.tied_copy_unit()) continue;
    ShardData s;
    s.unit = u;
    s.file_unit = layout.global_unit(u);
    s.unit_name = layout.unit(u).name;
    s.begin = up.begin(owner) + (own_experts ? layout.experts_offset() : 0);
    s.end = s.begin + valid;
    if (engine_.states_addressable()) {
      s.master = engine_.master(u);
      s.exp_avg = engine_.exp_avg(u);
      s.exp_avg_sq = engine_.exp_avg_sq(u);
    }
    out.push_back(s);
  }
  return out;
}

SaveReport Checkpointer::save(const std::string& tag, const TrainingProgress& progress,
                              bool automatic) {
  Stopwatch blocked;
  finish();  // the previous background save first
  validate_tag(tag);
  const std::string& root = dir();
  ZD_CHECK(!root.empty(), "save without train.checkpoint_dir");

  // Rank 0 prepares TAG.tmp; everyone learns whether that worked.
  std::string err;
  std::optional<CheckpointTokenizer> saved_tokenizer;
  if (ctx_.rank == 0) {
    try {
      const std::string tmp_dir = prepare_save(root, tag);
      if (tokenizer_ != nullptr)
        saved_tokenizer =
            write_job_tokenizer(*tokenizer_, fs::path(tmp_dir) / "tokenizer", "tokenizer/");
    } catch (const Error& e) {
      err = e.what();
    }
  }
  if (ctx_.world_size > 1) err = broadcast_string(*ctx_.comm, err, 0);
  if (!err.empty()) ZD_THROW_INPUT("checkpoint {}: {}", tag, err);

  auto p = std::make_unique<Pending>();
  Manifest& m = p->manifest;
  m = make_manifest(tag, automatic, progress);
  m.tokenizer = std::move(saved_tokenizer);
  const std::string tmp = (fs::path(root) / (tag + ".tmp")).string();
  std::vector<ShardData> shards = my_shards();
  write_rank_extras(tmp, progress);

  SaveReport report;
  report.tag = tag;
  for (const auto& s : shards) report.bytes += 12 * (s.end - s.begin);
  const int rank = ctx_.rank;
  if (cfg_.checkpoint.async && engine_.states_resident() && !engine_.states_addressable()) {
    // Async with states in GPU memory: one host copy of this rank's shards now (the time the
    // step is blocked: a device-to-host copy), written in the background.
    int64_t floats = 0;
    for (const ShardData& s : shards) floats += 3 * (s.end - s.begin);
    p->copy =
        host_alloc(static_cast<size_t>(floats) * sizeof(float), MemCategory::kCheckpoint, tracker_);
    float* out = p->copy.as<float>();
    for (ShardData& s : shards) {
      copy_states(engine_, s, out);
      out += 3 * (s.end - s.begin);
    }
    p->written = std::async(std::launch::async, [tmp, rank, shards]() {
      return write_rank_file(tmp, rank, shards, nullptr);
    });
    pending_ = std::move(p);
    report.blocked_seconds = blocked.seconds();
    return report;
  }
  if (!cfg_.checkpoint.async || !engine_.states_addressable()) {
    // (NVMe states are saved synchronously: the next step would rewrite the swap file under the
    // writer.)
    std::unique_ptr<StagedStates> staged;
    if (!engine_.states_addressable())
      staged = std::make_unique<StagedStates>(engine_, shards, tracker_);
    CheckpointFile f;
    std::string werr;
    try {
      f = write_rank_file(tmp, ctx_.rank, shards, staged.get());
    } catch (const Error& e) {
      werr = failure_record(e);
    }
    (void)fault_point("save.rank_file");  // tests: a crash between the files and the commit
    f.tensor_rank = engine_.layout().shard().rank;
    std::vector<std::string> files = gather(werr.empty() ? file_to_json(f).dump() : werr);
    commit(*p, files);
    report.committed = true;
    report.blocked_seconds = blocked.seconds();
    return report;
  }
  // Async: write the live states on a background thread; the optimizer copies what it must
  // update before the writer got there.
  StateSnapshot* snap = snapshot_.get();
  snap->begin(shards);
  p->written = std::async(std::launch::async, [tmp, rank, shards, snap]() {
    try {
      return write_rank_file(tmp, rank, shards, snap);
    } catch (...) {
      snap->abandon();  // the optimizer must not wait for a write that will not come
      throw;
    }
  });
  pending_ = std::move(p);
  report.blocked_seconds = blocked.seconds();
  return report;
}

Manifest Checkpointer::make_manifest(const std::string& tag, bool automatic,
                                     const TrainingProgress& progress) const {
  Manifest m;
  const ModelSpec& spec = engine_.layout().spec();
  m.tag = tag;
  m.automatic = automatic;
  m.created = utc_now();
  m.zerod_version = "0.1.0";
  m.job = job_to_json(cfg_);
  m.world_size = ctx_.world_size;
  m.zero_stage = engine_.options().stage;
  m.tensor_parallel = engine_.layout().shard().size;
  m.compute_dtype = std::string(dtype_name(cfg_.compute_dtype()));
  m.n_layer = spec.n_layer;
  m.n_head = spec.n_head;
  m.n_embd = spec.n_embd;
  m.vocab_size = spec.vocab_size;
  m.padded_vocab_size = spec.vp();
  m.seq_len = spec.seq_len;
  // The whole model's units (a pipeline stage's engine holds some of them).
  const ParamLayout whole(spec, engine_.layout().align_elems(),
                          engine_.layout().shard().all_experts());
  for (int u = 0; u < whole.num_units(); ++u)
    m.units.push_back({whole.unit(u).name, whole.unit(u).numel});
  m.progress = progress;
  return m;
}

// The optimizer's per-rank files beside the rank file (1-bit errors, PowerSGD residuals).
void Checkpointer::write_rank_extras(const std::string& dir, const TrainingProgress& progress) {
  if (OnebitOptimizer* ob = engine_.onebit()) {
    // The 1-bit optimizer's worker and server errors differ per rank: one file each (with
    // ZeroOneAdam between synchronisations, also the rank's own weights and momentum).
    if (ob->keeps_rank_states()) {
      engine_.visit_states_host(ZeroEngine::StatesMode::kRead, 0, engine_.layout().num_units(),
                                [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float*) {
                                  ob->capture_rank_states(u, lo, hi, pm, pa);
                                });
    }
    write_file_atomically((fs::path(dir) / onebit_file(ctx_.rank)).string(),
                          ob->serialize(progress.adam_steps));
    // Its rank-independent state (OneBitLamb's coefficients, fresh variance): one file.
    const OnebitSharedFile shared = onebit_shared_file(cfg_, ctx_.rank);
    if (ob->has_shared_state() && shared.writer)
      write_file_atomically((fs::path(dir) / shared.name).string(), ob->serialize_shared());
  }

  if (const PowerSgd* ps = engine_.powersgd())  // each rank's residuals differ: one file each
    write_file_atomically((fs::path(dir) / powersgd_file(ctx_.rank)).string(), ps->serialize());
}

Manifest Checkpointer::save_files(const std::string& dir, const std::string& tag,
                                  const TrainingProgress& progress) {
  finish();  // a background save first: the states are the step's
  Manifest m = make_manifest(tag, true, progress);
  std::vector<ShardData> shards = my_shards();
  write_rank_extras(dir, progress);
  std::unique_ptr<StagedStates> staged;
  if (!engine_.states_addressable())
    staged = std::make_unique<StagedStates>(engine_, shards, tracker_);
  std::string werr;
  CheckpointFile f;
  try {
    f = write_rank_file(dir, ctx_.rank, shards, staged.get());
  } catch (const Error& e) {
    werr = failure_record(e);
  }
  f.tensor_rank = engine_.layout().shard().rank;
  const std::vector<std::string> files = gather(werr.empty() ? file_to_json(f).dump() : werr);
  for (size_t r = 0; r < files.size(); ++r) {
    if (!files[r].empty() && files[r][0] == '!')
      ZD_THROW("snapshot {}: rank {} could not write its files: {}", tag, r, files[r].substr(2));
    CheckpointFile rf = file_from_json(json::parse(files[r]));
    if (!rf.name.empty()) m.files.push_back(std::move(rf));
  }
  return m;
}

void Checkpointer::commit(Pending& p, const std::vector<std::string>& files_json) {
  std::string failures;
  // The worst kind any rank reported: a bug ('!') over the machine ('S') over the environment.
  char kind = 'E';
  const auto worse = [&kind](char k) {
    if (k == '!' || (k == 'S' && kind == 'E')) kind = k;
  };
  for (size_t r = 0; r < files_json.size(); ++r) {
    if (!files_json[r].empty() && files_json[r][0] == '!') {
      worse(files_json[r].size() < 2 ? '!' : files_json[r][1]);
      failures +=
          fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", r, files_json[r].substr(2));
      continue;
    }
    CheckpointFile f = file_from_json(json::parse(files_json[r]));
    if (!f.name.empty()) p.manifest.files.push_back(std::move(f));
  }
  std::string err = failures.empty() ? "" : "writing the rank files failed: " + failures;
  if (err.empty() && ctx_.rank == 0) {
    try {
      commit_save(dir(), p.manifest);
      const auto removed = apply_retention(dir(), cfg_.train.keep_last);
      for (const auto& tag : removed) spdlog::info("checkpoint retention: removed {}", tag);
    } catch (const Error& e) {
      err = e.what();
      kind = failure_kind(e);
    }
  }
  if (ctx_.world_size > 1) {
    std::string both = broadcast_string(*ctx_.comm, err.empty() ? "" : kind + err, 0);
    kind = both.empty() ? kind : both[0];
    err = both.empty() ? "" : both.substr(1);
  }
  if (err.empty()) return;
  // Nothing half-written stays behind (rank 0, once every rank is done with TAG.tmp), and the
  // previous checkpoint is untouched: `latest` still names it.
  std::string previous = "no earlier checkpoint exists";
  if (ctx_.rank == 0) {
    std::error_code ec;
    fs::remove_all(fs::path(dir()) / (p.manifest.tag + ".tmp"), ec);
  }
  if (const auto latest = read_latest(dir()))
    previous = fmt::format("the previous checkpoint {} is intact", *latest);
  if (kind == 'E') {
    ZD_THROW_INPUT("checkpoint {} was not saved: {}; {}", p.manifest.tag, err, previous);
  }
  if (kind == 'S') {
    ZD_THROW_KIND(ErrorKind::kSystem, "checkpoint {} was not saved: {}; {}", p.manifest.tag, err,
                  previous);
  }
  ZD_THROW("checkpoint {} was not saved: {}; {}", p.manifest.tag, err, previous);
}

std::string Checkpointer::onebit_file(int rank) {
  return fmt::format("onebit_rank{}.bin", rank);
}

namespace {

// Reads a rank's state file into `use` (bytes, the file's name for errors): "" when it did,
// else why not (no file; `use`'s InputError: another world size or model).
std::string load_rank_file(const fs::path& file,
                           const std::function<void(const std::string&, const std::string&)>& use) {
  if (!fs::exists(file)) return "no " + file.filename().string();
  try {
    use(read_whole_file(file), file.string());
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

}  // namespace

// The 1-bit optimizer's errors of this rank. A checkpoint of another world size (or one saved
// before the errors existed) has none for it: they restart from zero, as DeepSpeed always does.
void Checkpointer::load_onebit(OnebitOptimizer& ob, const std::string& path) {
  if (ob.has_shared_state()) {
    // Without it the run cannot go on as it was (OneBitLamb's frozen coefficients): refused.
    const std::string name = onebit_shared_file(cfg_, ctx_.rank).name;
    const fs::path shared = fs::path(path) / name;
    if (!fs::exists(shared))
      ZD_THROW_INPUT(
          "{}: no {} (the 1-bit optimizer's state{}); it cannot be resumed", path, name,
          cfg_.parallelism.pipeline > 1 ? " of this pipeline stage: saved with other stages?" : "");
    ob.deserialize_shared(read_whole_file(shared), shared.string());
  }
  const std::string why =
      load_rank_file(fs::path(path) / onebit_file(ctx_.rank),
                     [&](const std::string& bytes, const std::string& what) {
                       ob.deserialize(bytes, what);
                       if (ob.has_rank_states()) {
                         engine_.visit_states_host(
                             ZeroEngine::StatesMode::kUpdate, 0, engine_.layout().num_units(),
                             [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float*) {
                               ob.restore_rank_states(u, lo, hi, pm, pa);
                             });
                       }
                     });
  if (why.empty()) return;
  spdlog::warn("rank {}: the 1-bit optimizer's compression errors restart from zero ({})",
               ctx_.rank, why);
}

std::string Checkpointer::powersgd_file(int rank) {
  return fmt::format("powersgd_rank{}.bin", rank);
}

void Checkpointer::load_powersgd(PowerSgd& ps, const std::string& path, int64_t steps) {
  const std::string why = load_rank_file(
      fs::path(path) / powersgd_file(ctx_.rank),
      [&](const std::string& bytes, const std::string& what) { ps.deserialize(bytes, what); });
  if (why.empty()) return;
  spdlog::warn("rank {}: PowerSGD's residuals restart from zero and its Q afresh ({})", ctx_.rank,
               why);
  ps.restart_at(steps);
}

std::optional<std::string> Checkpointer::poll() {
  if (!pending_) return std::nullopt;  // every rank agrees: saves are collective
  const bool mine =
      pending_->written.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (!all_true(mine)) return std::nullopt;
  return finish();
}

std::optional<std::string> Checkpointer::finish() {
  if (!pending_) return std::nullopt;
  std::unique_ptr<Pending> p = std::move(pending_);
  std::string mine;
  try {
    CheckpointFile f = p->written.get();
    f.tensor_rank = engine_.layout().shard().rank;
    mine = file_to_json(f).dump();
  } catch (const Error& e) {
    mine = failure_record(e);
  }
  commit(*p, gather(mine));
  return p->manifest.tag;
}

std::optional<TrainingProgress> Checkpointer::load(const std::string& which) {
  // Rank 0 chooses (manifest and file sizes checked); every rank then reads what it needs and
  // checks those files' checksums as it reads. A checkpoint found corrupt that way is passed
  // over for the next complete one when loading "latest"/"auto"; a named tag fails. A failure
  // is everyone's (the same message, exit code 2).
  std::vector<std::string> corrupt;
  for (;;) {
    std::string chosen, err;
    if (ctx_.rank == 0) {
      try {
        const bool nothing_yet =
            which == "auto" && (!fs::is_directory(dir()) || list_checkpoints(dir()).empty());
        if (nothing_yet) {
          spdlog::info("--resume auto: no checkpoint in '{}' yet, starting from step 0", dir());
        } else {
          // (The directory this job's lock just created held nothing to resume from.)
          if (lock_ && lock_->created()) {
            ZD_THROW_INPUT("checkpoint '{}': checkpoint directory '{}' does not exist", which,
                           dir());
          }
          FindOptions fo;
          fo.checksums = false;
          fo.exclude = corrupt;
          FoundCheckpoint f = find_checkpoint(dir(), which == "auto" ? "latest" : which, fo);
          for (const auto& s : f.skipped)
            spdlog::warn("checkpoint skipped (torn or corrupt): {}", s);
          if (!f.skipped.empty()) {
            spdlog::warn("falling back to the newest complete checkpoint: {}", f.tag);
          }
          chosen = f.tag;
        }
      } catch (const Error& e) {
        err = fmt::format("--resume {}: {}", config::clip_input(which), e.what());
      }
    }
    if (ctx_.world_size > 1) {
      err = broadcast_string(*ctx_.comm, err, 0);
      chosen = broadcast_string(*ctx_.comm, chosen, 0);
    }
    if (!err.empty()) ZD_THROW_INPUT("{}", err);
    if (chosen.empty()) return std::nullopt;
    std::string why;
    std::optional<TrainingProgress> p = load_tag(chosen, &why);
    if (p) return p;
    if (which != "latest" && which != "auto") {
      ZD_THROW_INPUT("--resume {}: {}", config::clip_input(which), why);
    }
    if (ctx_.rank == 0) spdlog::warn("checkpoint {} is corrupt: {}", chosen, why);
    corrupt.push_back(chosen);
  }
}

std::optional<TrainingProgress> Checkpointer::load_tag(const std::string& chosen,
                                                       std::string* why) {
  const std::string path = (fs::path(dir()) / chosen).string();
  const Manifest m = read_manifest(path);

  // The model must be the same shape; the world size, ZeRO stage and dtype may differ.
  const ParamLayout& layout = engine_.layout();
  const ModelSpec& spec = layout.spec();
  std::string saved, ours;
  auto compare_text = [&](const std::string& what, const std::string& have,
                          const std::string& want) {
    if (have == want) return;
    saved += fmt::format("{}{} {}", saved.empty() ? "" : ", ", what, have);
    ours += fmt::format("{}{} {}", ours.empty() ? "" : ", ", what, want);
  };
  auto compare = [&](const std::string& what, int64_t have, int64_t want) {
    compare_text(what, std::to_string(have), std::to_string(want));
  };
  auto compare_bool = [&](const std::string& what, bool have, bool want) {
    compare_text(what, have ? "true" : "false", want ? "true" : "false");
  };
  // The saved model as the manifest's copy of the job describes it (every manifest has it).
  std::optional<ModelSpec> saved_spec;
  if (m.job.is_object() && m.job.contains("model")) {
    try {
      saved_spec = model_spec(parse_model_config(m.job["model"], path + "/manifest.json"));
    } catch (const InputError&) {
      // An older or foreign job section: the shape fields and units below still decide.
    }
  }
  const bool llama = spec.llama_family();
  if (saved_spec) {
    compare_text("type", model_arch_name(saved_spec->arch), model_arch_name(spec.arch));
  }
  compare(llama ? "num_hidden_layers" : "n_layer", m.n_layer, spec.n_layer);
  compare(llama ? "num_attention_heads" : "n_head", m.n_head, spec.n_head);
  compare(llama ? "hidden_size" : "n_embd", m.n_embd, spec.n_embd);
  compare("vocab_size", m.vocab_size, spec.vocab_size);
  // (The padding differs only between tensor-parallel sizes that 128 does not absorb, e.g. 3.)
  compare("padded vocabulary", m.padded_vocab_size, spec.vp());
  // GPT-2 learns one position embedding per position; the Llama family's rotary positions are
  // not weights, so it may resume at another sequence length.
  if (!llama) compare("seq_len", m.seq_len, spec.seq_len);
  if (llama && saved_spec && saved_spec->llama_family()) {
    const ModelSpec& o = *saved_spec;
    compare("num_key_value_heads", o.kv_heads(), spec.kv_heads());
    compare("head_dim", o.head_size(), spec.head_size());
    compare("intermediate_size", o.ffn(), spec.ffn());
    compare_bool("tie_word_embeddings", o.tied(), spec.tied());
    compare_bool("q/k/v biases", o.qkv_bias, spec.qkv_bias);
    compare_bool("o_proj bias", o.o_bias, spec.o_bias);
    compare_bool("mlp_bias", o.mlp_bias, spec.mlp_bias);
  }
  // The saved tensor-parallel size must split this model; its units are one tensor rank's parts.
  const int saved_tp = m.tensor_parallel, my_tp = layout.shard().size;
  if (saved.empty() && !tensor_parallel_problem(spec, saved_tp).empty()) {
    ZD_THROW_INPUT("{}: saved at tensor parallel size {}: {}", path, saved_tp,
                   tensor_parallel_problem(spec, saved_tp));
  }
  if (saved.empty()) {
    const ParamLayout saved_layout(spec, layout.align_elems(), TensorShard{0, saved_tp});
    compare("units", static_cast<int64_t>(m.units.size()), saved_layout.num_units());
    for (int u = 0; saved.empty() && u < saved_layout.num_units(); ++u) {
      compare("elements in unit " + saved_layout.unit(u).name,
              m.units[static_cast<size_t>(u)].numel, saved_layout.unit(u).numel);
    }
  }
  if (!saved.empty()) {
    ZD_THROW_INPUT("{}: saved for a model with {}; this job's model has {}", path, saved, ours);
  }
  // The optimizer: its states fill the same three slots whatever the type, but mean other things
  // (Adam's moments, SGD's momentum buffer, Adagrad's sum, Lion's average). Adam and AdamW share
  // them; another type is refused. (Manifests before SGD/Adagrad/Lion existed were Adam's.)
  {
    std::string saved_type = "AdamW";
    if (m.job.is_object() && m.job.contains("optimizer") && m.job["optimizer"].is_object() &&
        m.job["optimizer"].contains("type") && m.job["optimizer"]["type"].is_string()) {
      saved_type = m.job["optimizer"]["type"].get<std::string>();
    }
    const std::string& our_type = cfg_.optimizer.type;
    auto family = [](const std::string& t) { return t == "Adam" ? std::string("AdamW") : t; };
    if (family(saved_type) != family(our_type)) {
      ZD_THROW_INPUT(
          "{}: saved by optimizer {}; this job's optimizer is {} (its states are not {}'s): "
          "resume with \"optimizer\": {{\"type\": \"{}\"}} or start a new run",
          path, saved_type, our_type, our_type, saved_type);
    }
  }
  // The global batch: kept across world sizes unless the job allows a change.
  const BatchTriangle our_batch{cfg_.global_batch(), cfg_.micro_batch(), cfg_.grad_accum(),
                                cfg_.data_parallel_size};
  const std::optional<BatchTriangle> saved_batch_triangle = saved_batch(m);
  if (saved_batch_triangle) {
    check_batch_change(path, *saved_batch_triangle, our_batch, cfg_.train.allow_batch_change);
  }

  const Partition& part = engine_.partition();
  // Unit u's shard: elements [begin, begin + shard) of this rank's unit.
  struct Span {
    int64_t begin, shard;
  };
  auto span = [&](int u) {
    return Span{part.unit(u).begin(engine_.owner_rank(u)), part.unit(u).shard};
  };
  std::string mine;
  try {
    // (With expert groups this rank's experts units hold some of the experts: UnitReader cuts
    // them from the files' units of every expert.)
    if (saved_tp != my_tp || engine_.expert_groups()) {
      // Another tensor-parallel size: each unit put together from the saved parts and cut into
      // this rank's part (one unit at a time), then this rank's ZeRO shard of it.
      verify_checkpoint(path, m);
      UnitReader reader(path, m, spec);
      int cached = -1;
      std::vector<float> st[3];
      engine_.visit_states_host(
          ZeroEngine::StatesMode::kOverwrite, 0, part.num_units(),
          [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
            const int64_t numel = layout.unit(u).numel;
            if (u != cached) {
              for (auto& v : st) v.assign(static_cast<size_t>(numel), 0.0f);
              reader.read_local(layout, u, st[0].data(), st[1].data(), st[2].data());
              cached = u;
            }
            const int64_t b = span(u).begin;
            float* dst[3] = {pm, pa, pv};
            for (int k = 0; k < 3; ++k) {
              if (dst[k] == nullptr) continue;
              for (int64_t i = lo; i < hi; ++i)
                dst[k][i - lo] = b + i < numel ? st[k][static_cast<size_t>(b + i)] : 0.0f;
            }
          });
    } else {
      // The same tensor-parallel size (all experts on every rank): this tensor rank's files,
      // resharded over data parallelism.
      const Manifest mt = tensor_rank_manifest(m, layout.shard().rank);
      if (engine_.states_addressable()) {
        std::vector<ShardRequest> requests;
        for (int u = 0; u < part.num_units(); ++u) {
          const Span sp = span(u);
          requests.push_back({layout.global_unit(u), sp.begin, sp.begin + sp.shard,
                              engine_.master(u), engine_.exp_avg(u), engine_.exp_avg_sq(u)});
        }
        load_shards(path, mt, requests);
      } else {
        // NVMe or GPU states: check the files this rank reads, then read each piece (a
        // sub-group's part, or a unit shard through a host copy) straight into place (no copy of
        // the whole shard in memory).
        Manifest mine_only = mt;
        std::vector<int> local_unit(m.units.size(), -1);  // (a pipeline stage holds some)
        for (int u = 0; u < layout.num_units(); ++u)
          local_unit.at(static_cast<size_t>(layout.global_unit(u))) = u;
        std::erase_if(mine_only.files, [&](const CheckpointFile& f) {
          return std::none_of(f.slices.begin(), f.slices.end(), [&](const ShardSlice& s) {
            const int u = local_unit.at(static_cast<size_t>(s.unit));
            if (u < 0) return false;
            const Span sp = span(u);
            return s.begin < sp.begin + sp.shard && sp.begin < s.end;
          });
        });
        verify_checkpoint(path, mine_only);
        ShardReader reader(path, mt);
        engine_.visit_states_host(
            ZeroEngine::StatesMode::kOverwrite, 0, part.num_units(),
            [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
              reader.read(layout.global_unit(u), span(u).begin + lo, span(u).begin + hi, pm, pa,
                          pv);
            });
      }
    }
  } catch (const InputError& e) {
    mine = e.what();
  }
  // Every rank learns whether any rank found a file corrupt.
  std::vector<std::string> all = gather(mine);
  for (const std::string& w : all) {
    if (w.empty()) continue;
    *why = w;
    return std::nullopt;
  }
  engine_.set_adam_steps(m.progress.adam_steps);
  if (OnebitOptimizer* ob = engine_.onebit()) load_onebit(*ob, path);
  if (PowerSgd* ps = engine_.powersgd()) load_powersgd(*ps, path, m.progress.adam_steps);
  engine_.refresh_weights();
  if (ctx_.rank == 0) {
    spdlog::info("resumed from {} (step {}, saved by {} rank{} at ZeRO stage {}{})", path,
                 m.progress.global_step, m.world_size, m.world_size == 1 ? "" : "s", m.zero_stage,
                 saved_tp > 1 || my_tp > 1
                     ? fmt::format(", tensor parallel {} -> {}", saved_tp, my_tp)
                     : std::string());
    if (saved_batch_triangle) {
      const std::string line =
          fmt::format("batch on resume: the checkpoint trained {}; this run trains {}",
                      saved_batch_triangle->text(), our_batch.text());
      if (saved_batch_triangle->global != our_batch.global) {
        spdlog::warn("{} (another global batch: train.allow_batch_change)", line);
      } else {
        spdlog::info("{}", line);
      }
    }
  }
  return m.progress;
}

}  // namespace zerod
