// The daemon end to end: `zerod serve` processes on 127.0.0.1 driven by `zeroctl` (and a raw
// gRPC health check): submit, watch to completion, checkpoint by command, stop, resume; the
// refusals (state, bad tag, bad job, tokens, non-loopback without a token); SIGTERM.
#ifdef ZEROD_HAVE_GRPC
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/data/corpus.h"
#include "process_util.h"
#include "zerod.grpc.pb.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::Process;
using testing::zeroctl_binary;
using testing::zerod_binary;
using namespace std::chrono_literals;

class Serve : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_test_dir("zerod_serve", "a daemon drives the job over grpc. ");
  }
  void TearDown() override {
    daemons_.clear();  // SIGKILL whatever is still running
    fs::remove_all(dir_);
  }

  void write_job(const std::string& name, int64_t steps, const std::string& extra = "") {
    std::ofstream(dir_ / name) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 2}, "steps_per_print": 1000,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 32},
      "data": {"train": "data/c_train_*.bin"},
      "train": {"steps": )" << steps
                               << R"(, "checkpoint_dir": "ckpt"})" << extra << "}";
  }

  // Starts `zerod serve` on a free port; returns its address.
  std::string start_daemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {zerod_binary(), "serve", "--listen", "127.0.0.1:0"};
    if (std::find(extra.begin(), extra.end(), "--nproc-per-node") == extra.end()) {
      argv.insert(argv.end(), {"--nproc-per-node", "2"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::string log = "daemon" + std::to_string(daemons_.size()) + ".log";
    daemons_.push_back(std::make_unique<Process>(argv, dir_.string(), (dir_ / log).string()));
    Process& p = *daemons_.back();
    EXPECT_TRUE(p.wait_output("listening on ", 30s)) << p.output();
    std::smatch m;
    const std::string out = p.output();
    EXPECT_TRUE(std::regex_search(out, m, std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)")))
        << out;
    return m.size() > 1 ? m[1].str() : "";
  }

  struct Result {
    int rc;
    std::string out;
  };
  Result ctl(const std::string& addr, std::vector<std::string> args,
             std::chrono::milliseconds timeout = 120s) {
    std::vector<std::string> argv = {zeroctl_binary(), "--addr", addr};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, dir_.string(), (dir_ / ("ctl" + std::to_string(calls_++) + ".log")).string());
    const int rc = p.wait_for(timeout);
    return {rc, p.output()};
  }

  // Polls status --json until `pred` holds for the printed JSON (or 60 s pass).
  std::string wait_status(const std::string& addr,
                          const std::function<bool(const std::string&)>& pred) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      last = ctl(addr, {"status", "--json"}).out;
      if (pred(last)) return last;
      std::this_thread::sleep_for(100ms);
    }
    ADD_FAILURE() << "status never matched; last: " << last;
    return last;
  }
  static int64_t step_of(const std::string& json) {
    std::smatch m;
    return std::regex_search(json, m, std::regex("\"step\":\"?([0-9]+)")) ? std::stoll(m[1]) : -1;
  }

  // grpc.health.v1.Health/Check with an empty request, as a raw call: status and response bytes.
  static std::pair<grpc::Status, std::string> health_check(const std::string& addr,
                                                           const std::string& token) {
    auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> lock(mu);
                     status = s;
                     done = true;
                     cv.notify_all();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });  // the deadline bounds it
    std::string bytes;
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const auto& sl : slices)
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    return {status, bytes};
  }

  // Submit, watch to completion; a long job: refusals, checkpoint by command, stop, resume
  // from it, stop with a checkpoint. Jobs job-1 .. job-3.
  void lifecycle(const std::string& addr);

  // grpc.reflection.v1alpha.ServerReflection: list_services, as a raw streaming call; the
  // response bytes (which hold the service names).
  static std::string reflection_list_services(const std::string& addr) {
    auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    auto call = stub.PrepareCall(
        &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    auto step = [&](int tag) {
      void* got = nullptr;
      bool ok = false;
      return cq.Next(&got, &ok) && ok && got == reinterpret_cast<void*>(static_cast<intptr_t>(tag));
    };
    std::string out;
    call->StartCall(reinterpret_cast<void*>(1));
    if (step(1)) {
      grpc::Slice req(std::string("\x3a\x00", 2));  // field 7 (list_services) = ""
      grpc::ByteBuffer buf(&req, 1);
      call->Write(buf, reinterpret_cast<void*>(2));
      if (step(2)) {
        grpc::ByteBuffer resp;
        call->Read(&resp, reinterpret_cast<void*>(3));
        std::vector<grpc::Slice> slices;
        if (step(3) && resp.Dump(&slices).ok()) {
          for (const auto& sl : slices)
            out.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
        }
      }
    }
    ctx.TryCancel();
    grpc::Status st;
    call->Finish(&st, reinterpret_cast<void*>(4));
    void* got;
    bool ok;
    while (cq.Next(&got, &ok) && got != reinterpret_cast<void*>(4)) {
    }
    cq.Shutdown();
    while (cq.Next(&got, &ok)) {
    }
    return out;
  }

  fs::path dir_;
  std::vector<std::unique_ptr<Process>> daemons_;
  int calls_ = 0;
};

