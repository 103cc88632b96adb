#include "engine/checkpoint/checkpoint_dir.h"

#include "engine/checkpoint/io_error.h"
#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

#include "core/error.h"
#include "core/fault_points.h"
#include "core/log.h"
#include "engine/config/input_limits.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) ZD_THROW("fsync {}: cannot open: {}", path, std::strerror(errno));
  const int injected = fault_point("save.fsync");
  const int rc = injected != 0 ? -1 : ::fsync(fd);
  const int err = injected != 0 ? injected : errno;
  ::close(fd);
  if (rc != 0) throw_save_io_error(path, "fsync", err);
}

// Writes `text` to `path` (created or truncated) and fsyncs it.
void write_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_save_io_error(path, "creating the file", errno);
  size_t done = 0;
  while (done < text.size()) {
    const int injected = fault_point("save.write");
    const ssize_t w = injected != 0 ? -1 : ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && injected == 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = injected != 0 ? injected : (w < 0 ? errno : EIO);
      ::close(fd);
      throw_save_io_error(
          path, fmt::format("write of {} bytes at offset {}", text.size() - done, done), err);
    }
    done += static_cast<size_t>(w);
  }
  const int injected = fault_point("save.fsync");
  if (injected != 0 || ::fsync(fd) != 0) {
    const int err = injected != 0 ? injected : errno;
    ::close(fd);
    throw_save_io_error(path, "fsync", err);
  }
  if (::close(fd) != 0) throw_save_io_error(path, "close", errno);
}

// The renames that publish a save.
void rename_path(const fs::path& from, const fs::path& to) {
  if (const int injected = fault_point("save.rename")) {
    throw_save_io_error(from.string(), "rename to " + to.string(), injected);
  }
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw_save_io_error(from.string(), "rename to " + to.string(), ec.value());
}

// Writes text to path via path.tmp + fsync + rename + fsync of the directory.
void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  try {
    write_synced(tmp, text);
    rename_path(tmp, path);
  } catch (const Error&) {
    ::unlink(tmp.c_str());  // (path itself is untouched)
    throw;
  }
  fsync_path(fs::path(path).parent_path().string(), true);
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

namespace {
// The tag rules; "" when `tag` follows them, else why not (quoting at most a prefix of it).
std::string tag_problem(const std::string& tag) {
  static const std::regex kTag("[A-Za-z0-9._-]{1,128}");
  if (tag.size() > 128 || !std::regex_match(tag, kTag)) {
    return fmt::format(
        "checkpoint tag \"{}\" is invalid: allowed are 1-128 characters of A-Z a-z 0-9 . _ -",
        config::clip_input(tag));
  }
  if (tag == "latest" || tag == "." || tag == ".." || tag[0] == '.' || has_suffix(tag, ".tmp") ||
      has_suffix(tag, ".old")) {
    return fmt::format(
        "checkpoint tag \"{}\" is reserved (\"latest\", names starting with '.', or ending "
        "in .tmp/.old)",
        tag);
  }
  return "";
}
}  // namespace

void validate_tag(const std::string& tag) {
  const std::string problem = tag_problem(tag);
  if (!problem.empty()) ZD_THROW_INPUT("{}", problem);
}

std::string default_tag(int64_t global_step) {
  return fmt::format("global_step{}", global_step);
}

