#include "tcp_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace zerod::bench {

namespace {

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    ZD_CHECK(w > 0, "tcp send: {}", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    ZD_CHECK(r > 0, "tcp recv: {}", r == 0 ? "closed by peer" : std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace

TcpStream::TcpStream(int rank, Store& store, const std::string& key) : rank_(rank) {
  ZD_CHECK(rank == 0 || rank == 1, "TcpStream: endpoint {} (0 or 1)", rank);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (rank == 0) {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    ZD_CHECK(l >= 0, "socket: {}", std::strerror(errno));
    ZD_CHECK(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "bind: {}",
             std::strerror(errno));
    ZD_CHECK(::listen(l, 1) == 0, "listen: {}", std::strerror(errno));
    socklen_t len = sizeof(a);
    ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
    const std::string port = std::to_string(ntohs(a.sin_port));
    store.set(key, Bytes(port.begin(), port.end()));
    fd_ = ::accept(l, nullptr, nullptr);
    ::close(l);
    ZD_CHECK(fd_ >= 0, "accept: {}", std::strerror(errno));
  } else {
    Bytes port = store.get(key, std::chrono::seconds(60));
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(std::string(port.begin(), port.end()))));
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    ZD_CHECK(fd_ >= 0, "socket: {}", std::strerror(errno));
    ZD_CHECK(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "connect: {}",
             std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sender_ = std::thread([this] { sender_main(); });
}

TcpStream::~TcpStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  sender_.join();
  ::close(fd_);
}

void TcpStream::sync() {
  char c = 's';
  send_all(fd_, &c, 1);
  recv_all(fd_, &c, 1);
}

Timing TcpStream::one_direction(const char* src, char* dst, size_t bytes, int iters) {
  sync();
  char ack = 'a';
  return time_each(iters, [&] {
    if (rank_ == 0) {
      send_all(fd_, src, bytes);
      recv_all(fd_, &ack, 1);
    } else {
      recv_all(fd_, dst, bytes);
      send_all(fd_, &ack, 1);
    }
  });
}

Timing TcpStream::two_directions(const char* src, char* dst, size_t bytes, int iters) {
  sync();
  return time_each(iters, [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      src_ = src;
      bytes_ = bytes;
      ++requested_;
    }
    cv_.notify_all();
    recv_all(fd_, dst, bytes);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return sent_ == requested_; });
  });
}

void TcpStream::sender_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || sent_ < requested_; });
    if (quit_) return;
    const char* src = src_;
    const size_t bytes = bytes_;
    lock.unlock();
    send_all(fd_, src, bytes);
    lock.lock();
    ++sent_;
    cv_.notify_all();
  }
}

}  // namespace zerod::bench