TEST_F(Serve, SubmitWatchCheckpointStopResume) {
  lifecycle(start_daemon());
}

// The same on two daemons: a master (node 0, one rank) and a node daemon (node 1, one rank)
// following it; the job runs on both.
TEST_F(Serve, TwoDaemonsRunEveryJobTogether) {
  const std::string rdzv = std::to_string(testing::free_port());
  const std::string master =
      start_daemon({"--nproc-per-node", "1", "--nnodes", "2", "--rendezvous-port", rdzv});
  write_job("short.json", 30);
  // The node daemon is not there yet: refused.
  Result r = ctl(master, {"submit", "short.json"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("node daemon 1 of 2 not connected"), std::string::npos) << r.out;
  const std::string node = start_daemon(
      {"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--master", master});
  ASSERT_TRUE(daemons_[0]->wait_output("node daemon 1 of 2 is following", 30s))
      << daemons_[0]->output();
  r = ctl(node, {"submit", "short.json"});  // jobs go to the master
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("submit jobs to the master daemon"), std::string::npos) << r.out;
  lifecycle(master);
  // The node daemon ran its part of every job (the last one stopped by command).
  r = ctl(node, {"status", "--json"});
  EXPECT_NE(r.out.find("\"job_id\":\"job-3\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"world_size\":2"), std::string::npos) << r.out;
}