void probe_checkpoint_dir(const std::string& dir, const std::string& key, bool create,
                          const std::string& probe_id) {
  std::error_code ec;
  fs::path where(dir);
  if (fs::exists(where, ec) && !fs::is_directory(where, ec)) {
    ZD_THROW_INPUT("{}: {} exists and is not a directory", key, dir);
  }
  if (create) {
    fs::create_directories(where, ec);
    if (ec) ZD_THROW_INPUT("{}: cannot create {}: {}", key, dir, ec.message());
  } else {
    // The nearest existing ancestor: where the directory would be created.
    while (!where.empty() && !fs::exists(where, ec)) where = where.parent_path();
    if (where.empty()) where = ".";
    if (!fs::is_directory(where, ec)) {
      ZD_THROW_INPUT("{}: {} cannot be created: {} is not a directory", key, dir, where.string());
    }
  }
  const fs::path probe = where / (".zerod-probe-" + probe_id);
  const fs::path renamed = where / (".zerod-probe-" + probe_id + ".done");
  auto fail = [&](const char* what, int err) {
    ::unlink(probe.c_str());
    ::unlink(renamed.c_str());
    ZD_THROW_INPUT("{}: checkpoints cannot be written under {} ({} {} failed: {})", key, dir, what,
                   where.string() == dir ? "a probe file" : "a probe file in " + where.string(),
                   std::strerror(err));
  };
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating", errno);
  const char bytes[] = "zerod checkpoint directory probe\n";
  const ssize_t n = ::write(fd, bytes, sizeof(bytes) - 1);
  const int werr = errno;
  if (n != static_cast<ssize_t>(sizeof(bytes) - 1)) {
    ::close(fd);
    fail("writing", n < 0 ? werr : ENOSPC);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsyncing", err);
  }
  ::close(fd);
  if (std::rename(probe.c_str(), renamed.c_str()) != 0) fail("renaming", errno);
  if (::unlink(renamed.c_str()) != 0) fail("removing", errno);
}

std::string prepare_save(const std::string& dir, const std::string& tag) {
  validate_tag(tag);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZD_THROW_INPUT("train.checkpoint_dir: cannot create '{}': {}", dir, ec.message());
  const std::string tmp = (fs::path(dir) / (tag + ".tmp")).string();
  fs::remove_all(tmp, ec);
  if (ec) ZD_THROW("cannot remove the stale {}: {}", tmp, ec.message());
  fs::create_directory(tmp, ec);
  if (ec) ZD_THROW_INPUT("train.checkpoint_dir: cannot create '{}': {}", tmp, ec.message());
  return tmp;
}

void commit_save(const std::string& dir, const Manifest& manifest) {
  const fs::path root(dir);
  const fs::path tmp = root / (manifest.tag + ".tmp");
  const fs::path final_dir = root / manifest.tag;
  const fs::path aside = root / (manifest.tag + ".old");
  write_synced((tmp / "manifest.json").string(), manifest.to_json().dump(2) + "\n");
  fsync_path(tmp.string(), true);
  std::error_code ec;
  // Saving a tag again: move the old one aside first (a crash in between leaves `latest` on a
  // missing tag, and loading falls back to the newest complete checkpoint).
  fs::remove_all(aside, ec);
  if (fs::exists(final_dir)) rename_path(final_dir, aside);
  rename_path(tmp, final_dir);
  fsync_path(root.string(), true);
  write_atomic((root / "latest").string(), manifest.tag + "\n");
  fs::remove_all(aside, ec);
}

std::optional<std::string> read_latest(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  if (!in) return std::nullopt;
  std::string tag;
  std::getline(in, tag);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  // `latest` is a file anyone may have written: it names a checkpoint of this directory (a tag,
  // so no path out of it: "../other/global_step5", "/abs") or nothing.
  if (const std::string problem = tag_problem(tag); !problem.empty()) {
    spdlog::warn(
        "{}: ignored ({}); the newest complete checkpoint of the directory is used instead",
        (fs::path(dir) / "latest").string(), problem);
    return std::nullopt;
  }
  return tag;
}

std::vector<std::pair<std::string, Manifest>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::string, Manifest>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory()) continue;
    const std::string tag = entry.path().filename().string();
    if (has_suffix(tag, ".tmp") || has_suffix(tag, ".old")) continue;
    if (!fs::exists(entry.path() / "manifest.json")) continue;
    try {
      out.emplace_back(tag, read_manifest(entry.path().string()));
    } catch (const Error&) {
      // an unreadable manifest is not a complete checkpoint
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.second.progress.global_step != b.second.progress.global_step)
      return a.second.progress.global_step > b.second.progress.global_step;
    return a.first > b.first;
  });
  return out;
}

