// Point-to-point messages of the NCCL backend (send_async / recv_async / p2p_async: ncclSend /
// ncclRecv in one group per call): a world of one refuses them (needs 1 GPU); with 2-4 ranks as
// threads, one GPU each (needs >= 2 GPUs), a chain relays every micro-batch's activation to the
// last stage and its gradient back with several in flight, a batched send + receive between two
// neighbours (1F1B's exchange), the log's "send" / "recv" bytes, and a receive whose peer never
// sends times out naming the peer and the tag. Skips without GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>

#include "comm/collective_log.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

TEST(NcclP2P, WorldOfOneRefusesMessagesWithoutASequenceNumber) {
  ZD_NEED_GPUS(1);
  auto comm =
      make_nccl_communicator(nccl_options(0, 1, std::make_shared<MemoryStore>(), Ms(30000), "one"));
  DeviceVec<float> x(0, 8);
  EXPECT_THROW(comm->send(x.data(), 8, CommType::kF32, 0, 0), Error);
  EXPECT_THROW(comm->recv(x.data(), 8, CommType::kF32, 1, 0), Error);
  EXPECT_EQ(comm->sequence(), 0);
}

TEST(NcclP2P, ChainRelaysActivationsForwardAndGradientsBack) {
  ZD_NEED_GPUS(2);
  const int P = std::min(gpus(), 4);
  const int M = 4;
  const size_t count = 100003;
  NcclWorld nccl = make_nccl_world(P);
  run_ranks(P, [&](int s) {
    Communicator& c = *nccl.comms[s];
    std::vector<std::unique_ptr<DeviceVec<float>>> act, grad;
    for (int m = 0; m < M; ++m) {
      act.push_back(std::make_unique<DeviceVec<float>>(s, values<float>(m, count)));
      grad.push_back(std::make_unique<DeviceVec<float>>(s, count));
    }
    std::vector<WorkPtr> works;
    for (int m = 0; m < M; ++m) {  // forward: stage 0's activations relayed to the last stage
      if (s > 0) works.push_back(c.recv_async(act[m]->data(), count, CommType::kF32, s - 1, m));
      if (s + 1 < P) works.push_back(c.send_async(act[m]->data(), count, CommType::kF32, s + 1, m));
    }
    for (int m = M - 1; m >= 0; --m) {  // backward: the last stage returns them as gradients
      if (s + 1 == P) {
        works.push_back(c.send_async(act[m]->data(), count, CommType::kF32, s - 1, m));
      } else {
        works.push_back(c.recv_async(grad[m]->data(), count, CommType::kF32, s + 1, m));
        if (s > 0) works.push_back(c.send_async(grad[m]->data(), count, CommType::kF32, s - 1, m));
      }
    }
    for (auto& w : works) w->wait();
    for (int m = 0; m < M; ++m) {
      EXPECT_EQ(act[m]->download(), values<float>(m, count)) << "stage " << s << " mb " << m;
      if (s + 1 < P) {
        EXPECT_EQ(grad[m]->download(), values<float>(m, count)) << "stage " << s << " mb " << m;
      }
    }
    EXPECT_EQ(c.sequence(), 0) << "messages take no sequence number";
    for (auto& w : works) EXPECT_LT(w->sequence(), 0);
    const auto totals = c.collective_log()->totals();
    const auto bytes = static_cast<int64_t>(count * sizeof(float));
    const int64_t sends = (s + 1 < P ? M : 0) + (s > 0 ? M : 0);
    ASSERT_TRUE(totals.count("send"));
    EXPECT_EQ(totals.at("send").bytes, sends * bytes);
  });
}

TEST(NcclP2P, BatchedSendAndReceiveBetweenNeighbours) {
  ZD_NEED_GPUS(2);
  NcclWorld nccl = make_nccl_world(2);
  run_ranks(2, [&](int r) {
    const size_t count = 1 << 20;
    DeviceVec<float> mine(r, values<float>(r, count)), theirs(r, count);
    for (int k = 0; k < 3; ++k) {
      nccl.comms[r]
          ->p2p_async(
              {P2POp{P2POp::Kind::kSend, mine.data(), int64_t(count), CommType::kF32, 1 - r, k},
               P2POp{P2POp::Kind::kRecv, theirs.data(), int64_t(count), CommType::kF32, 1 - r, k}})
          ->wait();
      EXPECT_EQ(theirs.download(), values<float>(1 - r, count)) << "rank " << r << " round " << k;
    }
    EXPECT_EQ(nccl.comms[r]->collective_log()->recent().back().op, "p2p");
  });
}

TEST(NcclP2P, AReceiveWhosePeerNeverSendsTimesOutNamingPeerAndTag) {
  ZD_NEED_GPUS(2);
  NcclWorld nccl = make_nccl_world(2, Ms(2000));
  std::promise<void> failed;
  std::shared_future<void> failed_f = failed.get_future().share();
  run_ranks(2, [&](int r) {
    if (r == 1) {
      failed_f.wait();
      return;
    }
    DeviceVec<float> x(0, 16);
    const std::string msg =
        peer_lost_message([&] { nccl.comms[0]->recv(x.data(), 16, CommType::kF32, 1, 9); });
    failed.set_value();
    EXPECT_TRUE(contains(msg, "recv #1 (recv 16 x f32 from rank 1, tag 9) failed on rank 0 of 2"))
        << msg;
    EXPECT_TRUE(contains(msg, "(timeout 2000 ms)")) << msg;
  });
}

}  // namespace
}  // namespace zerod::test
