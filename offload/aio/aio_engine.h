// The aio engine (offload/aio/): O_DIRECT reads and writes of aligned host buffers through
// Linux native AIO (libaio), as ZeRO-Infinity's NVMe offload and checkpoint files need them.
//
// A request is cut into `block_size` pieces and kept `queue_depth` deep in flight per thread;
// `threads` (DeepSpeed's intra_op_parallelism) split the pieces between as many io contexts.
// `single_submit` submits one iocb per io_submit call instead of batches; `overlap_events`
// refills the queue as each completion arrives instead of after the whole batch.
//
// O_DIRECT wants offsets and lengths in whole 4 KiB blocks and aligned memory: offsets must be
// multiples of kAioAlign; a length that is not is rounded up, so buffers come from
// AlignedBuffer (capacity rounded up, tail zeroed on write). Where the file system refuses
// O_DIRECT (tmpfs) the engine says so once and falls back to buffered I/O. Kernel errors
// become exceptions naming the file, the offset and the error (ENOSPC: InputError, exit 2).
#pragma once

#include <libaio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

inline constexpr int64_t kAioAlign = 4096;

// x rounded up to whole kAioAlign blocks (what an O_DIRECT request of x bytes moves).
inline constexpr int64_t aio_round_up(int64_t x) {
  return (x + kAioAlign - 1) / kAioAlign * kAioAlign;
}

struct AioOptions {
  int64_t block_size = 1 << 20;  // bytes per iocb (a multiple of kAioAlign)
  int queue_depth = 8;           // iocbs in flight per thread
  int threads = 1;               // intra_op_parallelism
  bool single_submit = false;
  bool overlap_events = true;
};

// Host memory aligned for O_DIRECT, its capacity rounded up to whole blocks.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }        // as asked
  int64_t capacity() const { return capacity_; }  // rounded up to kAioAlign

 private:
  char* data_ = nullptr;
  int64_t bytes_ = 0, capacity_ = 0;
};

// One open file.
class AioFile {
 public:
  enum class Mode { kRead, kReadWrite, kCreate };  // kCreate truncates
  AioFile(const std::string& path, Mode mode);
  ~AioFile();
  AioFile(const AioFile&) = delete;
  AioFile& operator=(const AioFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  int64_t size() const;

 private:
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
};

class AioEngine {
 public:
  explicit AioEngine(const AioOptions& options);
  ~AioEngine();
  const AioOptions& options() const { return opt_; }

  // Writes buf[0, bytes) at `offset` (a multiple of kAioAlign). With O_DIRECT the last block
  // is written whole: buf must have room up to the next block (AlignedBuffer has), which is
  // zeroed first. Returns the bytes written to the file (bytes rounded up to a block, or
  // bytes when buffered).
  int64_t write(AioFile& f, int64_t offset, const AlignedBuffer& buf, int64_t bytes);
  // Reads `bytes` at `offset` into buf; returns the bytes read (fewer at the end of the file).
  int64_t read(AioFile& f, int64_t offset, AlignedBuffer& buf, int64_t bytes);

 private:
  int64_t run(AioFile& f, bool write, int64_t offset, char* data, int64_t bytes);
  io_context_t acquire_context();  // a free io context of queue_depth, or a new one
  void release_context(io_context_t c);
  AioOptions opt_;
  std::mutex contexts_mu_;
  std::vector<io_context_t> free_contexts_;
};

}  // namespace zerod
