#include "engine/runtime/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace zerod {

namespace {
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_terms{0};
std::atomic<bool> g_requested{false};

extern "C" void on_stop_signal(int sig) {
  if ((sig == SIGTERM || sig == SIGINT) && g_terms.fetch_add(1) >= 1) {
    // The second SIGTERM: the user (or the scheduler) means it. Only async-signal-safe calls.
    static const char kMsg[] = "zerod: second stop signal: exiting at once\n";
    (void)!::write(2, kMsg, sizeof(kMsg) - 1);
    ::_exit(128 + sig);
  }
  g_stop_signal.store(sig);
  g_requested.store(true);
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
