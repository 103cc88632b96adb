#include "offload/aio/aio_engine.h"

#include <fcntl.h>
#include <libaio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace {

[[noreturn]] void io_error(const std::string& path, bool write, int64_t offset, int err) {
  const std::string what = fmt::format("{}: {} at offset {} failed: {}", path,
                                       write ? "write" : "read", offset, std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) ZD_THROW_INPUT("{} (the disk is full)", what);
  ZD_THROW_KIND(ErrorKind::kSystem, "{}", what);
}

std::once_flag g_fallback_warned;

// ZEROD_AIO_FAULT=ERRNO:read|write:N[:PATH_PART] (fault injection for tests): the N-th request
// of that kind (counted from when the variable was set, on files whose path contains PATH_PART)
// fails with ERRNO (EIO, ENOSPC, EDQUOT or EROFS), as if the kernel had returned it.
struct Fault {
  std::string spec;  // the variable's value this was parsed from
  int err = 0;
  bool write = false;
  int64_t nth = 0, seen = 0;
  std::string path_part;
};

Fault parse_fault(const std::string& spec) {
  Fault f;
  f.spec = spec;
  std::vector<std::string> parts;
  size_t b = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t e = std::min(spec.find(':', b), spec.size());
    parts.push_back(spec.substr(b, e - b));
    b = e + 1;
  }
  if (b < spec.size()) f.path_part = spec.substr(b);  // the rest (it may hold ':')
  const std::pair<const char*, int> names[] = {
      {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}};
  for (const auto& [name, value] : names)
    if (parts[0] == name) f.err = value;
  bool ok = f.err != 0 && (parts[1] == "read" || parts[1] == "write");
  f.write = parts[1] == "write";
  try {
    f.nth = std::stoll(parts[2]);
  } catch (...) {
    ok = false;
  }
  if (!ok || f.nth < 1) {
    ZD_THROW_INPUT(
        "ZEROD_AIO_FAULT={}: expected ERRNO:read|write:N[:PATH_PART] with ERRNO one of EIO, "
        "ENOSPC, EDQUOT, EROFS and N >= 1",
        spec);
  }
  spdlog::warn("ZEROD_AIO_FAULT: {} request {} will fail with {}", parts[1], f.nth, parts[0]);
  return f;
}

void maybe_inject_fault(const std::string& path, bool write, int64_t offset) {
  const char* env = std::getenv("ZEROD_AIO_FAULT");
  if (env == nullptr || *env == '\0') return;
  static std::mutex mu;
  static Fault fault;
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (fault.spec != env) fault = parse_fault(env);
    if (fault.write != write) return;
    if (!fault.path_part.empty() && path.find(fault.path_part) == std::string::npos) return;
    if (++fault.seen == fault.nth) err = fault.err;
  }
  if (err != 0) io_error(path, write, offset, err);
}

}  // namespace

// ---- AlignedBuffer --------------------------------------------------------------------------

AlignedBuffer::AlignedBuffer(int64_t bytes)
    : bytes_(bytes), capacity_(aio_round_up(std::max<int64_t>(bytes, 1))) {
  data_ = static_cast<char*>(std::aligned_alloc(kAioAlign, static_cast<size_t>(capacity_)));
  ZD_CHECK(data_ != nullptr, "cannot allocate {} aligned bytes", capacity_);
}
AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}
AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), capacity_(o.capacity_) {
  o.data_ = nullptr;
  o.bytes_ = o.capacity_ = 0;
}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.bytes_ = o.capacity_ = 0;
  }
  return *this;
}

// ---- AioFile --------------------------------------------------------------------------------

AioFile::AioFile(const std::string& path, Mode mode) : path_(path) {
  int flags = O_CLOEXEC;
  if (mode == Mode::kRead) flags |= O_RDONLY;
  if (mode == Mode::kReadWrite) flags |= O_RDWR;
  if (mode == Mode::kCreate) flags |= O_RDWR | O_CREAT | O_TRUNC;
  fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) {
    std::call_once(g_fallback_warned, [&] {
      spdlog::warn("{}: the file system refuses O_DIRECT; using buffered I/O", path);
    });
    fd_ = ::open(path.c_str(), flags, 0644);
  }
  if (fd_ < 0) ZD_THROW_INPUT("{}: cannot open: {}", path, std::strerror(errno));
}

