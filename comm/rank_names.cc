#include "comm/rank_names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zerod {

int RankNames::global(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= global_ranks.size()) return index;
  return global_ranks[static_cast<size_t>(index)];
}

std::string RankNames::describe_group() const {
  if (is_world()) return "";
  const std::string name = group.empty() ? std::string("(unnamed)") : "'" + group + "'";
  if (global_ranks.empty()) return "group " + name;
  return fmt::format("group {} (global rank{} {})", name, global_ranks.size() == 1 ? "" : "s",
                     describe_rank_list(global_ranks));
}

std::string RankNames::rank_of(int index, int size) const {
  if (is_world()) return fmt::format("rank {} of {}", index, size);
  return fmt::format("rank {} of {}", global(index), describe_group());
}

std::string RankNames::rank(int index) const {
  if (is_world()) return fmt::format("rank {}", index);
  return fmt::format("rank {} of {}", global(index), describe_group());
}

std::string describe_rank_list(const std::vector<int>& ranks) {
  constexpr size_t kListed = 8;
  if (ranks.size() <= kListed) return fmt::format("{}", fmt::join(ranks, ", "));
  return fmt::format("{}, {}, {}, ..., {} ({} ranks)", ranks[0], ranks[1], ranks[2], ranks.back(),
                     ranks.size());
}

}  // namespace zerod