std::vector<std::string> apply_retention(const std::string& dir, int64_t keep_last) {
  std::vector<std::string> removed;
  std::error_code ec;
  const std::optional<std::string> latest = read_latest(dir);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && has_suffix(name, ".tmp")) {
      fs::remove_all(entry.path(), ec);
      removed.push_back(name);
    }
  }
  if (keep_last <= 0) return removed;
  // Only the job's own (automatic) checkpoints count and go; a checkpoint the user saved with a
  // tag stays until a command deletes it.
  int64_t kept = 0;
  for (const auto& [tag, manifest] : list_checkpoints(dir)) {
    if (!manifest.automatic) continue;
    if (kept++ < keep_last) continue;
    if (latest && tag == *latest) continue;
    fs::remove_all(fs::path(dir) / tag, ec);
    if (!ec) removed.push_back(tag);
  }
  return removed;
}

void verify_checkpoint(const std::string& path, const Manifest& manifest, bool checksums) {
  std::vector<SideFile> all;
  for (const CheckpointFile& f : manifest.files) all.push_back({f.name, f.bytes, f.crc32c});
  if (manifest.tokenizer) {
    all.insert(all.end(), manifest.tokenizer->files.begin(), manifest.tokenizer->files.end());
  }
  for (const SideFile& f : all) {
    const std::string file = (fs::path(path) / f.name).string();
    std::error_code ec;
    const auto size = fs::file_size(file, ec);
    if (ec) ZD_THROW_INPUT("{}: missing ({})", file, ec.message());
    if (static_cast<int64_t>(size) != f.bytes) {
      ZD_THROW_INPUT("{}: {} bytes, the manifest says {} (torn or truncated)", file, size, f.bytes);
    }
    if (!checksums) continue;
    uint32_t crc = 0;
    try {
      crc = file_crc32c(file).crc32c;
    } catch (const Error& e) {
      ZD_THROW_INPUT("{}", e.what());  // an unreadable checkpoint is bad input, as a torn one
    }
    if (crc != f.crc32c) {
      ZD_THROW_INPUT("{}: CRC32C {:08x}, the manifest says {:08x} (corrupt)", file, crc, f.crc32c);
    }
  }
}

FoundCheckpoint find_checkpoint(const std::string& dir, const std::string& which,
                                const FindOptions& options) {
  if (which != "latest") validate_tag(which);  // first: the messages below quote it
  if (dir.empty()) ZD_THROW_INPUT("checkpoint '{}': no checkpoint directory given", which);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    ZD_THROW_INPUT("checkpoint '{}': checkpoint directory '{}' does not exist", which, dir);
  }
  FoundCheckpoint found;
  auto load = [&](const std::string& tag) {
    const std::string path = (fs::path(dir) / tag).string();
    Manifest m = read_manifest(path);
    verify_checkpoint(path, m, options.checksums);
    found.tag = tag;
    found.path = path;
    found.manifest = std::move(m);
  };
  if (which != "latest") {
    if (!fs::is_directory(fs::path(dir) / which)) {
      std::string known;
      for (const auto& [tag, m] : list_checkpoints(dir)) known += (known.empty() ? "" : ", ") + tag;
      ZD_THROW_INPUT("checkpoint '{}': no checkpoint with that tag in '{}' (found: {})", which, dir,
                     known.empty() ? "none" : known);
    }
    load(which);
    return found;
  }
  std::vector<std::string> candidates;
  if (const auto latest = read_latest(dir)) candidates.push_back(*latest);
  for (const auto& [tag, m] : list_checkpoints(dir)) {
    if (std::find(candidates.begin(), candidates.end(), tag) == candidates.end())
      candidates.push_back(tag);
  }
  for (const std::string& tag : candidates) {
    if (std::find(options.exclude.begin(), options.exclude.end(), tag) != options.exclude.end()) {
      found.skipped.push_back(fmt::format("{}: corrupt (found while loading it)", tag));
      continue;
    }
    try {
      load(tag);
      return found;
    } catch (const Error& e) {
      found.skipped.push_back(fmt::format("{}: {}", tag, e.what()));
    }
  }
  std::string why;
  for (const auto& s : found.skipped) why += "\n  " + s;
  ZD_THROW_INPUT("checkpoint 'latest': no complete checkpoint in '{}'{}", dir, why);
}

}  // namespace zerod
