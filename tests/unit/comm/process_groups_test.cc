// ProcessGroups over Gloo (comm/process_groups.h, comm/gloo/gloo_groups.h), ranks as threads of
// this process on 127.0.0.1 and, in the last tests, as two processes over a FileStore: every
// group's collectives run among exactly its members, in the mesh's rank order; a group as large
// as the world is the world's communicator, one-rank groups are one SelfCommunicator, groups with
// the same members share a communicator; a member that goes away fails its group's peers
// promptly with an error naming the group and the global ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <set>

#include "comm/file_store.h"
#include "comm/gloo/gloo_groups.h"
#include "comm/group_monitor.h"
#include "comm/process_groups.h"
#include "comm/rank_names.h"
#include "tests/unit/comm/child_processes.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kOrder = {
    "tensor",   "context",           "data", "data x context", "tensor x context",
    "pipeline", "tensor x pipeline", "world"};

// The members of `rank`'s group along the axes flagged, computed here from the rank order of
// DESIGN.md section 8 (rank = ((pp x DP + dp) x CP + cp) x TP + tp), not from comm/mesh.h: every
// rank whose coordinates on the other axes equal `rank`'s.
struct Axes {
  bool tp = false, cp = false, dp = false, pp = false;
};

std::vector<int> expected_members(const MeshShape& s, int rank, Axes a) {
  auto coords = [&](int r) {
    const int tp = r % s.tensor;
    r /= s.tensor;
    const int cp = r % s.context;
    r /= s.context;
    return std::array<int, 4>{tp, cp, r % s.data, r / s.data};
  };
  const auto mine = coords(rank);
  const bool in_group[4] = {a.tp, a.cp, a.dp, a.pp};
  std::vector<int> out;
  for (int q = 0; q < s.world(); ++q) {
    const auto c = coords(q);
    bool same = true;
    for (int k = 0; k < 4; ++k) same = same && (in_group[k] || c[k] == mine[k]);
    if (same) out.push_back(q);
  }
  return out;
}

std::map<std::string, Axes> group_axes() {
  return {{"tensor", {.tp = true}},
          {"context", {.cp = true}},
          {"data", {.dp = true}},
          {"data x context", {.cp = true, .dp = true}},
          {"tensor x context", {.tp = true, .cp = true}},
          {"pipeline", {.pp = true}},
          {"tensor x pipeline", {.tp = true, .pp = true}},
          {"world", {true, true, true, true}}};
}

GlooOptions world_options(int rank, int size, std::shared_ptr<Store> store, Ms timeout,
                          std::shared_ptr<PeerMonitor> monitor) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::make_shared<PrefixStore>("world", std::move(store));
  o.bind_address = "127.0.0.1";
  o.timeout = timeout;
  o.monitor = std::move(monitor);
  return o;
}

// Checks one rank's groups against the mesh arithmetic above and runs, on every group in the
// build order, an all-reduce of (global rank + 1) x (i + 1) and an all-gather of the global
// ranks: the sums must be over exactly the expected members, and the gathered ranks must be the
// members in ascending order (group rank i is the i-th member).
void check_groups(const ProcessGroups& pg, const MeshShape& shape, int rank) {
  const auto axes = group_axes();
  ASSERT_EQ(pg.all().size(), kOrder.size());
  for (size_t k = 0; k < kOrder.size(); ++k) {
    const ProcessGroup& g = pg.all()[k];
    SCOPED_TRACE("rank " + std::to_string(rank) + ", group " + g.name());
    EXPECT_EQ(g.name(), kOrder[k]);
    const std::vector<int> want = expected_members(shape, rank, axes.at(g.name()));
    EXPECT_EQ(g.ranks(), want);
    EXPECT_EQ(g.size(), static_cast<int>(want.size()));
    const auto at = std::find(want.begin(), want.end(), rank);
    ASSERT_NE(at, want.end());
    EXPECT_EQ(g.rank(), static_cast<int>(at - want.begin()));
    EXPECT_EQ(g.comm().size(), g.size());
    EXPECT_EQ(g.comm().rank(), g.rank());
    EXPECT_EQ(g.describe(), (RankNames{g.name(), want}.describe_group()));

    std::vector<float> x(3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((rank + 1) * (i + 1));
    g.comm().all_reduce(x.data(), int64_t(x.size()), CommType::kF32, ReduceOp::kSum);
    int sum = 0;
    for (int q : want) sum += q + 1;
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], float(sum * int(i + 1))) << i;

    std::vector<int32_t> gathered(want.size(), -1);
    const int32_t me = rank;
    g.comm().all_gather(&me, gathered.data(), 1, CommType::kI32);
    EXPECT_EQ(std::vector<int>(gathered.begin(), gathered.end()), want);
  }
  // The accessors find the same groups.
  EXPECT_EQ(&pg.tensor(), &pg.all()[0]);
  EXPECT_EQ(&pg.context(), &pg.all()[1]);
  EXPECT_EQ(&pg.data(), &pg.all()[2]);
  EXPECT_EQ(&pg.zero(), &pg.all()[3]);
  EXPECT_EQ(&pg.group({MeshAxis::kContext, MeshAxis::kData}), &pg.all()[3]);
  EXPECT_EQ(&pg.model_parallel(), &pg.all()[4]);
  EXPECT_EQ(&pg.pipeline(), &pg.all()[5]);
  EXPECT_EQ(&pg.model_norm(), &pg.all()[6]);
  EXPECT_EQ(&pg.world(), &pg.all()[7]);
}

