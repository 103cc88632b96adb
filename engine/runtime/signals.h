// Preemption (DESIGN.md section 5): SIGTERM and SIGUSR1 ask the job to checkpoint at the next
// step boundary and exit cleanly; the ranks agree on the request through an all-reduce so
// every rank stops at the same step. A second SIGTERM exits the process at once (status 143).
// zerod train and the daemon treat SIGINT (Ctrl-C) as SIGTERM: the first saves and stops, a
// second exits at once (status 130). The first stop signal says so on stderr.
#pragma once

namespace zerod {

// Installs the handlers (idempotent). SIGINT is left alone (Ctrl-C stops at once: zerod check,
// eval, generate) unless `sigint` (zerod train, the daemon: SIGINT checkpoints and stops like
// SIGTERM; a second one exits at once).
void install_stop_signals(bool sigint = false);
// True once SIGTERM, SIGUSR1 or a handled SIGINT arrived (or request_stop was called).
bool stop_requested();
// The signal that asked (0: none, or a programmatic request).
int stop_signal();
// Asks for a stop as the signals do (the control plane, tests).
void request_stop();
// Forgets a request (tests).
void clear_stop_request();

}  // namespace zerod
