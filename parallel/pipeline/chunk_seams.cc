#include "parallel/pipeline/chunk_seams.h"

#include "core/error.h"

namespace zerod::pipeline {

ChunkSeams::ChunkSeams(const ParamLayout& chunk, const ParamLayout& rank) {
  std::vector<int> local(static_cast<size_t>(rank.num_global_units()), -1);  // global -> rank
  for (int u = 0; u < rank.num_units(); ++u) local.at(static_cast<size_t>(rank.global_unit(u))) = u;
  for (int u = 0; u < chunk.num_units(); ++u) {
    const int r = local.at(static_cast<size_t>(chunk.global_unit(u)));
    ZD_CHECK(r >= 0, "pipeline chunk unit {} ({}) is not in the rank's layout", u,
             chunk.unit(u).name);
    map_.push_back(r);
  }
}

}  // namespace zerod::pipeline