// Runs body(rank, groups, world communicator) on the `shape.world()` thread-ranks of a Gloo world
// with its process groups, then destroys them (each rank on its own thread).
template <class F>
void run_mesh(const MeshShape& shape, Ms timeout, F&& body) {
  auto store = std::make_shared<MemoryStore>();
  auto monitor = std::make_shared<LocalPeerMonitor>(shape.world());
  run_ranks(shape.world(), [&](int r) {
    const GlooOptions o = world_options(r, shape.world(), store, timeout, monitor);
    std::unique_ptr<Communicator> world = make_gloo_communicator(o);
    GlooGroupFactory factory(o);
    ProcessGroups pg(Mesh(shape), r, world.get(), &factory);
    body(r, pg, *world);
  });
}

TEST(ProcessGroups, TensorTwoByDataTwo) {
  const MeshShape shape{.data = 2, .tensor = 2};
  run_mesh(shape, Ms(10000), [&](int r, const ProcessGroups& pg, Communicator& world) {
    check_groups(pg, shape, r);
    // The world group is the world's communicator, not a new one.
    EXPECT_EQ(&pg.world().comm(), &world);
    EXPECT_TRUE(pg.world().is_world());
    EXPECT_FALSE(pg.tensor().is_world());
    // One-rank groups (context, pipeline) share one SelfCommunicator.
    EXPECT_STREQ(pg.context().comm().backend(), "self");
    EXPECT_EQ(&pg.context().comm(), &pg.pipeline().comm());
    // Same members, same communicator: dp x cp is dp, tp x cp is tp when cp is 1.
    EXPECT_EQ(&pg.zero().comm(), &pg.data().comm());
    EXPECT_EQ(pg.zero().key(), pg.data().key());
    EXPECT_EQ(&pg.model_parallel().comm(), &pg.tensor().comm());
    EXPECT_NE(&pg.tensor().comm(), &pg.data().comm());
    EXPECT_STREQ(pg.tensor().comm().backend(), "gloo");
    EXPECT_EQ(pg.made_by_factory(), 2);  // tensor and data
    EXPECT_EQ(pg.tensor().key(), fmt::format("tensor.{}", r - r % 2));
    EXPECT_EQ(pg.data().key(), fmt::format("data.{}", r % 2));
  });
}

TEST(ProcessGroups, TensorTwoByContextTwoByDataTwo) {
  const MeshShape shape{.data = 2, .context = 2, .tensor = 2};
  run_mesh(shape, Ms(10000), [&](int r, const ProcessGroups& pg, Communicator& world) {
    check_groups(pg, shape, r);
    EXPECT_EQ(&pg.world().comm(), &world);
    EXPECT_STREQ(pg.pipeline().comm().backend(), "self");
    // Five different sub-groups, five communicators.
    std::set<const Communicator*> distinct;
    for (const ProcessGroup& g : pg.all()) distinct.insert(&g.comm());
    EXPECT_EQ(distinct.size(), 7u);  // the five, self, world
    EXPECT_EQ(pg.made_by_factory(), 5);
    EXPECT_EQ(pg.zero().name(), "data x context");
    EXPECT_EQ(pg.zero().key(), fmt::format("data_x_context.{}", r % 2));
    EXPECT_EQ(pg.model_parallel().key(), fmt::format("tensor_x_context.{}", r - r % 4));
  });
}

