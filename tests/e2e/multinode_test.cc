// Real zerod processes on 127.0.0.1: two nodes reproduce one process of the same world size,
// a killed node makes the survivor exit 3 naming the lost rank, a node that never joins fails
// the rendezvous after its timeout, and bad launches end with a clear error, never a hang.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/data/corpus.h"
#include "process_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::free_port;
using testing::Process;
using testing::zerod_binary;
using namespace std::chrono_literals;

class MultiNode : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef ZEROD_HAVE_GRPC
    GTEST_SKIP() << "built without gRPC: multi-node training is refused (MultiNodeWithoutGrpc)";
#endif
    dir_ = fs::temp_directory_path() /
           ("zerod_multinode_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    while (text.size() < 40000) text += "two nodes train one model over loopback. ";
    write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                      (dir_ / "data").string(), 0.1, 1 << 20, "m");
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }

  void write_job(const std::string& name, int steps, const std::string& extra = "",
                 double lr = 3e-3, int layers = 1, int micro_batch = 4) {
    std::ofstream(dir_ / name) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": )"
                               << micro_batch << R"(,
      "optimizer": {"type": "AdamW", "params": {"lr": )"
                               << lr << R"(}},
      "zero_optimization": {"stage": 2},
      "steps_per_print": 1,
      "csv_monitor": {"enabled": true, "output_path": "runs", "job_name": ")"
                               << name << R"("},
      "model": {"n_layer": )" << layers
                               << R"(, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/m_train_*.bin"},
      "train": {"steps": )" << steps
                               << extra << "}}";
  }
  std::unique_ptr<Process> start(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {zerod_binary()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = std::make_unique<Process>(argv, dir_.string(), (dir_ / log).string());
    EXPECT_TRUE(p->started());
    return p;
  }
  std::vector<std::string> losses(const std::string& job) {
    std::ifstream in(dir_ / "runs" / job / "metrics.csv");
    std::vector<std::string> out;
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line))
      out.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
    return out;
  }
  static std::vector<std::string> node_args(const std::string& job, int nnodes, int node_rank,
                                            int port) {
    std::vector<std::string> a = {"train",    job,
                                  "--nnodes", std::to_string(nnodes),
                                  "--master", "127.0.0.1:" + std::to_string(port)};
    if (node_rank >= 0) {
      a.push_back("--node-rank");
      a.push_back(std::to_string(node_rank));
    }
    return a;
  }

  fs::path dir_;
};

TEST_F(MultiNode, TwoProcessesReproduceOneProcessOfTheSameWorldSize) {
  write_job("one.json", 12);
  auto single = start({"train", "one.json", "--nproc-per-node", "2"}, "single.log");
  ASSERT_EQ(single->wait_for(120s), 0) << single->output();
  const auto want = losses("one.json");
  ASSERT_EQ(want.size(), 12u);

  for (int assigned : {0, 1}) {  // explicit node ranks, then ranks assigned at join
    const std::string job = assigned ? "assigned.json" : "two.json";
    write_job(job, 12);
    const int port = free_port();
    auto n0 = start(node_args(job, 2, assigned ? -1 : 0, port), job + ".n0.log");
    auto n1 = start(node_args(job, 2, assigned ? -1 : 1, port), job + ".n1.log");
    ASSERT_EQ(n0->wait_for(120s), 0) << n0->output();
    ASSERT_EQ(n1->wait_for(120s), 0) << n1->output();
    // Rank 0 (whichever process runs it) writes the metrics, with the same losses bit for bit.
    EXPECT_EQ(losses(job), want) << n0->output() << n1->output();
    // Step lines come from rank 0 only.
    const std::string out = n0->output() + n1->output();
    EXPECT_EQ(out.find("[rank 1] step "), std::string::npos) << out;
    EXPECT_NE(out.find("[rank 0] step 12/12"), std::string::npos) << out;
  }
}