TEST_F(Serve, TwoDaemonsWithATokenGuardTheRendezvousToo) {
  std::ofstream(dir_ / "token") << "0123456789abcdef0123\n";
  fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
  const int rdzv = testing::free_port();
  const std::string master =
      start_daemon({"--nproc-per-node", "1", "--nnodes", "2", "--rendezvous-port",
                    std::to_string(rdzv), "--token-file", "token"});
  // A node daemon without the token is refused; with it, it follows.
  start_daemon({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--master", master});
  ASSERT_TRUE(daemons_[1]->wait_output("refused this node", 30s)) << daemons_[1]->output();
  start_daemon({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--master", master,
                "--token-file", "token"});
  ASSERT_TRUE(daemons_[0]->wait_output("node daemon 1 of 2 is following", 30s))
      << daemons_[0]->output();
  write_job("long.json", 100000000);
  Result r = ctl(master, {"--token-file", "token", "submit", "long.json"});
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline &&
         step_of(ctl(master, {"--token-file", "token", "status", "--json"}).out) < 3) {
    std::this_thread::sleep_for(100ms);
  }
  // The job's Rendezvous service (the master's) refuses a call without the token.
  auto stub = v1::Rendezvous::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(rdzv), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::CheckRequest req;
  req.add_keys("anything");
  v1::CheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  r = ctl(master, {"--token-file", "token", "stop"});
  EXPECT_EQ(r.rc, 0) << r.out;
  r = ctl(master, {"--token-file", "token", "status", "--watch"});
  EXPECT_NE(r.out.find("finished (stopped)"), std::string::npos) << r.out;
}

void Serve::lifecycle(const std::string& addr) {
  // A short job, watched to completion.
  write_job("short.json", 30);
  Result r = ctl(addr, {"submit", "short.json"});
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("job-1"), std::string::npos) << r.out;
  r = ctl(addr, {"status", "--watch"});
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("job-1 finished | step 30/30"), std::string::npos) << r.out;
  r = ctl(addr, {"status"});
  EXPECT_NE(r.out.find("finished"), std::string::npos) << r.out;

  // A long job: refusals while it runs, a checkpoint by command, stop, resume from it.
  write_job("long.json", 100000000);
  ASSERT_EQ(ctl(addr, {"submit", "long.json"}).rc, 0);
  wait_status(addr, [](const std::string& j) { return step_of(j) >= 3; });
  r = ctl(addr, {"submit", "long.json"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("FAILED_PRECONDITION"), std::string::npos) << r.out;
  r = ctl(addr, {"checkpoint", "save", "--tag", "../x"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("INVALID_ARGUMENT"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  r = ctl(addr, {"checkpoint", "save", "--tag", "by-command"});
  ASSERT_EQ(r.rc, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("saved at step ([0-9]+)"))) << r.out;
  const int64_t saved = std::stoll(m[1]);
  EXPECT_EQ(read_manifest((dir_ / "ckpt" / "by-command").string()).progress.global_step, saved);
  r = ctl(addr, {"checkpoint", "list"});
  EXPECT_NE(r.out.find("by-command"), std::string::npos) << r.out;
  ASSERT_EQ(ctl(addr, {"stop"}).rc, 0);
  const std::string stopped = wait_status(
      addr, [](const std::string& j) { return j.find("JOB_STATE_FINISHED") != std::string::npos; });
  EXPECT_NE(stopped.find("\"stopped\":true"), std::string::npos) << stopped;
  EXPECT_EQ(ctl(addr, {"stop"}).rc, 2);  // nothing runs

  // Resume from the saved checkpoint: the first step reported is the one after it.
  r = ctl(addr, {"resume", "--tag", "by-command"});
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("job-3"), std::string::npos) << r.out;
  const std::string running =
      wait_status(addr, [](const std::string& j) { return step_of(j) > 0; });
  EXPECT_GT(step_of(running), saved) << running;
  r = ctl(addr, {"stop", "--checkpoint"});
  ASSERT_EQ(r.rc, 0) << r.out;
  wait_status(
      addr, [](const std::string& j) { return j.find("JOB_STATE_FINISHED") != std::string::npos; });
  const auto latest = read_latest((dir_ / "ckpt").string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_GT(read_manifest((dir_ / "ckpt" / *latest).string()).progress.global_step, saved);
  EXPECT_EQ(ctl(addr, {"resume", "--tag", "no-such-tag"}).rc, 2);
}

TEST_F(Serve, BadJobsAndHealth) {
  const std::string addr = start_daemon();
  std::ofstream(dir_ / "bad.json") << R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
      "params": {"lr": -1}}, "data": {"train": "data/c_train_*.bin"}, "train": {"steps": 2}})";
  Result r = ctl(addr, {"submit", "bad.json"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("INVALID_ARGUMENT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer.params.lr"), std::string::npos) << r.out;
  std::ofstream(dir_ / "broken.json") << "{\"train_batch_size\": ";
  EXPECT_EQ(ctl(addr, {"submit", "broken.json"}).rc, 2);
  EXPECT_EQ(ctl(addr, {"checkpoint", "save"}).rc, 2);  // no job
  // A request over the 4 MiB bound is refused whole.
  std::ofstream(dir_ / "huge.json")
      << "{\"train_batch_size\": 8" << std::string(5 << 20, ' ') << "}";
  r = ctl(addr, {"submit", "huge.json"});
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("RESOURCE_EXHAUSTED"), std::string::npos) << r.out;
  EXPECT_EQ(ctl(addr, {"status", "--bogus-flag"}).rc, 2);
  EXPECT_EQ(ctl("127.0.0.1:1", {"--timeout", "2", "status"}).rc, 3);  // nothing listens there

  // grpc.health.v1.Health/Check answers SERVING.
  const auto [status, bytes] = health_check(addr, "");
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // field 1 (status) = 1 (SERVING)
  // Server reflection lists the services (what grpcurl asks first).
  const std::string services = reflection_list_services(addr);
  EXPECT_NE(services.find("zerod.v1.Control"), std::string::npos) << services;
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos) << services;
}

