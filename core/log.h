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

}  // namespace zerod::log
