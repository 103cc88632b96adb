#include "comm/staged/staged_communicator.h"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/dtype.h"
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

bool is_16bit_float(CommType t) {
  return t == CommType::kBF16 || t == CommType::kF16;
}

// n 16-bit floats of type t at `in` widened to fp32 at `out`, and back (rounded to nearest even).
void widen(float* out, const void* in, size_t n, CommType t) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  if (t == CommType::kBF16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(h[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(h[i]);
  }
}
void narrow(void* out, const float* in, size_t n, CommType t) {
  uint16_t* h = static_cast<uint16_t*>(out);
  if (t == CommType::kBF16) {
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16_bits(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16_bits(in[i]);
  }
}

// The host operation's Work, the staging buffers it uses, and the steps that write the outputs
// (copies back to device memory) on wait().
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::vector<std::unique_ptr<HostBuffer>> buffers,
             std::vector<std::function<void()>> outputs)
      : inner_(std::move(inner)), buffers_(std::move(buffers)), outputs_(std::move(outputs)) {}

  void wait() override {
    if (finished_) return;
    inner_->wait();  // (a failure propagates; nothing is written to the outputs)
    for (const auto& write : outputs_) write();
    finished_ = true;
    outputs_.clear();
    buffers_.clear();
  }
  bool done() const override { return finished_ || inner_->done(); }
  int64_t sequence() const override { return inner_->sequence(); }

 private:
  WorkPtr inner_;
  std::vector<std::unique_ptr<HostBuffer>> buffers_;
  std::vector<std::function<void()>> outputs_;
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
    if (is_16bit_float(type)) {  // (reduced in fp32: Gloo does not reduce 16-bit floats)
      float* f = s.widened(h, static_cast<size_t>(count), type);
      s.output_narrowed(data, h, f, static_cast<size_t>(count), type);
      return s.finish(host_.all_reduce_async(f, count, CommType::kF32, op));
    }
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
    if (is_16bit_float(type)) {  // (reduced in fp32, as all_reduce)
      const size_t c = static_cast<size_t>(count);
      float* f = s.widened(h, c * static_cast<size_t>(n), type);
      float* fmine = f + c * static_cast<size_t>(rank());
      s.output_narrowed(recv, h, fmine, c, type);
      return s.finish(host_.reduce_scatter_async(f, fmine, count, CommType::kF32, op));
    }
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
    // An fp32 host buffer holding the n 16-bit floats at `h` (host) widened.
    float* widened(const void* h, size_t n, CommType type) {
      float* f = reinterpret_cast<float*>(buffer(n * sizeof(float)));
      widen(f, h, n, type);
      return f;
    }
    // On wait(): `host` (bytes) copied to `dst`.
    void output(void* dst, const void* host, size_t bytes) {
      outputs_.push_back([copy = c_.copy_, dst, host, bytes] { copy(dst, host, bytes); });
    }
    // On wait(): the n fp32 at `f` rounded to 16-bit floats in `tmp` (host, 2n bytes), copied to
    // `dst`.
    void output_narrowed(void* dst, void* tmp, const float* f, size_t n, CommType type) {
      outputs_.push_back([copy = c_.copy_, dst, tmp, f, n, type] {
        narrow(tmp, f, n, type);
        copy(dst, tmp, n * 2);
      });
    }
    WorkPtr finish(WorkPtr inner) {
      return std::make_shared<StagedWork>(std::move(inner), std::move(buffers_),
                                          std::move(outputs_));
    }

   private:
    StagedCommunicator& c_;
    std::vector<std::unique_ptr<HostBuffer>> buffers_;
    std::vector<std::function<void()>> outputs_;
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
