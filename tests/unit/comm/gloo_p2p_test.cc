// Point-to-point messages of the Gloo backend (communicator.h: send_async / recv_async /
// p2p_async), ranks as threads of this process over a MemoryStore on 127.0.0.1: a chain of 2, 3
// and 4 stages passing activations forward and gradients back with every micro-batch in flight at
// once, receives posted before the matching sends, zero-size and 64 MB messages, messages on the
// pipeline group of a process mesh (local ranks), the collective log, argument checks, size and
// tag mismatches, a peer that never sends (the timeout, bounded), and peers that leave or die
// mid-receive (prompt, never the timeout).
#include <gtest/gtest.h>

#include <future>
#include <numeric>

#include "comm/collective_log.h"
#include "comm/gloo/gloo_groups.h"
#include "comm/mesh.h"
#include "comm/process_groups.h"
#include "comm/self/self_communicator.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn, which must throw Error of `kind`; returns its message.
template <class F>
std::string error_message(ErrorKind kind, F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

// Micro-batch m's activation leaving stage s (count elements): stage 0 makes it, each later
// stage adds its rank; the last stage's gradient is 2 x its input; each stage passes back the
// gradient it got plus its rank.
float activation(int s, int m, size_t i) {
  float x = static_cast<float>(m * 1000 + static_cast<int>(i % 97));
  for (int k = 1; k <= s; ++k) x += static_cast<float>(k);
  return x;
}

class GlooP2PChain : public ::testing::TestWithParam<int> {};

// GPipe-shaped: every stage posts all its receives for the M micro-batches first (several in
// flight per direction), then runs the forwards and the backwards in reverse micro-batch order;
// tags = micro-batch numbers.
TEST_P(GlooP2PChain, ActivationsForwardAndGradientsBackWithEveryMicroBatchInFlight) {
  const int P = GetParam();
  const int M = 6;
  const size_t count = 10007;
  World w = make_world(P, Ms(20000));
  run_ranks(P, [&](int s) {
    Communicator& c = *w.comms[s];
    std::vector<std::vector<float>> in(M, std::vector<float>(count, -1.f));
    std::vector<std::vector<float>> out(M, std::vector<float>(count));
    std::vector<std::vector<float>> grad_in(M, std::vector<float>(count, -1.f));
    std::vector<std::vector<float>> grad_out(M, std::vector<float>(count));
    std::vector<WorkPtr> recvs_fwd, recvs_bwd, sends;
    // Posted in the order the peers send them (matching is by order; the tags are checked):
    // activations 0..M-1, gradients M-1..0.
    std::vector<WorkPtr> recvs_bwd_by_mb(M);
    for (int m = 0; m < M; ++m) {
      if (s > 0) recvs_fwd.push_back(c.recv_async(in[m].data(), count, CommType::kF32, s - 1, m));
      const int b = M - 1 - m;
      if (s + 1 < P)
        recvs_bwd_by_mb[b] = c.recv_async(grad_in[b].data(), count, CommType::kF32, s + 1, b);
    }
    recvs_bwd = recvs_bwd_by_mb;
    for (int m = 0; m < M; ++m) {  // forward
      if (s > 0) recvs_fwd[m]->wait();
      for (size_t i = 0; i < count; ++i) {
        out[m][i] = s == 0 ? activation(0, m, i) : in[m][i] + static_cast<float>(s);
      }
      if (s + 1 < P) sends.push_back(c.send_async(out[m].data(), count, CommType::kF32, s + 1, m));
    }
    for (int m = M - 1; m >= 0; --m) {  // backward, last micro-batch first
      if (s + 1 < P) recvs_bwd[m]->wait();
      for (size_t i = 0; i < count; ++i) {
        grad_out[m][i] = s + 1 == P ? 2.f * out[m][i] : grad_in[m][i] + static_cast<float>(s);
      }
      if (s > 0) sends.push_back(c.send_async(grad_out[m].data(), count, CommType::kF32, s - 1, m));
    }
    for (auto& x : sends) x->wait();
    for (int m = 0; m < M; ++m) {
      for (size_t i = 0; i < count; i += 101) {
        if (s > 0) ASSERT_EQ(in[m][i], activation(s - 1, m, i)) << "stage " << s << " mb " << m;
        float g = 2.f * activation(P - 1, m, i);
        for (int k = P - 2; k >= s; --k) g += static_cast<float>(k);
        if (s + 1 < P) ASSERT_EQ(grad_out[m][i], g) << "stage " << s << " mb " << m << " i " << i;
      }
    }
    // Messages take no sequence number (their works' are their negative log ids): a collective
    // after them is #1 on every rank.
    for (auto& x : sends) EXPECT_LT(x->sequence(), 0);
    EXPECT_EQ(c.sequence(), 0);
    float one = 1.f;
    c.all_reduce(&one, 1, CommType::kF32, ReduceOp::kSum);
    EXPECT_EQ(one, static_cast<float>(P));
    EXPECT_EQ(c.sequence(), 1);
    // The log counts each message on its rank, by kind.
    const auto totals = c.collective_log()->totals();
    const int64_t msgs = (s > 0 ? M : 0) + (s + 1 < P ? M : 0);
    const auto bytes = static_cast<int64_t>(count * sizeof(float));
    ASSERT_TRUE(totals.count("send")) << "stage " << s;
    ASSERT_TRUE(totals.count("recv")) << "stage " << s;
    EXPECT_EQ(totals.at("send").calls, msgs);
    EXPECT_EQ(totals.at("send").bytes, msgs * bytes);
    EXPECT_EQ(totals.at("recv").bytes, msgs * bytes);
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, GlooP2PChain, ::testing::Values(2, 3, 4));

// 1F1B's steady state: stage 0 issues its send of activation k+1 and then its receive of
// gradient k, stage 1 the other way round, and each waits for its send first: no deadlock, because
// a message is posted at issue, not queued behind the rank's other messages or collectives. (A
// send is done only once the peer posted its receive, as with NCCL: waiting for a send before
// posting the receive the peer waits for first would deadlock on any backend.)
TEST(GlooP2P, OppositeIssueOrdersOnTwoRanksDoNotDeadlock) {
  World w = make_world(2, Ms(10000));
  const size_t count = 1 << 18;  // 1 MB: larger than the socket buffers
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    std::vector<float> mine(count, static_cast<float>(r + 1)), theirs(count, 0.f);
    for (int k = 0; k < 4; ++k) {
      WorkPtr s, q;
      if (r == 0) {
        s = c.send_async(mine.data(), count, CommType::kF32, 1, k);
        q = c.recv_async(theirs.data(), count, CommType::kF32, 1, k);
      } else {
        q = c.recv_async(theirs.data(), count, CommType::kF32, 0, k);
        s = c.send_async(mine.data(), count, CommType::kF32, 0, k);
      }
      s->wait();
      q->wait();
      EXPECT_EQ(theirs[count - 1], static_cast<float>(2 - r));
    }
  });
}

TEST(GlooP2P, BatchZeroSizeAndSixtyFourMegabyteMessages) {
  World w = make_world(2, Ms(30000));
  const size_t big = size_t{16} << 20;  // 16 Mi floats = 64 MiB
  std::vector<double> seconds(2);
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    // Zero-size messages still travel (and are checked) in order with the others.
    std::vector<int32_t> small(3, r == 0 ? 7 : 0);
    if (r == 0) {
      c.p2p_async({P2POp{P2POp::Kind::kSend, nullptr, 0, CommType::kF32, 1, 11},
                   P2POp{P2POp::Kind::kSend, small.data(), 3, CommType::kI32, 1, 12}})
          ->wait();
    } else {
      c.p2p_async({P2POp{P2POp::Kind::kRecv, nullptr, 0, CommType::kF32, 0, 11},
                   P2POp{P2POp::Kind::kRecv, small.data(), 3, CommType::kI32, 0, 12}})
          ->wait();
      EXPECT_EQ(small, std::vector<int32_t>(3, 7));
    }
    // done() turns true without a wait (the reaper of the direction saw it complete).
    double flag = r == 0 ? 2.5 : 0.0;
    WorkPtr one = r == 0 ? c.send_async(&flag, 1, CommType::kF64, 1, 13)
                         : c.recv_async(&flag, 1, CommType::kF64, 0, 13);
    const auto polled = Clock::now();
    while (!one->done() && ms_since(polled) < 5000) std::this_thread::sleep_for(Ms(1));
    EXPECT_TRUE(one->done()) << "rank " << r;
    one->wait();
    EXPECT_EQ(flag, 2.5);
    std::vector<float> x(big);
    if (r == 0) std::iota(x.begin(), x.end(), 0.f);
    c.barrier();
    const auto t0 = Clock::now();
    if (r == 0) {
      c.send(x.data(), static_cast<int64_t>(big), CommType::kF32, 1, 0);
    } else {
      c.recv(x.data(), static_cast<int64_t>(big), CommType::kF32, 0, 0);
    }
    seconds[r] = ms_since(t0) / 1e3;
    if (r == 1) {
      for (size_t i = 0; i < big; i += 4099) ASSERT_EQ(x[i], static_cast<float>(i));
      ASSERT_EQ(x[big - 1], static_cast<float>(big - 1));
    }
  });
  std::printf("64 MiB message over 127.0.0.1: %.3f s at the receiver, %.2f GB/s\n", seconds[1],
              (64 << 20) / seconds[1] / 1e9);
}

