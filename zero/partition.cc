#include "zero/partition.h"

#include <algorithm>

#include "core/error.h"

namespace zerod {

int64_t UnitPartition::valid(int rank) const {
  return std::clamp<int64_t>(numel - begin(rank), 0, shard);
}

Partition::Partition(const ParamLayout& layout, int world_size, int64_t align_elems,
                     int expert_world_size)
    : world_(world_size) {
  ZD_CHECK(world_size >= 1 && expert_world_size >= 0, "world size {}, experts' {}", world_size,
           expert_world_size);
  ZD_CHECK(align_elems >= 1, "alignment {}", align_elems);
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitLayout& ul = layout.unit(u);
    UnitPartition p;
    padded_offsets_.push_back(padded_elems_total());
    shard_offsets_.push_back(shard_elems_total());
    p.experts = ul.experts && expert_world_size > 0;
    p.world = p.experts ? expert_world_size : world_size;
    const int64_t quantum = align_elems * p.world;
    p.numel = ul.numel;
    p.padded = (ul.numel + quantum - 1) / quantum * quantum;
    p.shard = p.padded / p.world;
    units_.push_back(p);
    std::vector<DecayRange> ranges;
    int64_t cursor = 0;
    for (const TensorInfo& t : ul.tensors) {
      if (t.offset > cursor) ranges.push_back({cursor, t.offset, false});
      ranges.push_back({t.offset, t.offset + t.numel, t.decay});
      cursor = t.offset + t.numel;
    }
    if (cursor < p.padded) ranges.push_back({cursor, p.padded, false});
    ranges_.push_back(std::move(ranges));
  }
}

int64_t Partition::shard_elems_total() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.shard;
  return n;
}

int64_t Partition::padded_elems_total() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.padded;
  return n;
}

}  // namespace zerod
