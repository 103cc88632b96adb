#include "engine/runtime/elastic_host_lease.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zerod {

namespace fs = std::filesystem;

std::string ElasticHostLease::path_in(const std::string& checkpoint_dir) {
  return (fs::path(checkpoint_dir) / "elastic_host").string();
}

std::optional<ElasticHostRecord> ElasticHostLease::read(const std::string& path) {
  std::error_code ec;
  const auto mtime = fs::last_write_time(path, ec);
  if (ec) return std::nullopt;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  std::istringstream s(line);
  std::string k1, k2, k3, k4;
  ElasticHostRecord r;
  if (!(s >> k1 >> r.term >> k2 >> r.address >> k3 >> r.node_rank >> k4 >> r.instance) ||
      k1 != "term" || k2 != "address" || k3 != "node" || k4 != "instance") {
    return std::nullopt;
  }
  r.age_seconds = std::chrono::duration<double>(fs::file_time_type::clock::now() - mtime).count();
  return r;
}

ElasticHostLease::ElasticHostLease(std::string path, int64_t term, std::string address,
                                   int node_rank, std::string instance)
    : path_(std::move(path)),
      term_(term),
      address_(std::move(address)),
      node_rank_(node_rank),
      instance_(std::move(instance)) {
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  write();
}

void ElasticHostLease::write() {
  const std::string tmp = path_ + "." + instance_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << fmt::format("term {} address {} node {} instance {}\n", term_, address_, node_rank_,
                       instance_);
    if (!out) ZD_THROW("cannot write the elastic host lease {}", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path_, ec);
  if (ec) ZD_THROW("cannot write the elastic host lease {}: {}", path_, ec.message());
}

bool ElasticHostLease::refresh() {
  if (const auto r = read(path_); r && r->term > term_) return false;
  write();
  return true;
}

}  // namespace zerod