// Runs body(global rank, its process groups) on 4 thread-ranks of a Gloo world of pipeline 2 x
// data 2 (pipeline groups {0, 2} and {1, 3}), with `timeout`.
template <class F>
void run_pipeline_by_data(Ms timeout, F&& body) {
  auto store = std::make_shared<MemoryStore>();
  auto monitor = std::make_shared<LocalPeerMonitor>(4);
  run_ranks(4, [&](int r) {
    GlooOptions o;
    o.rank = r;
    o.size = 4;
    o.store = std::make_shared<PrefixStore>("world", store);
    o.timeout = timeout;
    o.monitor = monitor;
    auto world = make_gloo_communicator(o);
    GlooGroupFactory factory(o);
    ProcessGroups pg(Mesh(MeshShape{.pipeline = 2, .data = 2}), r, world.get(), &factory);
    body(r, pg);
  });
}

TEST(GlooP2P, MessagesOnThePipelineGroupUseItsLocalRanks) {
  run_pipeline_by_data(Ms(10000), [&](int r, const ProcessGroups& pg) {
    Communicator& pipe = pg.pipeline().comm();
    ASSERT_EQ(pipe.size(), 2);
    const int stage = pipe.rank();
    EXPECT_EQ(stage, r / 2);
    std::vector<int64_t> x(5, r);
    if (stage == 0) {
      pipe.send(x.data(), 5, CommType::kI64, 1, 3);
    } else {
      pipe.recv(x.data(), 5, CommType::kI64, 0, 3);
      EXPECT_EQ(x, std::vector<int64_t>(5, r - 2));  // from global rank r - 2
    }
    const auto rec = pipe.collective_log()->recent();
    ASSERT_FALSE(rec.empty());
    EXPECT_EQ(rec.back().op, stage == 0 ? "send" : "recv");
    EXPECT_TRUE(contains(rec.back().detail, stage == 0 ? fmt::format("to rank {}", r + 2)
                                                       : fmt::format("from rank {}", r - 2)))
        << rec.back().detail;
    EXPECT_TRUE(contains(pg.pipeline().comm().collective_log()->describe_recent(4), "tag 3"));
  });
}