TEST(ProcessGroups, PipelineTwoByDataTwoByTensorTwo) {
  const MeshShape shape{.pipeline = 2, .data = 2, .tensor = 2};
  run_mesh(shape, Ms(10000), [&](int r, const ProcessGroups& pg, Communicator&) {
    check_groups(pg, shape, r);
    // Pipeline outermost: rank r's next stage is r + 4; tensor x pipeline spans both.
    EXPECT_EQ(pg.pipeline().ranks(), (std::vector<int>{r % 4, r % 4 + 4}));
    EXPECT_EQ(pg.model_norm().size(), 4);
    EXPECT_NE(&pg.model_norm().comm(), &pg.tensor().comm());
  });
}

TEST(ProcessGroups, WithoutParallelismTheDataGroupIsTheWorld) {
  // Today's jobs: every rank in data. No sub-communicator is made (no factory is even given).
  const MeshShape shape{.data = 3};
  auto store = std::make_shared<MemoryStore>();
  run_ranks(3, [&](int r) {
    auto world = make_gloo_communicator(world_options(r, 3, store, Ms(10000), nullptr));
    ProcessGroups pg(Mesh(shape), r, world.get(), nullptr);
    for (const ProcessGroup* g : {&pg.data(), &pg.zero(), &pg.world()}) {
      EXPECT_EQ(&g->comm(), world.get()) << g->name();
      EXPECT_TRUE(g->is_world()) << g->name();
      EXPECT_EQ(g->rank(), r);
    }
    for (const ProcessGroup* g : {&pg.tensor(), &pg.context(), &pg.model_parallel()}) {
      EXPECT_STREQ(g->comm().backend(), "self") << g->name();
      EXPECT_EQ(&g->comm(), &pg.pipeline().comm()) << g->name();
    }
    EXPECT_EQ(pg.made_by_factory(), 0);
    float x = float(r + 1);
    pg.zero().comm().all_reduce(&x, 1, CommType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, 6.0f);
    x = float(r + 1);
    pg.model_parallel().comm().all_reduce(&x, 1, CommType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x, float(r + 1));
  });
}

TEST(ProcessGroups, AWorldOfOneWithoutACommunicator) {
  ProcessGroups pg(Mesh(MeshShape{}), 0, nullptr, nullptr);
  for (const ProcessGroup& g : pg.all()) {
    EXPECT_EQ(g.size(), 1) << g.name();
    EXPECT_EQ(g.ranks(), std::vector<int>{0}) << g.name();
    EXPECT_STREQ(g.comm().backend(), "self") << g.name();
    EXPECT_EQ(&g.comm(), &pg.world().comm()) << g.name();
  }
  double v[2] = {1.5, 2.5};
  pg.world().comm().all_reduce(v, 2, CommType::kF64, ReduceOp::kSum);
  EXPECT_EQ(v[1], 2.5);
}

TEST(ProcessGroups, RefusesAMeshThatIsNotTheWorldAndUnknownAxes) {
  auto is_internal = [](auto&& fn, const std::string& part) {
    try {
      fn();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
      return;
    }
    ADD_FAILURE() << "no error";
  };
  // A mesh of 2 ranks over a world of 1.
  is_internal([] { ProcessGroups pg(Mesh(MeshShape{.tensor = 2}), 0, nullptr, nullptr); },
              "the mesh");
  ProcessGroups pg(Mesh(MeshShape{}), 0, nullptr, nullptr);
  is_internal(
      [&] {
        pg.group({MeshAxis::kTensor, MeshAxis::kData});
      },
      "no process group along data x tensor");
}

// A factory that hands out SelfCommunicators of the wrong shape, to see ProcessGroups check it.
class WrongFactory : public SubCommunicatorFactory {
 public:
  std::unique_ptr<Communicator> make(const std::string& key, const std::string&,
                                     const std::vector<int>&, int) override {
    keys.push_back(key);
    return std::make_unique<SelfCommunicator>();
  }
  std::vector<std::string> keys;
};