// --token-file on a job of several nodes: node 0's Rendezvous service wants the token, so a node
// without it is refused (exit 2, saying so) and one with it joins; a job of one node without
// --listen has nothing for the token to guard (exit 2).
TEST_F(MultiNode, ATokenFileGuardsTheRendezvous) {
  std::ofstream(dir_ / "token") << "0123456789abcdef0123\n";
  fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
  write_job("tok.json", 4);
  const int port = free_port();
  auto with_token = [&](int node) {
    std::vector<std::string> a = node_args("tok.json", 2, node, port);
    a.insert(a.end(), {"--token-file", "token"});
    return a;
  };
  auto n0 = start(with_token(0), "tok.n0.log");
  auto stranger = start(node_args("tok.json", 2, 1, port), "tok.stranger.log");
  EXPECT_EQ(stranger->wait_for(60s), 2) << stranger->output();
  EXPECT_NE(stranger->output().find("every node needs the same --token-file"), std::string::npos)
      << stranger->output();
  auto n1 = start(with_token(1), "tok.n1.log");
  EXPECT_EQ(n1->wait_for(120s), 0) << n1->output();
  EXPECT_EQ(n0->wait_for(120s), 0) << n0->output();
  EXPECT_EQ(losses("tok.json").size(), 4u) << n0->output();
  auto alone = start({"train", "tok.json", "--token-file", "token"}, "tok.alone.log");
  EXPECT_EQ(alone->wait_for(30s), 2) << alone->output();
  EXPECT_NE(alone->output().find("this job has neither"), std::string::npos) << alone->output();
}

// Tensor parallelism across processes: two nodes of two ranks each run T = 2 x DP = 2, so the
// tensor groups live inside a node and the data groups ({0, 2}, {1, 3}) are Gloo
// sub-communicators made through the master's rendezvous store. They train the losses of one rank,
// and a killed node makes the survivor exit 3 naming a lost rank.
TEST_F(MultiNode, TensorTimesDataAcrossTwoProcessesTrainsTheLossesOfOneRank) {
  write_job("one.json", 8);
  auto single = start({"train", "one.json"}, "single.log");
  ASSERT_EQ(single->wait_for(120s), 0) << single->output();
  const auto want = losses("one.json");
  ASSERT_EQ(want.size(), 8u);
  auto two_ranks = [](std::vector<std::string> a) {
    a.insert(a.end(), {"--nproc-per-node", "2"});
    return a;
  };
  write_job("tp.json", 8, R"(}, "parallelism": {"tensor": 2)");
  int port = free_port();
  auto n0 = start(two_ranks(node_args("tp.json", 2, 0, port)), "tp.n0.log");
  auto n1 = start(two_ranks(node_args("tp.json", 2, 1, port)), "tp.n1.log");
  ASSERT_EQ(n0->wait_for(120s), 0) << n0->output();
  ASSERT_EQ(n1->wait_for(120s), 0) << n1->output();
  const auto got = losses("tp.json");
  ASSERT_EQ(got.size(), want.size()) << n0->output();
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = std::stod(got[i].substr(got[i].find(',') + 1));
    const double b = std::stod(want[i].substr(want[i].find(',') + 1));
    EXPECT_NEAR(a, b, 1e-5 * b) << "step " << i + 1;
  }
  EXPECT_NE(n0->output().find("mesh tensor 2 x context 1 x data 2"), std::string::npos)
      << n0->output();

  write_job("tplong.json", 1000000,
            R"(, "collective_timeout": 5, "rendezvous_timeout": 60}, "parallelism": {"tensor": 2)");
  port = free_port();
  auto k0 = start(two_ranks(node_args("tplong.json", 2, 0, port)), "tpk0.log");
  auto k1 = start(two_ranks(node_args("tplong.json", 2, 1, port)), "tpk1.log");
  ASSERT_TRUE(k0->wait_output("3/1000000 | loss", 60s)) << k0->output() << k1->output();
  k1->kill9();
  const int code = k0->wait_for(10s);
  ASSERT_NE(code, Process::kTimedOut) << "survivor still running after 10 s\n" << k0->output();
  EXPECT_EQ(code, 3) << k0->output();
  const std::string out = k0->output();
  EXPECT_TRUE(out.find("rank 2") != std::string::npos || out.find("rank 3") != std::string::npos)
      << out;
}