// A message on a sub-group that times out names the group, the peer by its global and group
// ranks, the tag and the bytes; the world and the other pipeline group are untouched.
TEST(GlooP2P, ATimeoutOnThePipelineGroupNamesTheGroupAndThePeer) {
  std::promise<void> failed;
  std::shared_future<void> failed_f = failed.get_future().share();
  run_pipeline_by_data(Ms(1000), [&](int r, const ProcessGroups& pg) {
    Communicator& pipe = pg.pipeline().comm();
    float x[4] = {};
    if (r == 0) {
      const std::string msg = peer_lost_message([&] { pipe.recv(x, 4, CommType::kF32, 1, 2); });
      failed.set_value();
      EXPECT_TRUE(contains(msg,
                           "recv #1 from rank 2 (group rank 1) (tag 2, 4 x f32, 16 bytes) "
                           "failed on rank 0 of group 'pipeline' (global ranks 0, 2) after"))
          << msg;
      EXPECT_TRUE(contains(msg, "timed out")) << msg;
    } else {
      failed_f.wait();
    }
    if (r == 1) pipe.send(x, 4, CommType::kF32, 1, 0);  // the other pipeline group still works
    if (r == 3) pipe.recv(x, 4, CommType::kF32, 0, 0);
  });
}

TEST(GlooP2P, BadArgumentsThrowAtTheCall) {
  World w = make_world(2, Ms(10000));
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    float x[4] = {};
    auto internal = [&](auto fn, const char* part) {
      const std::string msg = error_message(ErrorKind::kInternal, fn);
      EXPECT_TRUE(contains(msg, part)) << msg;
    };
    internal([&] { c.send(x, 4, CommType::kF32, r, 0); }, "names itself as its peer");
    internal([&] { c.recv(x, 4, CommType::kF32, 2, 0); }, "peer rank 2 outside a communicator");
    internal([&] { c.send(x, 4, CommType::kF32, 1 - r, -1); }, "negative tag -1");
    internal([&] { c.recv(nullptr, 4, CommType::kF32, 1 - r, 0); }, "null buffer");
    internal([&] { c.send(x, -2, CommType::kF32, 1 - r, 0); }, "negative count");
    // Nothing was posted: a message after the refused ones is the first of its direction.
    if (r == 0) c.send(x, 4, CommType::kF32, 1, 0);
    if (r == 1) c.recv(x, 4, CommType::kF32, 0, 0);
  });
  SelfCommunicator self;
  float y = 0;
  EXPECT_THROW(self.send(&y, 1, CommType::kF32, 0, 0), Error);
  EXPECT_THROW(self.recv(&y, 1, CommType::kF32, 0, 0), Error);
  EXPECT_EQ(self.sequence(), 0);
}

