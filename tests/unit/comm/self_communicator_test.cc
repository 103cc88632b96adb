// SelfCommunicator: a world of one; collectives complete at once, copy when not in place, and
// are numbered and reported like any other.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/peer_monitor.h"
#include "comm/self/self_communicator.h"
#include "core/error.h"

namespace zerod {
namespace {

TEST(SelfCommunicator, CollectivesCompleteAtOnceAndCopy) {
  auto monitor = std::make_shared<LocalPeerMonitor>(1);
  SelfCommunicator c(std::chrono::seconds(3), monitor);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_STREQ(c.backend(), "self");
  EXPECT_EQ(c.timeout(), std::chrono::seconds(3));

  std::vector<float> data = {1.5f, -2.0f, 3.0f};
  auto w = c.all_reduce_async(data.data(), 3, CommType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->sequence(), 1);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.0f}));

  std::vector<int64_t> send = {7, 8, 9}, recv(3, 0);
  c.reduce_scatter(send.data(), recv.data(), 3, CommType::kI64, ReduceOp::kMax);
  EXPECT_EQ(recv, send);
  std::vector<uint8_t> mine = {1, 2}, all(2, 0);
  c.all_gather(mine.data(), all.data(), 2, CommType::kU8);
  EXPECT_EQ(all, mine);
  c.all_gather(all.data(), all.data(), 2, CommType::kU8);  // in place
  EXPECT_EQ(all, mine);
  double d = 4.0;
  c.broadcast(&d, 1, CommType::kF64, 0);
  EXPECT_EQ(d, 4.0);
  c.barrier();
  c.all_reduce(nullptr, 0, CommType::kF32, ReduceOp::kSum);  // size 0
  EXPECT_EQ(c.sequence(), 7);
  EXPECT_EQ(monitor->snapshot()[0].started, 7);
  EXPECT_EQ(monitor->snapshot()[0].completed, 7);

  EXPECT_THROW(c.broadcast(&d, 1, CommType::kF64, 1), Error);
  EXPECT_THROW(c.all_reduce(&d, -1, CommType::kF64, ReduceOp::kSum), Error);
  EXPECT_THROW(c.all_gather(nullptr, &d, 1, CommType::kF64), Error);
  EXPECT_EQ(c.sequence(), 7) << "rejected calls take no sequence number";
}

TEST(SelfCommunicator, AllToAllAndSendRecvToItselfCopy) {
  auto monitor = std::make_shared<LocalPeerMonitor>(1);
  SelfCommunicator c(std::chrono::seconds(3), monitor);
  std::vector<int32_t> send = {4, 5, 6}, recv(3, 0);
  auto w = c.all_to_all_async(send.data(), recv.data(), 3, CommType::kI32);
  EXPECT_TRUE(w->done());
  EXPECT_EQ(w->sequence(), 1);
  EXPECT_EQ(recv, send);
  std::vector<float> a = {1.0f, 2.0f}, b(2, 0.0f);
  c.send_recv(a.data(), 0, b.data(), 0, 2, CommType::kF32);
  EXPECT_EQ(b, a);
  c.send_recv(nullptr, kNoPeer, nullptr, kNoPeer, 2, CommType::kF32);  // nothing moves
  c.all_to_all(nullptr, nullptr, 0, CommType::kF32);
  EXPECT_EQ(c.sequence(), 4);
  EXPECT_EQ(monitor->snapshot()[0].completed, 4);

  EXPECT_THROW(c.all_to_all(send.data(), send.data(), 3, CommType::kI32), Error);  // aliasing
  EXPECT_THROW(c.send_recv(a.data(), 1, b.data(), 0, 2, CommType::kF32), Error);
  EXPECT_THROW(c.send_recv(a.data(), 0, b.data(), kNoPeer, 2, CommType::kF32), Error);
  EXPECT_THROW(c.send_recv(a.data(), 0, a.data() + 1, 0, 1, CommType::kF64), Error);
  EXPECT_EQ(c.sequence(), 4) << "rejected calls take no sequence number";
}

TEST(SelfCommunicator, MovesBytesThroughTheGivenCopy) {
  std::vector<size_t> copied;
  SelfCommunicator c(std::chrono::seconds(3), nullptr,
                     [&](void* dst, const void* src, size_t bytes) {
                       copied.push_back(bytes);
                       std::memcpy(dst, src, bytes);
                     });
  std::vector<uint16_t> send = {1, 2, 3}, recv(3, 0);
  c.all_gather(send.data(), recv.data(), 3, CommType::kBF16);
  EXPECT_EQ(recv, send);
  c.reduce_scatter(send.data(), send.data(), 3, CommType::kF16, ReduceOp::kSum);  // in place
  EXPECT_EQ(copied, std::vector<size_t>{6}) << "one 2-byte x 3 copy; none in place";
  EXPECT_EQ(comm_type_size(CommType::kBF16), 2u);
  EXPECT_STREQ(comm_type_name(CommType::kF16), "f16");
}

}  // namespace
}  // namespace zerod
