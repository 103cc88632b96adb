#include "engine/train/memory_snapshot.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "comm/strings.h"
#include "core/error.h"
#include "core/file_write.h"
#include "core/timer.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/manifest.h"

namespace zerod {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Files as one byte string: per file, its name, '\0', its size (8 bytes), its bytes.
void pack_file(std::string& out, const std::string& name, const std::string& bytes) {
  out += name;
  out.push_back('\0');
  const uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += bytes;
}

// Every regular file of `dir`, named `prefix` + its name.
void pack_dir(std::string& out, const fs::path& dir, const std::string& prefix) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file())
      pack_file(out, prefix + e.path().filename().string(), read_file(e.path()));
  }
}

// Calls f(name, bytes) for each file of a pack_file string.
template <typename F>
void unpack(const std::string& packed, F&& f) {
  size_t at = 0;
  while (at < packed.size()) {
    const size_t end = packed.find('\0', at);
    ZD_CHECK(end != std::string::npos && end + 1 + sizeof(uint64_t) <= packed.size(),
             "snapshot: a torn file pack at byte {}", at);
    const std::string name = packed.substr(at, end - at);
    uint64_t n = 0;
    std::memcpy(&n, packed.data() + end + 1, sizeof(n));
    const size_t from = end + 1 + sizeof(n);
    ZD_CHECK(from + n <= packed.size(), "snapshot: file {} runs past its pack", name);
    f(name, packed.substr(from, n));
    at = from + n;
  }
}

// Written to a name of this rank's, then renamed: ranks of one node may write the same file.
void write_shared(const fs::path& path, const std::string& bytes, int rank) {
  const std::string tmp = path.string() + fmt::format(".tmp.rank{}", rank);
  write_file_synced(tmp, bytes);
  fs::rename(tmp, path);
}

// Snapshot steps held in `node_dir`: step -> (old world size, old ranks whose files it holds).
struct Held {
  int64_t world = 0;
  std::set<int> ranks;
};
std::map<int64_t, Held> list_held(const fs::path& node_dir) {
  std::map<int64_t, Held> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(node_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step", 0) != 0) continue;
    const int64_t step = std::atoll(n.c_str() + 4);
    if (!fs::exists(e.path() / "manifest.json")) continue;
    Held h;
    try {
      h.world = Manifest::from_json(json::parse(read_file(e.path() / "manifest.json")),
                                    (e.path() / "manifest.json").string())
                    .world_size;
    } catch (const std::exception&) {
      continue;
    }
    for (const auto& r : fs::directory_iterator(e.path())) {
      const std::string rn = r.path().filename().string();
      if (r.is_directory() && rn.rfind("rank", 0) == 0 && rn.find('.') == std::string::npos)
        h.ranks.insert(std::atoi(rn.c_str() + 4));
    }
    out[step] = std::move(h);
  }
  return out;
}

// The old ranks of h whose files are not held (none: the snapshot is complete).
std::vector<int> missing_ranks(const Held& h) {
  std::vector<int> missing;
  for (int o = 0; o < h.world; ++o)
    if (!h.ranks.count(o)) missing.push_back(o);
  return missing;
}

// The step of the newest checkpoint in `dir` (-1: none, or unreadable).
int64_t disk_checkpoint_step(const std::string& dir) {
  try {
    if (const auto tag = read_latest(dir))
      return read_manifest((fs::path(dir) / *tag).string()).progress.global_step;
  } catch (const std::exception&) {
  }
  return -1;
}

}  // namespace

MemorySnapshots::MemorySnapshots(const SnapshotConfig& config, const RankContext& ctx,
                                 int nproc_per_node, std::string node_dir)
    : config_(config),
      ctx_(ctx),
      nproc_(std::max(1, nproc_per_node)),
      node_dir_(std::move(node_dir)) {
  fs::create_directories(node_dir_);
}