TEST_F(Serve, TokensAndAddresses) {
  std::ofstream(dir_ / "token") << "0123456789abcdef0123\n";
  std::ofstream(dir_ / "wrong") << "0123456789abcdef9999\n";
  fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
  const std::string addr = start_daemon({"--token-file", "token"});
  Result r = ctl(addr, {"status"});
  EXPECT_EQ(r.rc, 4) << r.out;
  EXPECT_NE(r.out.find("UNAUTHENTICATED"), std::string::npos) << r.out;
  EXPECT_EQ(ctl(addr, {"--token-file", "wrong", "status"}).rc, 4);
  r = ctl(addr, {"--token-file", "token", "status"});
  EXPECT_EQ(r.rc, 0) << r.out;
  // The health service too (plaintext: a call without the token is cancelled).
  EXPECT_FALSE(health_check(addr, "").first.ok());
  EXPECT_FALSE(health_check(addr, "0123456789abcdef9999").first.ok());
  const auto [st, bytes] = health_check(addr, "0123456789abcdef0123");
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  // Any address but loopback needs a token file: refused at start, exit 2.
  Process p({zerod_binary(), "serve", "--listen", "0.0.0.0:0"}, dir_.string(),
            (dir_ / "open.log").string());
  EXPECT_EQ(p.wait_for(30s), 2) << p.output();
  EXPECT_NE(p.output().find("--token-file"), std::string::npos) << p.output();
}

TEST_F(Serve, TlsWithAToken) {
  // A self-signed certificate for 127.0.0.1.
  const std::string mk =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      (dir_ / "key.pem").string() + " -out " + (dir_ / "cert.pem").string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(mk.c_str()), 0) << "openssl (tools/deps.sh installs it)";
  std::ofstream(dir_ / "token") << "0123456789abcdef0123\n";
  fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
  const std::string addr =
      start_daemon({"--token-file", "token", "--tls-cert", "cert.pem", "--tls-key", "key.pem"});
  Result r = ctl(addr, {"--tls-ca", "cert.pem", "--token-file", "token", "status"});
  EXPECT_EQ(r.rc, 0) << r.out;
  r = ctl(addr, {"--tls-ca", "cert.pem", "status"});  // TLS, no token: every service refuses
  EXPECT_EQ(r.rc, 4) << r.out;
  r = ctl(addr, {"--token-file", "token", "--timeout", "3", "status"});  // plaintext to a TLS port
  EXPECT_EQ(r.rc, 3) << r.out;
  // Half a TLS pair is refused at start.
  Process p({zerod_binary(), "serve", "--listen", "127.0.0.1:0", "--tls-cert", "cert.pem"},
            dir_.string(), (dir_ / "half.log").string());
  EXPECT_EQ(p.wait_for(30s), 2) << p.output();
}

TEST_F(Serve, SigtermAndSigintCheckpointTheRunningJobAndExit0) {
  write_job("long.json", 100000000);
  for (const int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    fs::remove_all(dir_ / "ckpt");
    const std::string addr = start_daemon();
    ASSERT_EQ(ctl(addr, {"submit", "long.json"}).rc, 0);
    wait_status(addr, [](const std::string& j) { return step_of(j) >= 3; });
    ::kill(daemons_.back()->pid(), sig);
    EXPECT_EQ(daemons_.back()->wait_for(60s), 0) << daemons_.back()->output();
    const auto latest = read_latest((dir_ / "ckpt").string());
    ASSERT_TRUE(latest.has_value()) << daemons_.back()->output();
    EXPECT_GE(read_manifest((dir_ / "ckpt" / *latest).string()).progress.global_step, 3);
  }
}

}  // namespace
}  // namespace zerod
#endif  // ZEROD_HAVE_GRPC
