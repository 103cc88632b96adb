// Logging through spdlog. Every line carries the rank of the calling thread ("[rank 3]"), which
// matters when several local ranks run as threads of one process.
#pragma once

#include <spdlog/spdlog.h>

namespace zerod::log {

// Installs the zerod pattern on the default logger. Idempotent; safe from any thread.
void init();

// The rank shown on lines logged by the calling thread; -1 hides the rank prefix.
void set_thread_rank(int rank);
int thread_rank();

// Level by name: trace, debug, info, warn, error, off. Throws InputError on an unknown name.
void set_level(const std::string& name);

// A live one-line progress display on stderr, redrawn in place (carriage return), only when
// stderr is a terminal (never in a file or pipe) and ZEROD_PROGRESS is not "0". Log lines clear
// it, print, and draw it again below them, so it never splits a line.
bool progress_enabled();
// Shows `text` as the progress line (no-op when disabled).
void set_progress(const std::string& text);
// Removes it (at the end of a run).
void clear_progress();

// For tests: the file descriptor the progress line is drawn on (default 2, -1 restores it); the
// terminal check runs again on it.
void set_progress_fd_for_test(int fd);

}  // namespace zerod::log
