#include "engine/checkpoint/io_error.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace zerod {

void throw_save_io_error(const std::string& path, const std::string& what, int err,
                         std::optional<uint64_t> file_bytes) {
  if (err == ENOSPC || err == EDQUOT) {
    struct statvfs st {};
    const std::string dir = std::filesystem::path(path).parent_path().string();
    const bool known = ::statvfs(dir.empty() ? "." : dir.c_str(), &st) == 0;
    ZD_THROW_INPUT("{}: {} failed: {}{}{}", path, what, std::strerror(err),
                   file_bytes ? fmt::format(": the file needs {} bytes", *file_bytes) : "",
                   known ? fmt::format(", {} bytes are free on that file system",
                                       static_cast<uint64_t>(st.f_bavail) * st.f_frsize)
                         : std::string());
  }
  if (err == EIO) {
    ZD_THROW_KIND(ErrorKind::kSystem, "{}: {} failed: {}", path, what, std::strerror(err));
  }
  ZD_THROW("{}: {} failed: {}", path, what, std::strerror(err));
}

}  // namespace zerod
