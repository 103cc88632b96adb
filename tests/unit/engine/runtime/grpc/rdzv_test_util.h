// Helpers for the rendezvous tests: free loopback ports, node sessions started in parallel
// (a Join returns only when every node has joined), and bounded polling.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/runtime/grpc/node_session_grpc.h"
#include "engine/runtime/grpc/rendezvous_server.h"
#include "tests/loopback_ports.h"

namespace zerod::test {

using namespace std::chrono_literals;

// A port nothing listens on right now, below the ephemeral range (tests/loopback_ports.h).
inline int free_port() {
  return testing_ports::pick_loopback_port();
}

inline LaunchSpec spec(int nnodes, int node_rank, int nproc, int port) {
  LaunchSpec s;
  s.nnodes = nnodes;
  s.node_rank = node_rank;
  s.nproc_per_node = nproc;
  s.master_host = "127.0.0.1";
  s.master_port = port;
  s.source = "flags";
  return s;
}

inline RendezvousServerOptions server_at(int port) {
  RendezvousServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  return o;
}

// Short timeouts so that every test runs in about a second.
inline SessionOptions options(const std::string& job_hash = "job-abc") {
  SessionOptions o;
  o.job_hash = job_hash;
  o.rendezvous_timeout = 5s;
  o.heartbeat_interval = 50ms;
  o.heartbeat_misses = 10;  // 500 ms of silence: no false alarms on a loaded 2-core machine
  o.rpc_timeout = 5s;
  o.leave_grace = 2s;
  return o;
}

// One node's start: the session or the error it threw.
struct Started {
  std::unique_ptr<NodeSession> session;
  std::exception_ptr error;
  std::string message;  // what() of the error
  int exit_code = 0;    // of the error
};

inline std::future<Started> start_async(LaunchSpec s, SessionOptions o) {
  return std::async(std::launch::async, [s, o] {
    Started r;
    try {
      r.session = start_node_session(s, o);
    } catch (const Error& e) {
      r.error = std::current_exception();
      r.message = e.what();
      r.exit_code = e.exit_code();
    } catch (...) {
      r.error = std::current_exception();
      r.message = "non-zerod exception";
      r.exit_code = -1;
    }
    return r;
  });
}

// Starts node 0 (the host) first, then the others, all in parallel; waits for every start.
inline std::vector<Started> start_nodes(const std::vector<LaunchSpec>& specs,
                                        const std::vector<SessionOptions>& opts) {
  std::vector<std::future<Started>> futures;
  for (size_t i = 0; i < specs.size(); ++i) {
    futures.push_back(start_async(specs[i], opts[i]));
    if (i == 0) std::this_thread::sleep_for(20ms);  // the host binds before others connect
  }
  std::vector<Started> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// Destroys sessions last-first (the host, index 0, last: it waits for the others to leave).
inline void close_all(std::vector<Started>& nodes) {
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) it->session.reset();
}

// Polls pred every 5 ms until it holds or timeout passes.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace zerod::test
