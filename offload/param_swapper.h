// NVMe offload of parameters (ZeRO-Infinity, stage 3): the compute-dtype weight shards of the
// units that do not stay in host memory live in one swap file, each unit's shard in its own
// region aligned to 4 KiB. A shard is read through a bounce buffer into wherever its gather
// wants it, and the optimizer writes a unit's new shard into a staging buffer that is then
// written out in one O_DIRECT request. Both buffers hold offload_param.buffer_size elements,
// which must cover the largest shard (as in DeepSpeed); they are the two of buffer_count that
// zerod uses, charged to MemCategory::kSwap. The file is allocated in full when created and
// removed with the swapper.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "offload/aio/aio_engine.h"
#include "offload/host_registrar.h"

namespace zerod {

class ParamSwapper {
 public:
  // region_bytes[i]: the bytes of region i (0: the region is not on NVMe). `registrar`: the device
  // copying to and from the two buffers (GPU runs; may be empty).
  ParamSwapper(std::string path, std::vector<int64_t> region_bytes, int64_t buffer_bytes,
               bool pin_memory, const AioOptions& aio, MemoryTracker* tracker,
               HostRegistrar registrar = {});
  ~ParamSwapper();
  ParamSwapper(const ParamSwapper&) = delete;
  ParamSwapper& operator=(const ParamSwapper&) = delete;

  // Reads region i into dst (any alignment).
  void read(int i, void* dst);
  // The staging buffer for region i (one region at a time); write_staged(i) writes it.
  void* stage(int i);
  void write_staged(int i);

  double io_seconds() const { return io_seconds_; }  // spent in reads and writes, in all
  int64_t file_bytes() const { return file_bytes_; }
  int64_t buffer_bytes() const { return 2 * buffer_bytes_; }  // host
  const std::string& path() const { return path_; }
  // The bytes a file of these regions takes.
  static int64_t file_bytes_for(const std::vector<int64_t>& region_bytes);

 private:
  std::string path_;
  std::vector<int64_t> bytes_, offset_;
  int64_t file_bytes_ = 0, buffer_bytes_ = 0;
  MemoryTracker* tracker_;
  bool pinned_ = false;
  HostRegistrar registrar_;
  std::unique_ptr<AioFile> file_;
  std::unique_ptr<AioEngine> aio_;
  AlignedBuffer bounce_, staging_;
  int staged_ = -1;
  double io_seconds_ = 0;
};

}  // namespace zerod