// Pipeline parallelism across processes: two nodes of one rank each run P = 2 (a stage each,
// activations and gradients over loopback) and train the losses of one process; when one stage is
// killed, the other (waiting in a receive from it) exits 3 within 2 x the collective timeout,
// naming the lost rank, whichever stage dies.
TEST_F(MultiNode, PipelineStagesAcrossTwoProcessesTrainTheLossesOfOneAndAKilledStageStopsTheOther) {
  const std::string pp = R"(}, "parallelism": {"pipeline": 2, "pipeline_schedule": "1f1b")";
  write_job("one.json", 8, "", 3e-3, 2);
  auto single = start({"train", "one.json"}, "single.log");
  ASSERT_EQ(single->wait_for(120s), 0) << single->output();
  const auto want = losses("one.json");
  ASSERT_EQ(want.size(), 8u);
  write_job("pp.json", 8, pp, 3e-3, 2);
  int port = free_port();
  auto n0 = start(node_args("pp.json", 2, 0, port), "pp.n0.log");
  auto n1 = start(node_args("pp.json", 2, 1, port), "pp.n1.log");
  ASSERT_EQ(n0->wait_for(120s), 0) << n0->output();
  ASSERT_EQ(n1->wait_for(120s), 0) << n1->output();
  const auto got = losses("pp.json");
  ASSERT_EQ(got.size(), want.size()) << n0->output();
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = std::stod(got[i].substr(got[i].find(',') + 1));
    const double b = std::stod(want[i].substr(want[i].find(',') + 1));
    EXPECT_NEAR(a, b, 1e-5 * b) << "step " << i + 1;
  }
  EXPECT_NE(n0->output().find("x data 1 x pipeline 2"), std::string::npos) << n0->output();

  write_job("pplong.json", 1000000, R"(, "collective_timeout": 5, "rendezvous_timeout": 60)" + pp,
            3e-3, 2);
  for (int victim : {1, 0}) {  // the last stage, then the first
    port = free_port();
    auto k0 = start(node_args("pplong.json", 2, 0, port), "ppk0.log");
    auto k1 = start(node_args("pplong.json", 2, 1, port), "ppk1.log");
    Process& dead = victim == 1 ? *k1 : *k0;
    Process& survivor = victim == 1 ? *k0 : *k1;
    ASSERT_TRUE(k0->wait_output("3/1000000 | loss", 60s)) << k0->output() << k1->output();
    dead.kill9();
    const int code = survivor.wait_for(10s);
    ASSERT_NE(code, Process::kTimedOut) << "surviving stage still running after 10 s\n"
                                        << survivor.output();
    EXPECT_EQ(code, 3) << survivor.output();
    EXPECT_NE(survivor.output().find("rank " + std::to_string(victim)), std::string::npos)
        << survivor.output();
  }
}

// The full 3D mesh across processes: two nodes of four ranks each run P = 2 x DP = 2 x T = 2
// (pipeline outermost, so each node holds one stage: its tensor and data groups stay inside it and
// the stage boundary crosses the nodes) and train the losses of one process within 1e-5.
TEST_F(MultiNode, ThreeDimensionalMeshAcrossTwoProcessesOfFourRanksTrainsTheLossesOfOne) {
  write_job("one.json", 6, "", 3e-3, 2);
  auto single = start({"train", "one.json"}, "single.log");
  ASSERT_EQ(single->wait_for(120s), 0) << single->output();
  const auto want = losses("one.json");
  ASSERT_EQ(want.size(), 6u);
  // (Micro-batches of 2: 2 per data-parallel rank and step, as 1F1B at P = 2 needs.)
  write_job("mesh.json", 6, R"(}, "parallelism": {"pipeline": 2, "tensor": 2)", 3e-3, 2, 2);
  const int port = free_port();
  auto four = [](std::vector<std::string> a) {
    a.insert(a.end(), {"--nproc-per-node", "4"});
    return a;
  };
  auto n0 = start(four(node_args("mesh.json", 2, 0, port)), "mesh.n0.log");
  auto n1 = start(four(node_args("mesh.json", 2, 1, port)), "mesh.n1.log");
  ASSERT_EQ(n0->wait_for(120s), 0) << n0->output();
  ASSERT_EQ(n1->wait_for(120s), 0) << n1->output();
  const auto got = losses("mesh.json");
  ASSERT_EQ(got.size(), want.size()) << n0->output();
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = std::stod(got[i].substr(got[i].find(',') + 1));
    const double b = std::stod(want[i].substr(want[i].find(',') + 1));
    EXPECT_NEAR(a, b, 1e-5 * b) << "step " << i + 1;
  }
  EXPECT_NE(n0->output().find("tensor 2 x context 1 x data 2 x pipeline 2"), std::string::npos)
      << n0->output();
}