TEST(GlooP2P, SizeOrTagMismatchFailsTheReceiverClearlyAndTheSenderPromptly) {
  for (const bool size_differs : {true, false}) {
    World w = make_world(2, Ms(20000));
    run_ranks(2, [&](int r) {
      Communicator& c = *w.comms[r];
      std::vector<float> x(16, 1.f);
      const auto t0 = Clock::now();
      if (r == 0 && size_differs) {  // the payload never matches: the send fails
        const std::string msg =
            peer_lost_message([&] { c.send(x.data(), 16, CommType::kF32, 1, 4); });
        EXPECT_TRUE(contains(msg, "send #1 to rank 1 (tag 4, 16 x f32, 64 bytes) failed on rank 0"))
            << msg;
        EXPECT_LT(ms_since(t0), 5000.0) << msg;
      } else if (r == 0) {  // the same size: the bytes were delivered before the check failed
        c.send(x.data(), 16, CommType::kF32, 1, 4);
      } else {
        const std::string msg = error_message(ErrorKind::kInternal, [&] {
          c.recv(x.data(), size_differs ? 8 : 16, CommType::kF32, 0, size_differs ? 4 : 5);
        });
        EXPECT_TRUE(contains(msg, size_differs ? "the peer sent 64 bytes with tag 4 as its message "
                                                 "#1 in this direction, this receive expects 32 "
                                                 "bytes with tag 4"
                                               : "the peer sent 64 bytes with tag 4 as its message "
                                                 "#1 in this direction, this receive expects 64 "
                                                 "bytes with tag 5"))
            << msg;
        EXPECT_LT(ms_since(t0), 5000.0) << msg;
      }
    });
  }
}

TEST(GlooP2P, APeerThatNeverSendsTimesOutNamingPeerTagAndBytes) {
  World w = make_world(2, Ms(1000));
  std::promise<void> failed;
  std::shared_future<void> failed_f = failed.get_future().share();
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    if (r == 1) {  // alive, but sends nothing
      failed_f.wait();
      return;
    }
    std::vector<double> x(32);
    const auto t0 = Clock::now();
    const std::string msg = peer_lost_message([&] { c.recv(x.data(), 32, CommType::kF64, 1, 9); });
    const double ms = ms_since(t0);
    failed.set_value();
    EXPECT_TRUE(contains(msg,
                         "recv #1 from rank 1 (tag 9, 32 x f64, 256 bytes) failed on rank 0 "
                         "of 2 after"))
        << msg;
    EXPECT_TRUE(contains(msg, "(timeout 1000 ms): timed out: the peer sent no matching message"))
        << msg;
    EXPECT_GE(ms, 950.0) << msg;
    EXPECT_LT(ms, 2500.0) << msg;
    // The communicator is broken: later calls throw at once.
    const std::string later =
        peer_lost_message([&] { c.send(x.data(), 32, CommType::kF64, 1, 0); });
    EXPECT_TRUE(contains(later,
                         "send to rank 1 (tag 0, 32 x f64, 256 bytes) not started on rank "
                         "0: the communicator failed earlier"))
        << later;
  });
}

// Stage 2 of a chain of 3 dies (marked dead, communicator destroyed) while stage 1 waits for its
// gradient and stage 0 waits for stage 1's: both fail promptly naming the dead rank, long before
// the 20 s timeout.
TEST(GlooP2P, ADeadStageFailsTheWholeChainPromptly) {
  World w = make_world(3, Ms(20000));
  std::promise<void> waiting;
  std::shared_future<void> waiting_f = waiting.get_future().share();
  std::atomic<int> posted{0};
  run_ranks(3, [&](int r) {
    Communicator& c = *w.comms[r];
    std::vector<float> g(1000);
    if (r == 2) {
      waiting_f.wait();
      std::this_thread::sleep_for(Ms(100));
      w.monitor->mark_dead(2, "rank thread failed: boom");
      w.comms[2].reset();
      return;
    }
    WorkPtr recv = c.recv_async(g.data(), 1000, CommType::kF32, r + 1, 0);
    if (++posted == 2) waiting.set_value();
    const auto t0 = Clock::now();
    const std::string msg = peer_lost_message([&] { recv->wait(); });
    EXPECT_LT(ms_since(t0), 4000.0) << msg;
    EXPECT_TRUE(contains(msg, fmt::format("recv #1 from rank {} (tag 0, 1000 x f32, 4000 bytes) "
                                          "failed on rank {} of 3",
                                          r + 1, r)))
        << msg;
    if (r == 0) {
      EXPECT_TRUE(contains(msg, "rank 2 is dead (rank thread failed: boom)")) << msg;
    }
  });
}

}  // namespace
}  // namespace zerod::test