AioFile::~AioFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t AioFile::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) ZD_THROW("{}: fstat failed: {}", path_, std::strerror(errno));
  return static_cast<int64_t>(st.st_size);
}

// ---- AioEngine ------------------------------------------------------------------------------

AioEngine::AioEngine(const AioOptions& options) : opt_(options) {
  ZD_CHECK_INPUT(opt_.block_size >= kAioAlign && opt_.block_size % kAioAlign == 0,
                 "aio.block_size {}: must be a positive multiple of {}", opt_.block_size,
                 kAioAlign);
  ZD_CHECK_INPUT(opt_.queue_depth >= 1 && opt_.queue_depth <= 1024,
                 "aio.queue_depth {}: must be 1-1024", opt_.queue_depth);
  ZD_CHECK_INPUT(opt_.threads >= 1 && opt_.threads <= 64,
                 "aio.intra_op_parallelism {}: must be 1-64", opt_.threads);
}

AioEngine::~AioEngine() {
  for (io_context_t c : free_contexts_) io_destroy(c);
}

io_context_t AioEngine::acquire_context() {
  {
    std::lock_guard<std::mutex> lock(contexts_mu_);
    if (!free_contexts_.empty()) {
      io_context_t c = free_contexts_.back();
      free_contexts_.pop_back();
      return c;
    }
  }
  io_context_t c{};
  if (int rc = io_setup(opt_.queue_depth, &c); rc < 0) {
    ZD_THROW("io_setup({}) failed: {} (raise /proc/sys/fs/aio-max-nr?)", opt_.queue_depth,
             std::strerror(-rc));
  }
  return c;
}

void AioEngine::release_context(io_context_t c) {
  std::lock_guard<std::mutex> lock(contexts_mu_);
  free_contexts_.push_back(c);
}

int64_t AioEngine::write(AioFile& f, int64_t offset, const AlignedBuffer& buf, int64_t bytes) {
  ZD_CHECK(bytes >= 0 && bytes <= buf.capacity(), "write of {} bytes from a buffer of {}", bytes,
           buf.capacity());
  int64_t n = bytes;
  if (f.direct()) {
    n = aio_round_up(bytes);
    ZD_CHECK(n <= buf.capacity(), "write of {} bytes needs a buffer of {}", bytes, n);
    std::memset(buf.data() + bytes, 0, static_cast<size_t>(n - bytes));
  }
  return run(f, true, offset, buf.data(), n);
}

int64_t AioEngine::read(AioFile& f, int64_t offset, AlignedBuffer& buf, int64_t bytes) {
  const int64_t n = f.direct() ? aio_round_up(bytes) : bytes;
  ZD_CHECK(n <= buf.capacity(), "read of {} bytes into a buffer of {}", bytes, buf.capacity());
  return std::min(bytes, run(f, false, offset, buf.data(), n));
}

