// Where `zerod serve` keeps its state and listens by default, and where zeroctl looks for it.
//
// The control plane listens on a Unix domain socket in a directory only the daemon's user can
// open, so only that user (and root) can drive the daemon without a token:
//   $XDG_RUNTIME_DIR/zerod/zerod.sock      (XDG_RUNTIME_DIR set: a per-user 0700 tmpfs)
//   /run/user/UID/zerod/zerod.sock         (when that directory exists and is this user's)
//   $XDG_CACHE_HOME/zerod/zerod.sock       (else; ~/.cache/zerod/zerod.sock)
// The directory is created 0700; an existing one must belong to this user and is made 0700.
// The state (the job journal, engine/control/journal.h) goes to --state-dir, by default
// $XDG_STATE_HOME/zerod (~/.local/state/zerod), also 0700.
#pragma once

#include <string>

namespace zerod {

// "unix:PATH" addresses (gRPC's form; PATH absolute or relative).
bool is_unix_address(const std::string& addr);
std::string unix_socket_path(const std::string& addr);  // PATH of "unix:PATH"

// The user's home (HOME, else the password database).
std::string home_directory();
std::string default_state_dir();
// The directory of the default socket (not created).
std::string default_socket_dir();
// "unix:" + default_socket_dir() + "/zerod.sock".
std::string default_control_address();

// Creates `dir` (and its parents) with mode 0700, or checks an existing one: a directory owned by
// this user, made 0700 when it was open to others. InputError naming `what` and the problem.
void ensure_private_dir(const std::string& dir, const std::string& what);

// Before binding a Unix socket at `path`: InputError when a daemon answers there (gRPC would
// silently take the path over) or something that is not a socket is in the way; a stale socket
// of a daemon that died is left for gRPC to replace. Also checks the path fits sun_path.
void check_unix_socket_free(const std::string& path, const std::string& what);

}  // namespace zerod
