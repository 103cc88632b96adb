// Writing whole small files durably: the bytes, fsync, and (atomically) a rename into place.
// For manifests and side files that must never be seen half-written.
#pragma once

#include <string>
#include <string_view>

namespace zerod {

// Writes `bytes` to path (created or truncated) and fsyncs it. InputError naming the file and
// the system's reason on failure.
void write_file_synced(const std::string& path, std::string_view bytes);

// write_file_synced to path + ".tmp", then renames it to path and fsyncs the directory: readers
// see the old file or the new one, never part of it. The .tmp file is removed on failure.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace zerod