void MemorySnapshots::after_step(int64_t step, Checkpointer& ckpt,
                                 const TrainingProgress& progress) {
  write_shared(fs::path(node_dir_) / fmt::format("progress.rank{}", ctx_.rank),
               std::to_string(step), ctx_.rank);
  if (step % config_.interval == 0) take(step, ckpt, progress);
}

void MemorySnapshots::take(int64_t step, Checkpointer& ckpt, const TrainingProgress& progress) {
  Stopwatch watch;
  const int rank = ctx_.rank, world = ctx_.world_size;
  const fs::path node(node_dir_);
  const fs::path stage = node / fmt::format("stage.rank{}", rank);
  fs::remove_all(stage);
  fs::create_directories(stage);
  const Manifest m = ckpt.save_files(stage.string(), default_tag(step), progress);
  std::string mine;
  pack_dir(mine, stage, "");
  fs::remove_all(stage);

  // The buddy ring: rank r's copy goes to r - nproc (the previous node's rank of the same
  // local index), r receives r + nproc's. One send_recv, padded to the longest pack.
  const int nodes = world / nproc_;
  std::string theirs;
  int from = -1;
  if (nodes > 1) {
    const int dst = (rank - nproc_ + world) % world;
    from = (rank + nproc_) % world;
    int64_t most = static_cast<int64_t>(mine.size());
    ctx_.comm->all_reduce(&most, 1, CommType::kI64, ReduceOp::kMax);
    const int64_t len = static_cast<int64_t>(sizeof(uint64_t)) + most;
    std::string send(static_cast<size_t>(len), '\0'), recv(static_cast<size_t>(len), '\0');
    const uint64_t n = mine.size();
    std::memcpy(send.data(), &n, sizeof(n));
    std::memcpy(send.data() + sizeof(n), mine.data(), mine.size());
    ctx_.comm->send_recv_async(send.data(), dst, recv.data(), from, len, CommType::kU8)->wait();
    uint64_t got = 0;
    std::memcpy(&got, recv.data(), sizeof(got));
    ZD_CHECK(got <= static_cast<uint64_t>(most), "snapshot: buddy pack of {} bytes", got);
    theirs = recv.substr(sizeof(got), got);
  }

  const fs::path dir = node / fmt::format("step{}", step);
  fs::create_directories(dir);
  write_shared(dir / "manifest.json", m.to_json().dump(), rank);
  auto place = [&](int old_rank, const std::string& packed) {
    const fs::path tmp = dir / fmt::format("rank{}.tmp", old_rank);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    unpack(packed, [&](const std::string& name, const std::string& bytes) {
      write_file_synced((tmp / name).string(), bytes);
    });
    fs::remove_all(dir / fmt::format("rank{}", old_rank));
    fs::rename(tmp, dir / fmt::format("rank{}", old_rank));  // complete from here on
  };
  place(rank, mine);
  if (from >= 0) place(from, theirs);
  // The newest two snapshots stay (the newer may be torn by a failure during it).
  for (const auto& [s, h] : list_held(node)) {
    if (s < step - config_.interval) fs::remove_all(node / fmt::format("step{}", s));
  }
  if (rank == 0) {
    spdlog::info("snapshot of step {} in memory: {:.1f} MB on rank 0 + its buddy's copy, {:.3f} s",
                 step, static_cast<double>(mine.size() + theirs.size()) / 1e6, watch.seconds());
  }
}

void MemorySnapshots::report(const std::string& line, int64_t steps_lost) {
  steps_lost_ = steps_lost;
  if (ctx_.rank == 0) spdlog::warn("elastic: {}", line);
  if (ctx_.rank % nproc_ == 0)
    write_shared(fs::path(node_dir_) / "recovery",
                 fmt::format("{}\nsteps_lost {}\n", line, steps_lost), ctx_.rank);
}

