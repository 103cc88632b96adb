// A Store over a directory shared by processes on one machine (multi-process tests and the
// collective benchmark, which do not want the gRPC rendezvous). Each key is one file, written
// atomically (write to a temporary file, then rename), so a reader sees a whole value or none;
// add() runs under an flock(2) of the directory's lock file. Readers poll (1 ms growing to
// 20 ms), which is plenty for bootstrapping communicators.
//
// Key names may contain any byte ('/' included): they are escaped for file names (bytes other
// than [A-Za-z0-9_-] and non-leading '.' become %XX). Temporary and lock files start with '.',
// which an escaped key never does.
#pragma once

#include <string>

#include "comm/store.h"

namespace zerod {

class FileStore : public Store {
 public:
  // Creates `dir` (and its parents) when missing. Throws Error(kInternal) when it cannot.
  explicit FileStore(std::string dir);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t add(const std::string& key, int64_t delta) override;

  const std::string& dir() const { return dir_; }
  // The file name that holds `key` (escaped; no directory).
  static std::string file_name(const std::string& key);

 private:
  std::string path(const std::string& key) const { return dir_ + "/" + file_name(key); }
  // Reads the whole file; false when it does not exist.
  bool read(const std::string& key, Bytes* out) const;
  void write_atomically(const std::string& key, const Bytes& value);

  std::string dir_;
};

}  // namespace zerod