TEST(ProcessGroups, ChecksWhatTheFactoryMakes) {
  // A world of 4 as a fake communicator: only size() and rank() are asked before the factory.
  struct FakeWorld : SelfCommunicator {
    int size() const override { return 4; }
    int rank() const override { return 1; }
  } world;
  WrongFactory factory;
  try {
    ProcessGroups pg(Mesh(MeshShape{.data = 2, .tensor = 2}), 1, &world, &factory);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "for group 'tensor' (global ranks 0, 1)")) << e.what();
  }
  EXPECT_EQ(factory.keys, std::vector<std::string>{"tensor.0"});
}

// tp2 x dp2: rank 3 leaves while rank 2, its tensor-group peer (group ranks 0 and 1 are global
// ranks 2 and 3), is in an all-reduce on the tensor group. Rank 2 must fail promptly (well
// before the timeout: the closed connections are noticed) with kPeerLost naming the operation,
// the group and its global ranks, and rank 3 by its global rank.
TEST(ProcessGroupsFailure, APeerThatLeavesFailsItsGroupNamingIt) {
  const MeshShape shape{.data = 2, .tensor = 2};
  const Ms timeout(3000);
  for (bool marked : {false, true}) {
    SCOPED_TRACE(marked ? "marked dead" : "gone silently");
    auto store = std::make_shared<MemoryStore>();
    auto monitor = std::make_shared<LocalPeerMonitor>(4);
    std::promise<void> in_collective, left;
    auto started = in_collective.get_future().share();
    auto gone = left.get_future().share();
    std::atomic<int64_t> left_at_ns{0};
    run_ranks(4, [&](int r) {
      const GlooOptions o = world_options(r, 4, store, timeout, monitor);
      auto world = make_gloo_communicator(o);
      GlooGroupFactory factory(o);
      auto pg = std::make_unique<ProcessGroups>(Mesh(shape), r, world.get(), &factory);
      std::vector<float> x(2000, 1.0f);
      pg->tensor().comm().all_reduce(x.data(), 2000, CommType::kF32, ReduceOp::kSum);  // #1
      if (r == 3) {
        started.wait();
        std::this_thread::sleep_for(Ms(50));  // rank 2 is inside all_reduce #2 now
        if (marked) monitor->mark_dead(3, "rank thread failed: boom");
        left_at_ns = Clock::now().time_since_epoch().count();
        pg.reset();  // its groups' communicators go away, then the world's
        world.reset();
        left.set_value();
        return;
      }
      if (r == 2) {
        WorkPtr w = pg->tensor().comm().all_reduce_async(x.data(), 2000, CommType::kF32,
                                                         ReduceOp::kSum);  // #2
        in_collective.set_value();
        const auto msg = peer_lost_message([&] { w->wait(); });
        const double ms = (Clock::now().time_since_epoch().count() - left_at_ns.load()) / 1e6;
        EXPECT_LT(ms, 2500.0) << msg;
        EXPECT_TRUE(contains(msg,
                             "all_reduce #2 (2000 x f32, sum) failed on rank 2 of group "
                             "'tensor' (global ranks 2, 3)"))
            << msg;
        EXPECT_TRUE(contains(msg, "timeout 3000 ms")) << msg;
        EXPECT_TRUE(contains(msg, "rank 3")) << msg;
        if (marked) {
          EXPECT_TRUE(contains(msg, "rank 3 is dead (rank thread failed: boom)")) << msg;
        } else {
          EXPECT_TRUE(contains(msg, "rank 3 finished collective #1 but did not join #2")) << msg;
        }
        EXPECT_FALSE(contains(msg, "rank 1 ")) << msg;  // never the group index of rank 3
        // The group is broken now; the other groups are not affected.
        const auto later = peer_lost_message([&] { pg->tensor().comm().barrier(); });
        EXPECT_TRUE(contains(later, "not started on rank 2 of group 'tensor'")) << later;
      }
      gone.wait();  // ranks 0 and 1 stay until rank 3 has left, then go
    });
  }
}

