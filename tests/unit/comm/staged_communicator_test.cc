// The staged communicator (comm/staged/): device tensors through a host communicator. "Device"
// memory here is host memory behind a non-canonical address (bit 62 set): any host access to it
// faults at once, so the only way in or out is the copy the communicator is given, exactly as
// with a GPU's memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/staged/staged_communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod {
namespace {

using test::make_world;
using test::run_ranks;

constexpr uintptr_t kDeviceBit = uintptr_t{1} << 62;

// A "device" view of host memory: the address with kDeviceBit set (faults when dereferenced).
template <class T>
T* device(std::vector<T>& v) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(v.data()) | kDeviceBit);
}
const void* real(const void* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) & ~kDeviceBit);
}

// The device copy: the only code that reads or writes "device" memory. Counts its calls.
struct Copier {
  int calls = 0;
  DeviceCopy fn() {
    return [this](void* dst, const void* src, size_t bytes) {
      ++calls;
      std::memmove(const_cast<void*>(real(dst)), real(src), bytes);
    };
  }
};

TEST(StagedCommunicator, CollectivesOnDeviceMemoryGiveTheHostResults) {
  constexpr int n = 3;
  constexpr size_t count = 1000;
  test::World w = make_world(n);
  run_ranks(n, [&](int r) {
    Copier copier;
    auto c = make_staged_communicator(*w.comms[static_cast<size_t>(r)], copier.fn());
    EXPECT_EQ(c->rank(), r);
    EXPECT_EQ(c->size(), n);

    // all-reduce, in place
    std::vector<float> a(count);
    for (size_t i = 0; i < count; ++i) a[i] = test::value<float>(r, i);
    const int64_t before = c->sequence();
    c->all_reduce(device(a), count, CommType::kF32, ReduceOp::kSum);
    EXPECT_EQ(c->sequence(), before + 1) << "the host communicator numbers it";
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(a[i], test::expected<float>(n, i, ReduceOp::kSum)) << i;

    // reduce-scatter, out of place and in place
    std::vector<int64_t> send(count * n), recv(count, -1);
    for (size_t i = 0; i < send.size(); ++i) send[i] = test::value<int64_t>(r, i);
    c->reduce_scatter(device(send), device(recv), count, CommType::kI64, ReduceOp::kMax);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[i], test::expected<int64_t>(n, r * count + i, ReduceOp::kMax)) << i;
    int64_t* mine = device(send) + r * count;
    c->reduce_scatter(device(send), mine, count, CommType::kI64, ReduceOp::kMax);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(send[r * count + i], recv[i]) << i;

    // all-gather, out of place and in place
    std::vector<uint8_t> part(count), all(count * n, 0);
    for (size_t i = 0; i < count; ++i) part[i] = test::value<uint8_t>(r, i);
    c->all_gather(device(part), device(all), count, CommType::kU8);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[q * count + i], test::value<uint8_t>(q, i));
    std::vector<uint8_t> inplace(count * n, 0);
    std::memcpy(inplace.data() + r * count, part.data(), count);
    c->all_gather(device(inplace) + r * count, device(inplace), count, CommType::kU8);
    EXPECT_EQ(inplace, all);

    // broadcast from rank 1: the root's buffer is left as it was
    std::vector<double> b(count, static_cast<double>(r));
    c->broadcast(device(b), count, CommType::kF64, 1);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], 1.0);

    // all-to-all: block q of rank r's send goes to rank q
    std::vector<int32_t> s2(count * n), r2(count * n, 0);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) s2[q * count + i] = r * 1000 + q * 100 + int32_t(i % 97);
    c->all_to_all(device(s2), device(r2), count, CommType::kI32);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(r2[q * count + i], q * 1000 + r * 100 + int32_t(i % 97));

    // a ring of send_recv, and the ends of a line (kNoPeer)
    std::vector<float> out(count, float(r)), in(count, -1.0f);
    c->send_recv(device(out), (r + 1) % n, device(in), (r + n - 1) % n, count, CommType::kF32);
    EXPECT_EQ(in[0], float((r + n - 1) % n));
    std::fill(in.begin(), in.end(), -1.0f);
    const int dst = r + 1 < n ? r + 1 : kNoPeer, src = r > 0 ? r - 1 : kNoPeer;
    c->send_recv(dst == kNoPeer ? nullptr : device(out), dst, src == kNoPeer ? nullptr : device(in),
                 src, count, CommType::kF32);
    EXPECT_EQ(in[count - 1], r > 0 ? float(r - 1) : -1.0f);

    c->barrier();
    c->all_reduce(nullptr, 0, CommType::kF32, ReduceOp::kSum);  // nothing to stage
    EXPECT_GT(copier.calls, 0);
  });
}

