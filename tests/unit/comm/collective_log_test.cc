// The collective log (comms_logger, flight recorder): the bytes and calls it counts are what
// the collectives were asked to move, for each operation kind, on every rank.
#include "comm/collective_log.h"

#include <gtest/gtest.h>

#include "tests/unit/comm/comm_test_util.h"

namespace zerod {
namespace {

using test::make_world;
using test::run_ranks;

TEST(CollectiveLog, CountsWhatEachCollectiveWasAskedToMove) {
  constexpr int n = 3;
  auto w = make_world(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    std::vector<float> a(1000, 1.0f);
    c.all_reduce(a.data(), 1000, CommType::kF32, ReduceOp::kSum);  // 4000 B
    c.all_reduce(a.data(), 10, CommType::kF32, ReduceOp::kMax);    // 40 B
    std::vector<int32_t> mine(100, r), all(300);
    c.all_gather(mine.data(), all.data(), 100, CommType::kI32);  // 3 x 400 B
    std::vector<double> send(150, 1.0), recv(50);
    c.reduce_scatter(send.data(), recv.data(), 50, CommType::kF64, ReduceOp::kSum);  // 1200 B
    std::vector<uint8_t> b(10, static_cast<uint8_t>(r));
    c.broadcast(b.data(), 10, CommType::kU8, 0);  // 10 B
    c.barrier();
    const auto totals = c.collective_log()->totals();
    EXPECT_EQ(totals.at("all_reduce").calls, 2);
    EXPECT_EQ(totals.at("all_reduce").bytes, 4040);
    EXPECT_EQ(totals.at("all_gather").bytes, 1200);
    EXPECT_EQ(totals.at("reduce_scatter").bytes, 1200);
    EXPECT_EQ(totals.at("broadcast").bytes, 10);
    EXPECT_EQ(totals.at("barrier").calls, 1);
    EXPECT_EQ(totals.at("barrier").bytes, 0);
    for (const auto& [op, t] : totals) EXPECT_GE(t.seconds, 0.0) << op;
    const auto rec = c.collective_log()->recent();
    ASSERT_EQ(rec.size(), 6u);
    for (size_t i = 0; i < rec.size(); ++i) {
      EXPECT_EQ(rec[i].seq, static_cast<int64_t>(i + 1));
      EXPECT_FALSE(rec[i].failed);
      EXPECT_GE(rec[i].ended, rec[i].started);
      EXPECT_GE(rec[i].started, rec[i].issued);
    }
    EXPECT_NE(c.collective_log()->describe_totals().find("all_gather"), std::string::npos);
  });
}

TEST(CollectiveLog, KeepsTheLastNAndComputesBusBandwidthFactors) {
  CollectiveLog log(4, 3);
  for (int64_t s = 1; s <= 5; ++s) {
    log.issued(s, "all_reduce", "x", 100);
    log.started(s);
    if (s < 5) log.ended(s, true);
  }
  const auto rec = log.recent();
  ASSERT_EQ(rec.size(), 3u);
  EXPECT_EQ(rec.front().seq, 3);
  EXPECT_LT(rec.back().ended, 0);  // #5 never finished
  EXPECT_NE(log.describe_recent(1).find("#5 all_reduce (x, 100 B)"), std::string::npos);
  EXPECT_NE(log.describe_recent(1).find("not finished"), std::string::npos);
  EXPECT_EQ(log.totals().at("all_reduce").calls, 4);
  EXPECT_DOUBLE_EQ(log.bus_factor("all_reduce"), 1.5);
  EXPECT_DOUBLE_EQ(log.bus_factor("all_gather"), 0.75);
  EXPECT_DOUBLE_EQ(log.bus_factor("broadcast"), 1.0);
  // Bytes sent by a rank (world 4): a ring all-reduce of 400 B sends 600 B, an all-to-all of
  // 400 B the 300 B for the other ranks, a "recv" nothing.
  EXPECT_DOUBLE_EQ(log.sent_bytes("all_reduce", 400), 600);
  EXPECT_DOUBLE_EQ(log.sent_bytes("all_to_all", 400), 300);
  EXPECT_DOUBLE_EQ(log.sent_bytes("send", 400), 400);
  EXPECT_DOUBLE_EQ(log.sent_bytes("recv", 400), 0);
  // Per step: 4 all-reduces of 100 B over 2 steps = 200 B/step, 300 B sent.
  const std::string per_step = log.describe_totals({"all_reduce"}, 2);
  EXPECT_NE(per_step.find("200 B/step, sent 300 B/step"), std::string::npos) << per_step;
}

}  // namespace
}  // namespace zerod