// A member that never comes to its group's creation: the others' creation fails at the timeout
// naming the group and the missing member by its global rank.
TEST(ProcessGroupsFailure, CreationNamesTheGroupAndTheMemberThatNeverJoined) {
  const Ms timeout(800);
  auto store = std::make_shared<MemoryStore>();
  // The world of 4 has connected, then rank 1 never builds its groups.
  std::vector<std::unique_ptr<Communicator>> worlds(4);
  std::vector<GlooOptions> opts(4);
  run_ranks(4, [&](int r) {
    opts[r] = world_options(r, 4, store, timeout, nullptr);
    worlds[r] = make_gloo_communicator(opts[r]);
  });
  run_ranks(4, [&](int r) {
    if (r == 1) return;
    GlooGroupFactory factory(opts[r]);
    const auto t0 = Clock::now();
    const auto msg = peer_lost_message([&] {
      ProcessGroups pg(Mesh(MeshShape{.data = 2, .tensor = 2}), r, worlds[r].get(), &factory);
    });
    if (r == 0) {  // its tensor group (0, 1) never completes
      EXPECT_TRUE(contains(msg,
                           "creating the Gloo communicator of group 'tensor' (global ranks "
                           "0, 1) on rank 0"))
          << msg;
      EXPECT_TRUE(contains(msg, "rank 1 never joined")) << msg;
    } else {  // ranks 2 and 3 made their tensor group; the data group of 3 waits for rank 1
      EXPECT_TRUE(contains(msg, "group 'data'")) << msg;
    }
    EXPECT_LT(ms_since(t0), 3.0 * timeout.count()) << msg;
  });
}

TEST(GroupPeerMonitor, SharesProgressPerGroupAndLivenessWithTheWorld) {
  auto world = std::make_shared<LocalPeerMonitor>(6);
  // Group "data.1" of global ranks 1, 3, 5; this process runs the members 3 and 5 only.
  GroupPeerMonitor a(world, "data.1", {1, 3, 5}, 1);
  GroupPeerMonitor b(world, "data.1", {1, 3, 5}, 2);
  GroupPeerMonitor other(world, "data.0", {0, 2, 4}, 1);
  a.on_start(1, 4);
  a.on_complete(1, 4);
  b.on_start(2, 3);
  other.on_start(1, 9);
  world->on_start(3, 100);  // the world's own sequence numbers stay apart
  const auto snap = a.snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_FALSE(snap[0].known);
  EXPECT_TRUE(snap[1].known && snap[2].known);
  EXPECT_EQ(snap[1].started, 4);
  EXPECT_EQ(snap[2].started, 3);
  EXPECT_EQ(snap[2].completed, 0);
  EXPECT_EQ(describe_missing_ranks(snap, 4, 1, a.global_ranks()),
            "rank 1 runs in another process: its progress is not known here; rank 5 is still in "
            "collective #3 (finished #0) and did not join #4");
  b.mark_dead(0, "node lost");  // group rank 0 is global rank 1
  EXPECT_FALSE(world->snapshot()[1].alive);
  const auto after = b.snapshot();
  EXPECT_FALSE(after[0].alive);
  EXPECT_EQ(after[0].reason, "node lost");
  EXPECT_EQ(other.snapshot()[1].started, 9);
  EXPECT_TRUE(other.snapshot()[0].alive);
}

TEST(RankNames, WorldAndGroupWording) {
  const RankNames world;
  EXPECT_EQ(world.rank_of(1, 4), "rank 1 of 4");
  EXPECT_EQ(world.rank(1), "rank 1");
  EXPECT_EQ(world.global(3), 3);
  const RankNames tp{"tensor", {4, 5}};
  EXPECT_EQ(tp.rank_of(1, 2), "rank 5 of group 'tensor' (global ranks 4, 5)");
  EXPECT_EQ(tp.global(0), 4);
  std::vector<int> many;
  for (int r = 0; r < 512; ++r) many.push_back(r * 8);
  EXPECT_EQ(describe_rank_list(many), "0, 8, 16, ..., 4088 (512 ranks)");
}