// 16-bit floats, which Gloo does not reduce: summed in fp32 and rounded once, the same bits on
// every rank; sums of values that bf16 cannot hold exactly.
TEST(StagedCommunicator, ReducesSixteenBitFloatsInFp32) {
  constexpr int n = 3;
  constexpr size_t count = 257;
  test::World w = make_world(n);
  auto x = [](int r, size_t i) { return 1.0f + 0.0078125f * float(r) + 0.001f * float(i % 13); };
  for (const CommType type : {CommType::kBF16, CommType::kF16}) {
    const bool bf = type == CommType::kBF16;
    auto to16 = [&](float f) { return bf ? f32_to_bf16_bits(f) : f32_to_f16_bits(f); };
    auto from16 = [&](uint16_t h) { return bf ? bf16_bits_to_f32(h) : f16_bits_to_f32(h); };
    run_ranks(n, [&](int r) {
      Copier copier;
      auto c = make_staged_communicator(*w.comms[static_cast<size_t>(r)], copier.fn());
      auto want = [&](size_t i) {
        float sum = 0.0f;
        for (int q = 0; q < n; ++q) sum += from16(to16(x(q, i)));
        return to16(sum);
      };
      std::vector<uint16_t> a(count);
      for (size_t i = 0; i < count; ++i) a[i] = to16(x(r, i));
      c->all_reduce(device(a), count, type, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(a[i], want(i)) << i;
      std::vector<uint16_t> send(count * n), recv(count, 0);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) send[q * count + i] = to16(x(r, q * count + i));
      c->reduce_scatter(device(send), device(recv), count, type, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[i], want(r * count + i)) << i;
    });
  }
}

TEST(StagedCommunicator, MessagesCopyBackOnlyWhenWaitedFor) {
  test::World w = make_world(2);
  run_ranks(2, [&](int r) {
    Copier copier;
    auto c = make_staged_communicator(*w.comms[static_cast<size_t>(r)], copier.fn());
    constexpr int64_t n = 4096;
    if (r == 0) {
      // Posted receives first (the pipeline's order), then a batch of sends.
      std::vector<float> x(n, 0.0f), y(n, 0.0f);
      WorkPtr rx = c->recv_async(device(x), n, CommType::kF32, 1, 7);
      WorkPtr ry = c->recv_async(device(y), n, CommType::kF32, 1, 8);
      c->barrier();  // rank 1 has sent both by now; neither is copied back before its wait
      EXPECT_EQ(x[0], 0.0f);
      rx->wait();
      EXPECT_EQ(x[0], 1.0f);
      EXPECT_EQ(x[n - 1], 1.0f);
      EXPECT_EQ(y[0], 0.0f) << "waiting for one message writes only its output";
      ry->wait();
      ry->wait();  // (again: nothing more happens)
      EXPECT_EQ(y[n - 1], 2.0f);
      std::vector<float> z(n, 3.0f);
      c->send(device(z), n, CommType::kF32, 1, 9);
    } else {
      std::vector<float> x(n, 1.0f), y(n, 2.0f), z(n, 0.0f);
      std::vector<P2POp> ops{{P2POp::Kind::kSend, device(x), n, CommType::kF32, 0, 7},
                             {P2POp::Kind::kSend, device(y), n, CommType::kF32, 0, 8}};
      WorkPtr sends = c->p2p_async(ops);
      // The inputs were copied when the calls were made: reusing them at once is safe.
      std::fill(x.begin(), x.end(), -5.0f);
      c->barrier();
      sends->wait();
      c->recv(device(z), n, CommType::kF32, 0, 9);
      EXPECT_EQ(z[n / 2], 3.0f);
    }
  });
}

TEST(StagedCommunicator, BadArgumentsAndFailuresAreTheHostCommunicators) {
  test::World w = make_world(2, std::chrono::milliseconds(3000));
  run_ranks(2, [&](int r) {
    Copier copier;
    auto c = make_staged_communicator(*w.comms[static_cast<size_t>(r)], copier.fn());
    const int64_t seq = c->sequence();
    // Caught before anything is copied (a null buffer would otherwise fault in the copy).
    EXPECT_THROW(c->all_reduce(nullptr, 4, CommType::kF32, ReduceOp::kSum), Error);
    EXPECT_THROW(c->all_gather(nullptr, nullptr, 4, CommType::kF32), Error);
    std::vector<float> v(8, 0.0f);
    EXPECT_THROW(c->all_to_all(device(v), device(v) + 1, 2, CommType::kF32), Error);
    EXPECT_THROW(c->send(device(v), 8, CommType::kF32, r, 0), Error) << "a send to itself";
    EXPECT_EQ(copier.calls, 0);
    EXPECT_EQ(c->sequence(), seq) << "rejected calls take no sequence number";
    // A receive whose message carries another tag: the host's error, and its output untouched.
    if (r == 0) {
      std::vector<float> other(8, 1.0f);
      c->send(device(other), 8, CommType::kF32, 1, 3);
    } else {
      try {
        c->recv(device(v), 8, CommType::kF32, 0, 4);
        ADD_FAILURE() << "a tag mismatch must fail the receive";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
        EXPECT_NE(std::string(e.what()).find("expects 32 bytes with tag 4"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(v[0], 0.0f) << "a failed receive writes nothing";
    }
  });
}

}  // namespace
}  // namespace zerod
