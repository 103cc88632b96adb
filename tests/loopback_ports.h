// Loopback TCP ports for tests that start servers (in-process or in child programs).
//
// Ports come from [20000, 32000), below the kernel's ephemeral range (32768 and up by default):
// a port picked by binding port 0 is ephemeral, and between the pick and the server's bind any
// outgoing connection of the tests running beside this one may take it (CI saw torchrun's store
// fail with errno 98 that way). Each pick advances one process-wide generator, so two picks in
// the same process differ, and is checked free by binding it a moment before it is returned.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>

namespace zerod::testing_ports {

// True when `port` on 127.0.0.1 could be bound a moment ago.
inline bool loopback_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A free port in [20000, 32000); falls back to an ephemeral one when 500 picks were all taken.
inline int pick_loopback_port() {
  static std::atomic<uint32_t> state{static_cast<uint32_t>(::getpid()) * 2654435761u ^
                                     static_cast<uint32_t>(::time(nullptr)) * 40503u};
  for (int attempt = 0; attempt < 500; ++attempt) {
    const uint32_t x = state.fetch_add(0x9E3779B9u) * 1664525u + 1013904223u;
    const int port = 20000 + static_cast<int>((x >> 8) % 12000u);
    if (loopback_port_free(port)) return port;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace zerod::testing_ports
