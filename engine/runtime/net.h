// Small socket helpers for the launch: which local address faces the master, whether an
// address:port can be bound here, this machine's name.
#pragma once

#include <string>

namespace zerod {

// The local interface address that traffic to host:port leaves from (what a UDP socket
// connected there would use; nothing is sent): the address this node's collectives should
// bind so that peers reach them. "127.0.0.1" for a loopback master. Throws InputError when
// host does not resolve, Error(kPeerLost) when there is no route to it.
std::string local_address_towards(const std::string& host, int port);

enum class BindResult {
  kFree,      // host:port can be bound here
  kInUse,     // a local socket already listens there
  kNotLocal,  // host is not an address of this machine
};

// Tries to bind (not listen) a TCP socket to host:port, with SO_REUSEADDR as servers do, and
// closes it. Throws InputError when host does not resolve or the bind fails otherwise (e.g.
// a privileged port), naming the address and the system's reason.
BindResult probe_tcp_bind(const std::string& host, int port);

// gethostname(), or "unknown-host".
std::string local_hostname();

}  // namespace zerod
