// Who hosts an elastic job's rendezvous (docs/elastic.md, "Node 0 dies"): a small file in the
// job's checkpoint directory, which every node reaches at the same path. The host rewrites it
// every beat; when node 0's agent dies, the next live agent by node rank takes the rendezvous
// over only once the file has gone stale (its writer stopped), with a higher term. A host that
// finds a higher term in the file was presumed dead and taken over: it fails instead of going
// on (never two rendezvous hosts training two groups apart).
//
// File: one line "term T address HOST:PORT node N instance I", replaced by rename.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace zerod {

struct ElasticHostRecord {
  int64_t term = 0;
  std::string address;  // HOST:PORT of the ElasticRendezvous
  int node_rank = -1;
  std::string instance;
  double age_seconds = 0;  // since the file was last written (its mtime)
};

class ElasticHostLease {
 public:
  // The lease file of a job whose checkpoints go to `checkpoint_dir`.
  static std::string path_in(const std::string& checkpoint_dir);
  // The record in `path`, or nullopt when there is none (or it cannot be parsed).
  static std::optional<ElasticHostRecord> read(const std::string& path);

  // Holds the lease at `term` for the host at `address`; writes it now. Throws on an I/O error.
  ElasticHostLease(std::string path, int64_t term, std::string address, int node_rank,
                   std::string instance);
  // Rewrites the file (its mtime is the host's liveness). Returns false, without writing, when
  // the file names a higher term: this host was taken over.
  bool refresh();
  int64_t term() const { return term_; }
  const std::string& path() const { return path_; }

 private:
  void write();
  const std::string path_;
  const int64_t term_;
  const std::string address_;
  const int node_rank_;
  const std::string instance_;
};

}  // namespace zerod
