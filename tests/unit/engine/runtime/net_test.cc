#include "engine/runtime/net.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"

namespace zerod {
namespace {

// A TCP socket listening on 127.0.0.1 at a port the kernel chose.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

TEST(Net, LoopbackMasterMeansLoopbackAddress) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  EXPECT_EQ(local_address_towards("localhost", 29500).rfind("127.", 0) == 0 ||
                local_address_towards("localhost", 29500) == "::1",
            true);
}

TEST(Net, UnresolvableHostIsBadInput) {
  try {
    local_address_towards("no-such-host.invalid", 29500);
    ADD_FAILURE() << "resolved";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

TEST(Net, ProbeSeesAListeningPort) {
  Listener l;
  EXPECT_EQ(probe_tcp_bind("127.0.0.1", l.port), BindResult::kInUse);
  const int port = l.port;
  ::close(l.fd);
  l.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(probe_tcp_bind("127.0.0.1", port), BindResult::kFree);
}

TEST(Net, ProbeSeesAForeignAddress) {
  // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
  EXPECT_EQ(probe_tcp_bind("192.0.2.1", 29500), BindResult::kNotLocal);
}

TEST(Net, HostnameIsNotEmpty) {
  EXPECT_FALSE(local_hostname().empty());
}

}  // namespace
}  // namespace zerod
