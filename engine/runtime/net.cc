#include "engine/runtime/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "engine/runtime/launch.h"

namespace zerod {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int port, int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    ZD_THROW_INPUT("cannot resolve host '{}' ({}): {}", host, join_host_port(host, port),
                   gai_strerror(rc));
  return AddrInfoPtr(res);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string to_string(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace

std::string local_address_towards(const std::string& host, int port) {
  AddrInfoPtr res = resolve(host, port, SOCK_DGRAM);
  int last_errno = 0;
  for (addrinfo* a = res.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (fd.get() < 0) {
      last_errno = errno;
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {  // UDP: sends nothing
      last_errno = errno;
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_errno = errno;
      continue;
    }
    std::string address = to_string(local);
    if (!address.empty()) return address;
  }
  ZD_THROW_KIND(ErrorKind::kPeerLost, "no route from this machine to {}: {}",
                join_host_port(host, port), std::strerror(last_errno));
}

BindResult probe_tcp_bind(const std::string& host, int port) {
  AddrInfoPtr res = resolve(host, port, SOCK_STREAM);
  for (addrinfo* a = res.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (fd.get() < 0) continue;
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0) continue;
    const int err = errno;
    if (err == EADDRINUSE) return BindResult::kInUse;
    if (err == EADDRNOTAVAIL) return BindResult::kNotLocal;
    ZD_THROW_INPUT("cannot listen on {}: {}", join_host_port(host, port), std::strerror(err));
  }
  return BindResult::kFree;
}

std::string local_hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

}  // namespace zerod