std::optional<SnapshotRestore> MemorySnapshots::prepare_restore(const std::string& checkpoint_dir) {
  Stopwatch watch;
  const fs::path node(node_dir_);
  // What this node holds, and the newest step its ranks trained.
  json info = json::object();
  json steps = json::object();
  for (const auto& [s, h] : list_held(node)) {
    steps[std::to_string(s)] = {{"world", h.world}, {"ranks", h.ranks}};
  }
  int64_t trained = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(node, ec)) {
    if (e.path().filename().string().rfind("progress.rank", 0) == 0)
      trained = std::max<int64_t>(trained, std::atoll(read_file(e.path()).c_str()));
  }
  info["steps"] = steps;
  info["trained"] = trained;
  const std::vector<std::string> all = ctx_.world_size > 1
                                           ? all_gather_strings(*ctx_.comm, info.dump())
                                           : std::vector<std::string>{info.dump()};
  std::map<int64_t, Held> pooled;
  std::vector<std::map<int64_t, std::set<int>>> per_rank(all.size());
  int64_t trained_to = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const json j = json::parse(all[r]);
    trained_to = std::max(trained_to, j["trained"].get<int64_t>());
    for (const auto& [s, h] : j["steps"].items()) {
      const int64_t step = std::stoll(s);
      Held& p = pooled[step];
      p.world = h["world"].get<int64_t>();
      for (int o : h["ranks"]) {
        p.ranks.insert(o);
        per_rank[r][step].insert(o);
      }
    }
  }
  // The disk checkpoint's step (rank 0 reads it; a shared file system).
  std::string disk = "-1";
  if (ctx_.rank == 0) disk = std::to_string(disk_checkpoint_step(checkpoint_dir));
  if (ctx_.world_size > 1) disk = broadcast_string(*ctx_.comm, disk, 0);
  const int64_t disk_step = std::stoll(disk);
  if (pooled.empty()) return std::nullopt;  // none taken yet (or a fresh agent's round)

  std::optional<int64_t> best;
  std::string incomplete;
  for (auto it = pooled.rbegin(); it != pooled.rend(); ++it) {
    const std::vector<int> missing = missing_ranks(it->second);
    if (missing.empty()) {
      best = it->first;
      break;
    }
    if (incomplete.empty())
      incomplete = fmt::format(
          "the snapshot of step {} is incomplete (ranks {} of its world of {} were lost with "
          "both their node and its buddy)",
          it->first, fmt::join(missing, ","), it->second.world);
  }
  const auto lost = [&](int64_t from) { return std::max<int64_t>(0, trained_to - from); };
  if (!best || *best <= disk_step) {
    const std::string why =
        best ? fmt::format(
                   "the disk checkpoint (step {}) is not older than the newest complete "
                   "snapshot (step {})",
                   disk_step, *best)
             : incomplete;
    report(fmt::format("restored step {} from the disk checkpoint, not memory: {}; {} step(s) "
                       "lost (trained to step {})",
                       std::max<int64_t>(0, disk_step), why, lost(std::max<int64_t>(0, disk_step)),
                       trained_to),
           lost(std::max<int64_t>(0, disk_step)));
    return std::nullopt;
  }
  const int64_t step = *best;
  const Held& h = pooled[step];
  // Each old rank's files come from the lowest new rank whose node holds them; every rank gets
  // all of them (the reshard reads any old rank's file).
  std::string mine;
  const fs::path sdir = node / fmt::format("step{}", step);
  for (int o = 0; o < h.world; ++o) {
    int provider = -1;
    for (size_t r = 0; r < per_rank.size() && provider < 0; ++r) {
      auto it = per_rank[r].find(step);
      if (it != per_rank[r].end() && it->second.count(o)) provider = static_cast<int>(r);
    }
    if (provider != ctx_.rank) continue;
    if (o == 0) pack_file(mine, "manifest.json", read_file(sdir / "manifest.json"));
    pack_dir(mine, sdir / fmt::format("rank{}", o), "");
  }
  const std::vector<std::string> packs =
      ctx_.world_size > 1 ? all_gather_strings(*ctx_.comm, mine) : std::vector<std::string>{mine};
  const fs::path rdir = node / fmt::format("restore.rank{}", ctx_.rank);
  fs::remove_all(rdir);
  const std::string tag = default_tag(step);
  const fs::path tmp = prepare_save(rdir.string(), tag);
  std::string manifest_text;
  int64_t bytes = 0;
  for (const std::string& p : packs) {
    bytes += static_cast<int64_t>(p.size());
    unpack(p, [&](const std::string& name, const std::string& data) {
      if (name == "manifest.json")
        manifest_text = data;
      else
        write_file_synced((tmp / name).string(), data);
    });
  }
  ZD_CHECK(!manifest_text.empty(), "snapshot of step {}: no manifest among the pooled files", step);
  Manifest m = Manifest::from_json(json::parse(manifest_text), (sdir / "manifest.json").string());
  m.tag = tag;
  commit_save(rdir.string(), m);
  report(fmt::format("restored step {} from the in-memory snapshot (old world {}; {:.1f} MB "
                     "pooled from the survivors' and buddies' copies in {:.3f} s), not the disk "
                     "checkpoint (step {}); {} step(s) lost (trained to step {})",
                     step, h.world, static_cast<double>(bytes) / 1e6, watch.seconds(),
                     std::max<int64_t>(0, disk_step), lost(step), trained_to),
         lost(step));
  return SnapshotRestore{rdir.string(), step, trained_to};
}

