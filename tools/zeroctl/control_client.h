// zeroctl's commands that talk to a running `zerod serve` over the Control service.
//
// Exit codes: 0 ok, 2 bad usage or a rejected request (INVALID_ARGUMENT, FAILED_PRECONDITION,
// NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED), 3 the daemon cannot be reached (UNAVAILABLE,
// DEADLINE_EXCEEDED), 4 unauthenticated, 5 stop: the job was still running at --timeout.
#pragma once

#include <string>

namespace zeroctl {

struct Connection {
  std::string addr;  // unix:PATH or HOST:PORT; empty: the daemon's default Unix socket
  std::string token_file;
  std::string tls_ca;
  double timeout_s = 30;  // per call (not for watch)
};

int submit(const Connection& c, const std::string& job_path, const std::string& resume);
int status(const Connection& c, bool watch, bool json);
int checkpoint_save(const Connection& c, const std::string& tag, bool overwrite);
int checkpoint_list(const Connection& c, bool json);
int resume(const Connection& c, const std::string& tag);
// Asks the running job to stop; with `wait`, returns once it is down (finished or failed), at
// most wait_s seconds (then kExitStillRunning).
constexpr int kExitStillRunning = 5;
int stop(const Connection& c, bool checkpoint, bool wait, double wait_s);

}  // namespace zeroctl