TEST_F(MultiNode, KilledNodeMakesTheSurvivorExit3NamingTheLostRank) {
  write_job("long.json", 1000000, R"(, "collective_timeout": 5, "rendezvous_timeout": 60)");
  for (int victim : {1, 0}) {  // a worker node, then the master node
    const int port = free_port();
    auto n0 = start(node_args("long.json", 2, 0, port), "k0.log");
    auto n1 = start(node_args("long.json", 2, 1, port), "k1.log");
    Process& dead = victim == 1 ? *n1 : *n0;
    Process& survivor = victim == 1 ? *n0 : *n1;
    ASSERT_TRUE(n0->wait_output("3/1000000 | loss", 60s)) << n0->output() << n1->output();
    dead.kill9();
    const auto t0 = std::chrono::steady_clock::now();
    const int code = survivor.wait_for(10s);  // 2 x the collective timeout
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_NE(code, Process::kTimedOut) << "survivor still running after 10 s\n"
                                        << survivor.output();
    EXPECT_EQ(code, 3) << survivor.output();
    const std::string out = survivor.output();
    EXPECT_NE(out.find("rank " + std::to_string(victim)), std::string::npos) << out;
    EXPECT_LT(seconds, 10.0);
  }
}

// Expert parallelism across two processes (a GPT-2 MoE block, 4 experts, expert 2): node 1 is
// killed inside the expert dispatch (ZEROD_FAULTS: the 13th row exchange of its process, the
// first of step 4; each step makes 4: dispatch and combine, forward and backward). Node 0, whose
// step 4 waits on the dead rank's rows or counts, exits 3 naming rank 1 within 2 x the
// collective timeout: no hang inside the all-to-all.
TEST_F(MultiNode, ARankKilledInsideTheExpertDispatchEndsTheOtherWithExit3NotAHang) {
  std::ofstream(dir_ / "moe.json")
      << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 1},
      "steps_per_print": 1,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16,
                "moe": {"num_experts": 4, "top_k": 2}},
      "parallelism": {"expert": 2},
      "data": {"train": "data/m_train_*.bin"},
      "train": {"steps": 1000000, "collective_timeout": 5, "rendezvous_timeout": 60}})";
  const int port = free_port();
  auto n0 = start(node_args("moe.json", 2, 0, port), "e0.log");
  ::setenv("ZEROD_FAULTS", "expert.all_to_all@13=kill", 1);
  auto n1 = start(node_args("moe.json", 2, 1, port), "e1.log");
  ::unsetenv("ZEROD_FAULTS");
  const int killed = n1->wait_for(60s);
  ASSERT_EQ(killed, -SIGKILL) << n1->output();  // the fault point, not a failure of its own
  const auto t0 = std::chrono::steady_clock::now();
  const int code = n0->wait_for(10s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(code, Process::kTimedOut) << "node 0 still running 10 s after node 1 died\n"
                                      << n0->output();
  EXPECT_EQ(code, 3) << n0->output();
  const std::string out = n0->output();
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find(" 3/1000000 | loss"), std::string::npos) << out;  // trained until the kill
  EXPECT_EQ(out.find(" 4/1000000 | loss"), std::string::npos) << out;
  std::printf("node 0 exited %d %.2f s after node 1 was killed inside the expert dispatch\n", code,
              seconds);
}

