// Shard file lists from the glob patterns of a job file's `data.train` / `data.val`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zerod {

// Expands each pattern with POSIX glob(3) (`*`, `?`, `[...]`; a plain path is a pattern that
// matches itself) and returns every match, sorted by name and de-duplicated. A pattern that
// matches nothing is an InputError naming the pattern and `what` (the config key, e.g.
// "data.train"), and saying when the pattern's directory does not exist. An empty pattern list
// gives an empty result; callers decide whether that is allowed.
std::vector<std::string> expand_globs(const std::vector<std::string>& patterns,
                                      std::string_view what);

}  // namespace zerod
