// The error for a failed write, fsync or rename of a file being saved (checkpoint rank files,
// manifests, `latest`, exports): a full disk or quota is the environment (InputError, exit 2,
// with the bytes the file needs when known and the bytes free on that file system), EIO the
// machine failing (ErrorKind::kSystem, exit 1 but not a bug), anything else a bug.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerod {

[[noreturn]] void throw_save_io_error(const std::string& path, const std::string& what, int err,
                                      std::optional<uint64_t> file_bytes = std::nullopt);

}  // namespace zerod