// A hung node (SIGSTOP: its connections stay open, nothing breaks) is declared dead by the
// rendezvous when its heartbeats stop; the survivor then aborts its collective and exits 3
// within seconds, not after the 120 s collective timeout.
TEST_F(MultiNode, HungNodeEndsTheSurvivorWithinTheHeartbeatTimeout) {
  write_job("hang.json", 1000000, R"(, "collective_timeout": 120, "rendezvous_timeout": 60)");
  for (int victim : {1, 0}) {  // a worker node, then the master node
    const int port = free_port();
    auto n0 = start(node_args("hang.json", 2, 0, port), "h0.log");
    auto n1 = start(node_args("hang.json", 2, 1, port), "h1.log");
    Process& hung = victim == 1 ? *n1 : *n0;
    Process& survivor = victim == 1 ? *n0 : *n1;
    ASSERT_TRUE(n0->wait_output("3/1000000 | loss", 60s)) << n0->output() << n1->output();
    ::kill(hung.pid(), SIGSTOP);
    const auto t0 = std::chrono::steady_clock::now();
    const int code = survivor.wait_for(30s);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::kill(hung.pid(), SIGCONT);
    hung.kill9();
    ASSERT_NE(code, Process::kTimedOut) << "survivor still running 30 s after the hang\n"
                                        << survivor.output();
    EXPECT_EQ(code, 3) << survivor.output();
    EXPECT_LT(seconds, 20.0) << survivor.output();
    EXPECT_NE(survivor.output().find("rank " + std::to_string(victim)), std::string::npos)
        << survivor.output();
  }
}

TEST_F(MultiNode, NodeThatNeverJoinsFailsTheRendezvousNamingIt) {
  write_job("alone.json", 5, R"(, "rendezvous_timeout": 2)");
  const int port = free_port();
  auto n0 = start(node_args("alone.json", 2, 0, port), "alone.log");
  const int code = n0->wait_for(15s);
  ASSERT_NE(code, Process::kTimedOut) << n0->output();
  EXPECT_EQ(code, 3) << n0->output();
  EXPECT_NE(n0->output().find("missing node rank 1"), std::string::npos) << n0->output();
}

TEST_F(MultiNode, BadLaunchesEndWithAClearErrorNotAHang) {
  write_job("a.json", 5, R"(, "rendezvous_timeout": 2)");
  write_job("b.json", 5, R"(, "rendezvous_timeout": 2)", 1e-3);  // differs from a.json
  {                                                              // node rank outside the world
    auto p = start(node_args("a.json", 2, 2, free_port()), "bad_rank.log");
    EXPECT_EQ(p->wait_for(15s), 2) << p->output();
    EXPECT_NE(p->output().find("node"), std::string::npos) << p->output();
  }
  {  // nobody serves the master address
    auto p = start(node_args("a.json", 2, 1, free_port()), "unreachable.log");
    EXPECT_EQ(p->wait_for(15s), 3) << p->output();
    EXPECT_NE(p->output().find("127.0.0.1"), std::string::npos) << p->output();
  }
  {  // the master port is taken by another process
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::listen(fd, 1);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    auto p = start(node_args("a.json", 2, 0, ntohs(a.sin_port)), "occupied.log");
    EXPECT_EQ(p->wait_for(15s), 2) << p->output();
    EXPECT_NE(p->output().find("already in use"), std::string::npos) << p->output();
    ::close(fd);
  }
  {  // the two nodes were given different jobs
    const int port = free_port();
    auto n0 = start(node_args("a.json", 2, 0, port), "mismatch0.log");
    auto n1 = start(node_args("b.json", 2, 1, port), "mismatch1.log");
    EXPECT_EQ(n0->wait_for(15s), 2) << n0->output();
    EXPECT_EQ(n1->wait_for(15s), 2) << n1->output();
    EXPECT_NE((n0->output() + n1->output()).find("hash"), std::string::npos)
        << n0->output() << n1->output();
  }
  {  // a world size the batch does not divide: 8 sequences on 3 ranks
    auto p = start({"train", "a.json", "--nproc-per-node", "3"}, "world.log");
    EXPECT_EQ(p->wait_for(15s), 2) << p->output();
    EXPECT_NE(p->output().find("world size 3"), std::string::npos) << p->output();
  }
}

#ifndef ZEROD_HAVE_GRPC
// A build without gRPC refuses --nnodes above 1 with exit 2 and says why.
TEST(MultiNodeWithoutGrpc, IsRefusedWithExit2) {
  const fs::path dir = fs::temp_directory_path() / ("zerod_nogrpc_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto p = std::make_unique<Process>(
      std::vector<std::string>{zerod_binary(), "train", "--nnodes", "2", "--node-rank", "0",
                               "--master", "127.0.0.1:29999"},
      dir.string(), (dir / "out.log").string());
  EXPECT_EQ(p->wait_for(30s), 2) << p->output();
  EXPECT_NE(p->output().find("built without gRPC"), std::string::npos) << p->output();
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace zerod
