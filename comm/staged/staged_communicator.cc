#include "comm/staged/staged_communicator.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"

namespace zerod {

namespace {

// Host buffers of exact sizes, reused across operations. Freed buffers are kept while the pool
// holds less than kKeepBytes; beyond that they are released.
class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  static constexpr size_t kKeepBytes = size_t{2} << 30;

  std::unique_ptr<uint8_t[]> take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        std::unique_ptr<uint8_t[]> p = std::move(it->second);
        free_.erase(it);
        kept_ -= bytes;
        return p;
      }
    }
    return std::unique_ptr<uint8_t[]>(new uint8_t[bytes]);  // (not zeroed: always overwritten)
  }
  void give(std::unique_ptr<uint8_t[]> p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_ + bytes > kKeepBytes) return;
    kept_ += bytes;
    free_.emplace(bytes, std::move(p));
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> free_;
  size_t kept_ = 0;
};

// One host buffer of the pool, returned to it when destroyed.
class HostBuffer {
 public:
  HostBuffer(std::shared_ptr<HostPool> pool, size_t bytes)
      : pool_(std::move(pool)), bytes_(bytes), data_(pool_->take(bytes)) {}
  ~HostBuffer() {
    if (data_) pool_->give(std::move(data_), bytes_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() { return data_.get(); }

 private:
  std::shared_ptr<HostPool> pool_;
  size_t bytes_;
  std::unique_ptr<uint8_t[]> data_;
};

// An output to copy back to device memory once the host operation is done.
struct CopyBack {
  void* dst;
  const void* src;
  size_t bytes;
};

// The host operation's Work, the staging buffers it uses, and the outputs to copy back on wait().
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::vector<std::unique_ptr<HostBuffer>> buffers,
             std::vector<CopyBack> backs, DeviceCopy copy)
      : inner_(std::move(inner)),
        buffers_(std::move(buffers)),
        backs_(std::move(backs)),
        copy_(std::move(copy)) {}

  void wait() override {
    if (finished_) return;
    inner_->wait();  // (a failure propagates; nothing is written to the outputs)
    for (const CopyBack& b : backs_) copy_(b.dst, b.src, b.bytes);
    finished_ = true;
    buffers_.clear();
  }
  bool done() const override { return finished_ || inner_->done(); }
  int64_t sequence() const override { return inner_->sequence(); }

