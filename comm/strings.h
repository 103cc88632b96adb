// Exchanging small variable-length byte strings (metadata, error messages, tags) over a
// Communicator, with every rank calling in the same order.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zerod {

// Every rank's `mine`, indexed by rank.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);
// root's `value` on every rank (the other ranks' `value` is ignored).
std::string broadcast_string(Communicator& comm, const std::string& value, int root);

}  // namespace zerod
