// How a communicator names itself and its ranks in its messages (errors, logs). A world's
// communicator has no names: its ranks are the job's ranks and messages read as they always did
// ("failed on rank 1 of 4"). A sub-group's communicator (comm/process_groups.h) numbers its ranks
// 0..n-1 inside the group; its messages name the group and every rank by its global rank
// ("failed on rank 5 of group 'tensor' (global ranks 4, 5)", "receiving from rank 4 failed").
#pragma once

#include <string>
#include <vector>

namespace zerod {

struct RankNames {
  std::string group;              // "tensor", "data x context"; empty: the world
  std::vector<int> global_ranks;  // global rank of each group rank; empty: the identity

  bool is_world() const { return group.empty() && global_ranks.empty(); }
  // The global rank of group rank `index` (`index` itself without a mapping or out of range).
  int global(int index) const;
  // "group 'tensor' (global ranks 4, 5)"; "" for the world.
  std::string describe_group() const;
  // This rank in messages: "rank 1 of 4" for the world, "rank 5 of group 'tensor' (global ranks
  // 4, 5)" for a group (its size is implied by its ranks).
  std::string rank_of(int index, int size) const;
  // Like rank_of without the world's size: "rank 1" / "rank 5 of group 'tensor' (...)".
  std::string rank(int index) const;
};

// "4, 5" for a few ranks; "0, 8, 16, ..., 4088 (512 ranks)" for many.
std::string describe_rank_list(const std::vector<int>& ranks);

}  // namespace zerod