std::string save_held_snapshot(const std::string& node_dir, const std::string& checkpoint_dir) {
  const fs::path node(node_dir);
  std::optional<int64_t> best;
  int64_t world = 0;
  const auto held = list_held(node);
  for (auto it = held.rbegin(); it != held.rend() && !best; ++it) {
    if (it->second.world > 0 && missing_ranks(it->second).empty()) {
      best = it->first;
      world = it->second.world;
    }
  }
  if (!best) return "";
  const int64_t disk_step = disk_checkpoint_step(checkpoint_dir);
  if (*best <= disk_step) return "";
  const fs::path sdir = node / fmt::format("step{}", *best);
  const std::string tag = default_tag(*best);
  const fs::path tmp = prepare_save(checkpoint_dir, tag);
  for (int o = 0; o < world; ++o) {
    for (const auto& e : fs::directory_iterator(sdir / fmt::format("rank{}", o))) {
      if (e.is_regular_file())
        write_file_synced((tmp / e.path().filename()).string(), read_file(e.path()));
    }
  }
  Manifest m = Manifest::from_json(json::parse(read_file(sdir / "manifest.json")),
                                   (sdir / "manifest.json").string());
  m.tag = tag;
  commit_save(checkpoint_dir, m);
  return fmt::format(
      "saved the in-memory snapshot of step {} (old world {}, every rank's files held here) to "
      "{}: newer than the disk checkpoint ({}); restart with --resume latest",
      *best, world, (fs::path(checkpoint_dir) / tag).string(),
      disk_step < 0 ? std::string("none") : fmt::format("step {}", disk_step));
}

std::unique_ptr<MemorySnapshots> make_memory_snapshots(const JobConfig& cfg, const RankContext& ctx,
                                                       int nproc_per_node) {
  if (!cfg.snapshot.enabled) return nullptr;
  const char* dir = std::getenv(kSnapshotDirEnv);
  if (dir == nullptr || *dir == '\0') {
    if (ctx.rank == 0)
      spdlog::warn(
          "snapshot.enabled: in-memory snapshots are taken by elastic jobs only (zerod train "
          "--nnodes MIN:MAX); this run takes none");
    return nullptr;
  }
  return std::make_unique<MemorySnapshots>(cfg.snapshot, ctx, nproc_per_node, dir);
}

}  // namespace zerod