// ---- Two processes ----------------------------------------------------------------------------
// tp2 x dp2 as two processes of two thread-ranks each (process p runs global ranks 2p, 2p + 1),
// over a FileStore: tensor groups stay inside a process, data groups cross processes.

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The helper process. Skipped unless started by the tests below. Mode "check": every group's
// collectives are checked (check_groups); mode "loop": all-reduces on the data group until
// something fails. Writes "ok" or "error <exit code> <message>" under "result/<rank>".
TEST(ProcessGroupsHelper, DISABLED_Process) {
  if (env("ZEROD_PG_HELPER_PROCESS").empty()) GTEST_SKIP() << "only run by ProcessGroupsProcesses";
  const int process = std::stoi(env("ZEROD_PG_HELPER_PROCESS"));
  const std::string mode = env("ZEROD_PG_HELPER_MODE");
  const Ms timeout(std::stoi(env("ZEROD_PG_HELPER_TIMEOUT_MS")));
  auto store = std::make_shared<FileStore>(env("ZEROD_PG_HELPER_DIR"));
  const MeshShape shape{.data = 2, .tensor = 2};
  auto monitor = std::make_shared<LocalPeerMonitor>(4);  // knows this process's ranks only
  run_ranks(2, [&](int local) {
    const int r = 2 * process + local;
    std::string result = "ok";
    try {
      const GlooOptions o = world_options(r, 4, store, timeout, monitor);
      auto world = make_gloo_communicator(o);
      GlooGroupFactory factory(o);
      ProcessGroups pg(Mesh(shape), r, world.get(), &factory);
      if (mode == "check") {
        check_groups(pg, shape, r);
        if (::testing::Test::HasFailure()) result = "wrong values (see the log)";
      } else {
        std::vector<float> v(1024, 1.0f);
        const auto t0 = Clock::now();
        for (int64_t k = 0; ms_since(t0) < 60000; ++k) {
          pg.data().comm().all_reduce(v.data(), int64_t(v.size()), CommType::kF32, ReduceOp::kSum);
          if (k == 10) store->set("ready/" + std::to_string(r), {});
        }
      }
    } catch (const Error& e) {
      result = fmt::format("error {} {}", e.exit_code(), e.what());
    }
    store->set("result/" + std::to_string(r), Bytes(result.begin(), result.end()));
  });
}

pid_t spawn_process(ChildProcesses& procs, int process, const std::string& mode, int timeout_ms) {
  return procs.spawn("ProcessGroupsHelper.DISABLED_Process",
                     {"ZEROD_PG_HELPER_PROCESS=" + std::to_string(process),
                      "ZEROD_PG_HELPER_MODE=" + mode, "ZEROD_PG_HELPER_DIR=" + procs.dir(),
                      "ZEROD_PG_HELPER_TIMEOUT_MS=" + std::to_string(timeout_ms)},
                     std::to_string(process));
}

TEST(ProcessGroupsProcesses, GroupsAcrossTwoProcesses) {
  ChildProcesses procs;
  const pid_t a = spawn_process(procs, 0, "check", 20000);
  const pid_t b = spawn_process(procs, 1, "check", 20000);
  const int sa = procs.wait(a, Ms(30000));
  const int sb = procs.wait(b, Ms(30000));
  ASSERT_TRUE(sa != -1 && sb != -1) << "a helper process hung";
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "status " << sa;
  EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << "status " << sb;
  for (int r = 0; r < 4; ++r) EXPECT_EQ(procs.text("result/" + std::to_string(r)), "ok") << r;
}

TEST(ProcessGroupsProcesses, KillingOneProcessFailsTheDataGroupNamingIt) {
  const int timeout_ms = 10000;
  ChildProcesses procs;
  const pid_t a = spawn_process(procs, 0, "loop", timeout_ms);
  const pid_t b = spawn_process(procs, 1, "loop", timeout_ms);
  procs.store().wait({"ready/0", "ready/1", "ready/2", "ready/3"}, Ms(30000));
  ASSERT_EQ(::kill(b, SIGKILL), 0);
  const auto t0 = Clock::now();
  const int sa = procs.wait(a, Ms(2 * timeout_ms));
  const double ms = ms_since(t0);
  ASSERT_NE(sa, -1) << "the surviving process is still running after 2x the timeout";
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "status " << sa;
  EXPECT_LT(ms, 4000.0);  // the closed connections are noticed, not the timeout
  // Rank 0's data group is global ranks 0 and 2, rank 1's is 1 and 3 (both in process 1).
  for (int r = 0; r < 2; ++r) {
    const std::string result = procs.text("result/" + std::to_string(r));
    const int peer = r + 2;
    EXPECT_EQ(result.rfind("error 3 all_reduce #", 0), 0u) << result;
    EXPECT_TRUE(contains(
        result, fmt::format("on rank {} of group 'data' (global ranks {}, {})", r, r, peer)))
        << result;
    EXPECT_TRUE(contains(result, fmt::format("rank {} runs in another process", peer))) << result;
  }
  const int sb = procs.wait(b, Ms(1000));
  EXPECT_TRUE(WIFSIGNALED(sb) && WTERMSIG(sb) == SIGKILL) << "status " << sb;
}

}  // namespace
}  // namespace zerod::test
