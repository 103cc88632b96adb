#include "engine/runtime/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstddef>

namespace zerod {

namespace {
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_terms{0};
std::atomic<bool> g_requested{false};

// Only async-signal-safe calls in the handler: write(2) of constant text, _exit.
template <size_t N>
void say(const char (&text)[N]) {
  (void)!::write(2, text, N - 1);
}

extern "C" void on_stop_signal(int sig) {
  if ((sig == SIGTERM || sig == SIGINT) && g_terms.fetch_add(1) >= 1) {
    // The second SIGTERM or Ctrl-C: the user (or the scheduler) means it.
    say("zerod: second stop signal: exiting at once\n");
    ::_exit(128 + sig);
  }
  g_stop_signal.store(sig);
  g_requested.store(true);
  if (sig == SIGINT) {
    say("zerod: interrupt (SIGINT): stopping at the next step boundary, saving a checkpoint when "
        "the job has train.checkpoint_dir; press Ctrl-C again to exit at once without saving\n");
  } else if (sig == SIGTERM) {
    say("zerod: SIGTERM: stopping at the next step boundary, saving a checkpoint when the job "
        "has train.checkpoint_dir; a second SIGTERM exits at once without saving\n");
  } else {
    say("zerod: stop signal: stopping at the next step boundary, saving a checkpoint when the "
        "job has train.checkpoint_dir\n");
  }
}
}  // namespace

void install_stop_signals(bool sigint) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  if (sigint) sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() {
  return g_requested.load();
}
int stop_signal() {
  return g_stop_signal.load();
}
void request_stop() {
  g_requested.store(true);
}
void clear_stop_request() {
  g_requested.store(false);
  g_stop_signal.store(0);
  g_terms.store(0);
}

}  // namespace zerod
