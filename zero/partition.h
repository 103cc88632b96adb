// ZeRO partitioning (DESIGN.md section 3): each unit's flat buffer is padded to a multiple of
// world_size x alignment and split into world_size equal contiguous shards; rank r owns
// [r * shard, (r + 1) * shard). Every stage uses this one scheme. With expert parallelism the
// experts units (UnitLayout::experts: a rank's own experts) are split the same way over the
// expert-data-parallel group (the ranks holding the same experts), whose size and ranks they
// take instead.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"

namespace zerod {

struct UnitPartition {
  int64_t numel = 0;   // the unit's flat buffer (layout)
  int64_t padded = 0;  // numel rounded up to world * align
  int64_t shard = 0;   // padded / world
  int world = 1;       // the ranks it is split over
  bool experts = false;  // an experts unit split over its own (expert-data-parallel) group
  int64_t begin(int rank) const { return shard * rank; }
  // Elements of [begin, begin + shard) that lie inside the unit (the rest is padding).
  int64_t valid(int rank) const;
};

// A contiguous range of a unit's flat buffer with one weight-decay setting.
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = false;
};

class Partition {
 public:
  // expert_world_size > 0: the experts units (UnitLayout::experts) are split over their own group
  // of that many ranks (UnitPartition::experts); 0: like the other units.
  Partition(const ParamLayout& layout, int world_size, int64_t align_elems = 16,
            int expert_world_size = 0);

  int world_size() const { return world_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitPartition& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  // Ranges covering [0, padded) of unit u (gaps and padding have decay = false).
  const std::vector<DecayRange>& decay_ranges(int u) const {
    return ranges_.at(static_cast<size_t>(u));
  }
  int64_t shard_elems_total() const;   // sum over units of the shard size
  int64_t padded_elems_total() const;  // sum over units of the padded size

  // Offsets of unit u in a buffer holding every unit's padded buffer back to back (unit order),
  // and in one holding every unit's shard back to back.
  int64_t padded_offset(int u) const { return padded_offsets_.at(static_cast<size_t>(u)); }
  int64_t shard_offset(int u) const { return shard_offsets_.at(static_cast<size_t>(u)); }

 private:
  int world_;
  std::vector<UnitPartition> units_;
  std::vector<int64_t> padded_offsets_, shard_offsets_;
  std::vector<std::vector<DecayRange>> ranges_;
};

}  // namespace zerod