 private:
  WorkPtr inner_;
  std::vector<std::unique_ptr<HostBuffer>> buffers_;
  std::vector<CopyBack> backs_;
  DeviceCopy copy_;
  bool finished_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Communicator& host, DeviceCopy copy)
      : host_(host), copy_(std::move(copy)), pool_(std::make_shared<HostPool>()) {
    ZD_CHECK(copy_ != nullptr, "a staged communicator needs the device copy");
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const char* backend() const override { return host_.backend(); }
  int64_t sequence() const override { return host_.sequence(); }
  std::chrono::milliseconds timeout() const override { return host_.timeout(); }
  const CollectiveLog* collective_log() const override { return host_.collective_log(); }

  WorkPtr all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) override {
    const size_t bytes = checked_collective_bytes("all_reduce", data, data, count, type, 1);
    if (bytes == 0) return host_.all_reduce_async(data, count, type, op);
    Stage s(*this);
    uint8_t* h = s.input(data, bytes);
    s.output(data, h, bytes);
    return s.finish(host_.all_reduce_async(h, count, type, op));
  }

  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t count, CommType type,
                               ReduceOp op) override {
    const int n = size();
    const size_t block = checked_collective_bytes("reduce_scatter", send, recv, count, type, n);
    if (block == 0) return host_.reduce_scatter_async(send, recv, count, type, op);
    Stage s(*this);
    uint8_t* h = s.input(send, block * static_cast<size_t>(n));
    uint8_t* mine = h + block * static_cast<size_t>(rank());
    s.output(recv, mine, block);
    return s.finish(host_.reduce_scatter_async(h, mine, count, type, op));  // (in place)
  }

  WorkPtr all_gather_async(const void* send, void* recv, int64_t count, CommType type) override {
    const int n = size();
    const size_t block = checked_collective_bytes("all_gather", send, recv, count, type, n);
    if (block == 0) return host_.all_gather_async(send, recv, count, type);
    Stage s(*this);
    uint8_t* h = s.buffer(block * static_cast<size_t>(n));
    uint8_t* mine = h + block * static_cast<size_t>(rank());
    copy_(mine, send, block);
    s.output(recv, h, block * static_cast<size_t>(n));
    return s.finish(host_.all_gather_async(mine, h, count, type));  // (in place)
  }

  WorkPtr broadcast_async(void* data, int64_t count, CommType type, int root) override {
    const size_t bytes = checked_collective_bytes("broadcast", data, data, count, type, 1);
    if (bytes == 0 || root < 0 || root >= size())
      return host_.broadcast_async(data, count, type, root);
    Stage s(*this);
    uint8_t* h = s.buffer(bytes);
    if (rank() == root) {
      copy_(h, data, bytes);
    } else {
      s.output(data, h, bytes);
    }
    return s.finish(host_.broadcast_async(h, count, type, root));
  }

  WorkPtr barrier_async() override { return host_.barrier_async(); }

  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, CommType type) override {
    const size_t n = static_cast<size_t>(size());
    const size_t block = checked_collective_bytes("all_to_all", send, recv, count, type, size());
    check_disjoint("all_to_all", send, block * n, recv, block * n);
    if (block == 0) return host_.all_to_all_async(send, recv, count, type);
    Stage s(*this);
    uint8_t* hs = s.input(send, block * n);
    uint8_t* hr = s.buffer(block * n);
    s.output(recv, hr, block * n);
    return s.finish(host_.all_to_all_async(hs, hr, count, type));
  }

  WorkPtr send_recv_async(const void* send, int dst, void* recv, int src, int64_t count,
                          CommType type) override {
    const size_t bytes = checked_send_recv_bytes(send, dst, recv, src, count, type, rank(), size());
    if (bytes == 0) return host_.send_recv_async(send, dst, recv, src, count, type);
    Stage s(*this);
    uint8_t* hs = dst == kNoPeer ? nullptr : s.input(send, bytes);
    uint8_t* hr = nullptr;
    if (src != kNoPeer) {
      hr = s.buffer(bytes);
      s.output(recv, hr, bytes);
    }
    return s.finish(host_.send_recv_async(hs, dst, hr, src, count, type));
  }

  WorkPtr send_async(const void* data, int64_t count, CommType type, int dst, int tag) override {
    P2POp op{P2POp::Kind::kSend, const_cast<void*>(data), count, type, dst, tag};
    const size_t bytes = checked_p2p_bytes(op, rank(), size());
    if (bytes == 0) return host_.send_async(data, count, type, dst, tag);
    Stage s(*this);
    uint8_t* h = s.input(data, bytes);
    return s.finish(host_.send_async(h, count, type, dst, tag));
  }

  WorkPtr recv_async(void* data, int64_t count, CommType type, int src, int tag) override {
    P2POp op{P2POp::Kind::kRecv, data, count, type, src, tag};
    const size_t bytes = checked_p2p_bytes(op, rank(), size());
    if (bytes == 0) return host_.recv_async(data, count, type, src, tag);
    Stage s(*this);
    uint8_t* h = s.buffer(bytes);
    s.output(data, h, bytes);
    return s.finish(host_.recv_async(h, count, type, src, tag));
  }

 private:
  // The staging of one operation: its host buffers and the outputs to copy back.
  class Stage {
   public:
    explicit Stage(StagedCommunicator& c) : c_(c) {}
    uint8_t* buffer(size_t bytes) {
      buffers_.push_back(std::make_unique<HostBuffer>(c_.pool_, bytes));
      return buffers_.back()->data();
    }
    // A host buffer holding a copy of `src` (device or host memory).
    uint8_t* input(const void* src, size_t bytes) {
      uint8_t* h = buffer(bytes);
      c_.copy_(h, src, bytes);
      return h;
    }
    void output(void* dst, const void* host, size_t bytes) { backs_.push_back({dst, host, bytes}); }
    WorkPtr finish(WorkPtr inner) {
      return std::make_shared<StagedWork>(std::move(inner), std::move(buffers_), std::move(backs_),
                                          c_.copy_);
    }

   private:
    StagedCommunicator& c_;
    std::vector<std::unique_ptr<HostBuffer>> buffers_;
    std::vector<CopyBack> backs_;
  };

  Communicator& host_;
  DeviceCopy copy_;
  std::shared_ptr<HostPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, DeviceCopy copy) {
  return std::make_unique<StagedCommunicator>(host, std::move(copy));
}

}  // namespace zerod
