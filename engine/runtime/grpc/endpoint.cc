#include "engine/runtime/grpc/endpoint.h"

#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

// An absolute directory from an XDG variable (the spec says relative values are to be ignored).
std::string xdg(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '/' ? std::string(v) : std::string();
}

}  // namespace

bool is_unix_address(const std::string& addr) {
  return addr.rfind("unix:", 0) == 0;
}

std::string unix_socket_path(const std::string& addr) {
  std::string p = addr.substr(5);
  if (p.rfind("//", 0) == 0) p = p.substr(2);  // unix:///abs/path
  return p;
}

std::string home_directory() {
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') return h;
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr)
    return pw->pw_dir;
  ZD_THROW_INPUT("cannot tell this user's home directory (HOME is not set): pass --state-dir");
}

std::string default_state_dir() {
  const std::string state = xdg("XDG_STATE_HOME");
  return state.empty() ? home_directory() + "/.local/state/zerod" : state + "/zerod";
}

std::string default_socket_dir() {
  if (const std::string run = xdg("XDG_RUNTIME_DIR"); !run.empty()) return run + "/zerod";
  const std::string user_run = "/run/user/" + std::to_string(::getuid());
  struct stat st {};
  if (::stat(user_run.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid())
    return user_run + "/zerod";
  const std::string cache = xdg("XDG_CACHE_HOME");
  return cache.empty() ? home_directory() + "/.cache/zerod" : cache + "/zerod";
}

std::string default_control_address() {
  return "unix:" + default_socket_dir() + "/zerod.sock";
}

void ensure_private_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    const fs::path parent = fs::path(dir).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) ZD_THROW_INPUT("{} {}: cannot create its parent: {}", what, dir, ec.message());
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      ZD_THROW_INPUT("{} {}: cannot create the directory: {}", what, dir, std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) ZD_THROW_INPUT("{} {}: {}", what, dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    ZD_THROW_INPUT("{} {}: not a directory (a symbolic link or a file is in the way)", what, dir);
  if (st.st_uid != ::geteuid()) {
    ZD_THROW_INPUT(
        "{} {}: the directory belongs to user id {}, not to this user ({}): another user could "
        "read or replace what zerod keeps there; use a directory of your own",
        what, dir, st.st_uid, ::geteuid());
  }
  if ((st.st_mode & 077) != 0) {
    if (::chmod(dir.c_str(), 0700) != 0)
      ZD_THROW_INPUT("{} {}: open to other users (mode {:o}) and chmod 700 failed: {}", what, dir,
                     st.st_mode & 0777, std::strerror(errno));
    spdlog::warn("{} {}: was open to other users (mode {:o}); made it 0700", what, dir,
                 st.st_mode & 0777);
  }
}

void check_unix_socket_free(const std::string& path, const std::string& what) {
  sockaddr_un addr{};
  if (path.empty()) ZD_THROW_INPUT("{} unix:: the socket path is empty", what);
  if (path.size() >= sizeof(addr.sun_path)) {
    ZD_THROW_INPUT(
        "{} unix:{}: the socket path is {} bytes, longer than a Unix socket allows ({}); choose "
        "a shorter one",
        what, path, path.size(), sizeof(addr.sun_path) - 1);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there
  if (!S_ISSOCK(st.st_mode))
    ZD_THROW_INPUT("{} unix:{}: something that is not a socket is in the way", what, path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const bool answered = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  if (answered) {
    ZD_THROW_INPUT(
        "{} unix:{}: another zerod serve is listening there (stop it, or give this one --listen "
        "unix:OTHER_PATH and its own --state-dir)",
        what, path);
  }
}

}  // namespace zerod
