// Writing whole small files durably: the bytes, fsync, and (atomically) a rename into place.
// For manifests and side files that must never be seen half-written.
#pragma once

#include <string>
#include <string_view>

namespace zerod {

// Writes `bytes` to path (created or truncated) and fsyncs it. InputError naming the file and
// the system's reason on failure.
void write_file_synced(const std::string& path, std::string_view bytes);

// write_file_synced to path + ".tmp", then rename_durably: readers see the old file or the new
// one, never part of it. The .tmp file is removed on failure.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Renames the written and fsynced file tmp to path and fsyncs path's directory, so the rename
// survives a crash. On failure tmp is removed and an InputError names both paths.
void rename_durably(const std::string& tmp, const std::string& path);

}  // namespace zerod