// Cuts [offset, offset + bytes) into blocks, deals them round-robin to the threads, each of
// which keeps queue_depth of them in flight on its own io context. Returns the bytes moved
// (reads stop short at the end of the file).
int64_t AioEngine::run(AioFile& f, bool write, int64_t offset, char* data, int64_t bytes) {
  if (f.direct()) {
    ZD_CHECK(offset % kAioAlign == 0, "{}: offset {} is not a multiple of {}", f.path(), offset,
             kAioAlign);
    ZD_CHECK(reinterpret_cast<uintptr_t>(data) % kAioAlign == 0, "unaligned buffer");
  }
  if (bytes <= 0) return 0;
  maybe_inject_fault(f.path(), write, offset);
  if (!f.direct()) {
    // Buffered files: the kernel would run aio on them synchronously anyway (and refuses it on
    // some, e.g. character devices), so plain pread/pwrite.
    int64_t done = 0;
    while (done < bytes) {
      const ssize_t r =
          write ? ::pwrite(f.fd(), data + done, static_cast<size_t>(bytes - done), offset + done)
                : ::pread(f.fd(), data + done, static_cast<size_t>(bytes - done), offset + done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) io_error(f.path(), write, offset + done, errno);
      if (r == 0) {
        if (write) io_error(f.path(), write, offset + done, ENOSPC);
        break;  // end of file
      }
      done += r;
    }
    return done;
  }
  struct Piece {
    int64_t off, len;
  };
  std::vector<Piece> pieces;
  for (int64_t p = 0; p < bytes; p += opt_.block_size) {
    pieces.push_back({p, std::min(opt_.block_size, bytes - p)});
  }
  const int threads = std::min<int>(opt_.threads, static_cast<int>(pieces.size()));
  std::vector<int64_t> moved(static_cast<size_t>(threads), 0);
  std::vector<int64_t> eof_at(static_cast<size_t>(threads), bytes);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));

  auto worker = [&](int t) {
    try {
      std::vector<const Piece*> mine;
      for (size_t i = static_cast<size_t>(t); i < pieces.size(); i += static_cast<size_t>(threads))
        mine.push_back(&pieces[i]);
      // io contexts are kept for the next request: io_destroy waits for an RCU grace period
      // (tens of ms), far more than a small request takes.
      const int depth = std::min<int>(opt_.queue_depth, static_cast<int>(mine.size()));
      struct Lease {
        AioEngine* e;
        io_context_t c;
        ~Lease() { e->release_context(c); }
      } lease{this, acquire_context()};
      io_context_t ctx = lease.c;
      std::vector<iocb> cbs(static_cast<size_t>(depth));
      std::vector<iocb*> free_cbs;
      for (auto& cb : cbs) free_cbs.push_back(&cb);
      std::vector<io_event> events(static_cast<size_t>(depth));
      size_t next = 0;
      int in_flight = 0;
      while (next < mine.size() || in_flight > 0) {
        // Fill the queue (all free slots, or when not overlapping only once it drained).
        if (opt_.overlap_events || in_flight == 0) {
          std::vector<iocb*> batch;
          while (next < mine.size() && !free_cbs.empty()) {
            iocb* cb = free_cbs.back();
            free_cbs.pop_back();
            const Piece& p = *mine[next++];
            if (write)
              io_prep_pwrite(cb, f.fd(), data + p.off, static_cast<size_t>(p.len), offset + p.off);
            else
              io_prep_pread(cb, f.fd(), data + p.off, static_cast<size_t>(p.len), offset + p.off);
            cb->data = const_cast<Piece*>(&p);
            batch.push_back(cb);
          }
          size_t done = 0;
          while (done < batch.size()) {
            const long count = opt_.single_submit ? 1 : static_cast<long>(batch.size() - done);
            const int rc = io_submit(ctx, count, batch.data() + done);
            if (rc == -EAGAIN || rc == -EINTR) continue;
            if (rc < 0) {
              const Piece& p = *static_cast<Piece*>(batch[done]->data);
              io_error(f.path(), write, offset + p.off, -rc);
            }
            done += static_cast<size_t>(rc);
            in_flight += rc;
          }
        }
        if (in_flight == 0) continue;
        const int got = io_getevents(ctx, 1, in_flight, events.data(), nullptr);
        if (got == -EINTR) continue;
        if (got < 0) ZD_THROW("{}: io_getevents failed: {}", f.path(), std::strerror(-got));
        for (int e = 0; e < got; ++e) {
          const io_event& ev = events[static_cast<size_t>(e)];
          const Piece& p = *static_cast<Piece*>(ev.obj->data);
          const auto res = static_cast<long>(ev.res);
          if (res < 0) io_error(f.path(), write, offset + p.off, static_cast<int>(-res));
          if (res < p.len) {
            if (write) io_error(f.path(), write, offset + p.off + res, ENOSPC);
            eof_at[static_cast<size_t>(t)] = std::min(eof_at[static_cast<size_t>(t)], p.off + res);
          }
          moved[static_cast<size_t>(t)] += res;
          free_cbs.push_back(ev.obj);
          --in_flight;
        }
      }
    } catch (...) {
      errors[static_cast<size_t>(t)] = std::current_exception();
    }
  };
  if (threads == 1) {
    worker(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
    for (auto& th : pool) th.join();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (write) return bytes;
  // A read is complete up to the first short piece (the end of the file).
  return *std::min_element(eof_at.begin(), eof_at.end());
}

}  // namespace zerod
