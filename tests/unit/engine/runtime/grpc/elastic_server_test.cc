// An ElasticServer (engine/runtime/grpc/elastic_service.h) that finds a higher term in its host
// lease was taken over while presumed dead: it fails its job, so its agents stop rather than
// train apart from the node that took the rendezvous over (docs/elastic.md, "Node 0 dies").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "engine/runtime/elastic_host_lease.h"
#include "engine/runtime/grpc/elastic_service.h"
#include "rdzv_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(ElasticServer, AServerWhoseLeaseWasTakenOverFailsItsJob) {
  ElasticConfig c;
  c.job_hash = "h";
  c.admissible = {1};
  const fs::path dir = fs::temp_directory_path() / ("zerod_fenced_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = ElasticHostLease::path_in(dir.string());
  ElasticServer server(
      "127.0.0.1", test::free_port(), c, {},
      ElasticHosting{.lease_path = path, .term = 1, .node_rank = 0, .instance = "host"});
  EXPECT_EQ(ElasticHostLease::read(path)->term, 1);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(server.registry().view(Clock::now()).phase, "gathering");  // its own renewals
  ElasticHostLease successor(path, 2, "127.0.0.1:1", 1, "next");
  std::string phase;
  for (int i = 0; i < 40 && phase != "failed"; ++i) {
    std::this_thread::sleep_for(50ms);
    phase = server.registry().view(Clock::now()).phase;
  }
  EXPECT_EQ(phase, "failed");
  EXPECT_NE(server.registry().view(Clock::now()).failure.find("was taken over by node 1"),
            std::string::npos);
  EXPECT_EQ(ElasticHostLease::read(path)->term, 2);  // not overwritten by the old host
  server.stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zerod
