// The mesh's rank arithmetic: Megatron's order (tensor fastest, pipeline outermost), groups that
// partition the world, and the degenerate world-only mesh.
#include "comm/mesh.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace zerod {
namespace {

TEST(Mesh, RanksRoundTripInMegatronOrder) {
  const Mesh m({.pipeline = 2, .data = 3, .context = 2, .tensor = 2});
  ASSERT_EQ(m.world(), 24);
  for (int r = 0; r < m.world(); ++r) EXPECT_EQ(m.rank(m.coord(r)), r);
  // tensor fastest, then context, data, pipeline.
  EXPECT_EQ(m.coord(1), (MeshCoord{0, 0, 0, 1}));
  EXPECT_EQ(m.coord(2), (MeshCoord{0, 0, 1, 0}));
  EXPECT_EQ(m.coord(4), (MeshCoord{0, 1, 0, 0}));
  EXPECT_EQ(m.coord(12), (MeshCoord{1, 0, 0, 0}));
  EXPECT_EQ(m.rank({1, 2, 1, 1}), 23);
}

TEST(Mesh, GroupsPartitionTheWorldAlongTheirAxes) {
  const Mesh m({.pipeline = 1, .data = 2, .context = 2, .tensor = 2});  // 8 ranks
  EXPECT_EQ(m.groups({MeshAxis::kTensor}),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups({MeshAxis::kContext}),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups({MeshAxis::kData}),
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // ZeRO shards over data x context (torchtitan's dp_shard x cp).
  EXPECT_EQ(m.groups({MeshAxis::kData, MeshAxis::kContext}),
            (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(m.group(5, {MeshAxis::kTensor}), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.index_in_group(5, {MeshAxis::kTensor}), 1);
  EXPECT_EQ(m.index_in_group(6, {MeshAxis::kData, MeshAxis::kContext}), 3);
  // Every axis: the world.
  EXPECT_EQ(m.groups({MeshAxis::kPipeline, MeshAxis::kData, MeshAxis::kContext, MeshAxis::kTensor})
                .size(),
            1u);
  // Every partition covers each rank once.
  for (auto axes : {std::initializer_list<MeshAxis>{MeshAxis::kTensor},
                    std::initializer_list<MeshAxis>{MeshAxis::kData, MeshAxis::kTensor}}) {
    std::multiset<int> seen;
    for (const auto& g : m.groups(axes)) seen.insert(g.begin(), g.end());
    EXPECT_EQ(seen.size(), 8u);
    EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 8u);
  }
}

TEST(Mesh, TensorGroupsStayInsideANodeWhenTheySplitIt) {
  // 2 nodes of 4 ranks (node-major global ranks), tensor 4: each tensor group is one node.
  const Mesh m({.pipeline = 1, .data = 2, .context = 1, .tensor = 4});
  for (const auto& g : m.groups({MeshAxis::kTensor})) EXPECT_EQ(g.front() / 4, g.back() / 4);
}

TEST(Mesh, TheWorldOnlyMeshIsOneDataGroup) {
  const Mesh m({.pipeline = 1, .data = 5, .context = 1, .tensor = 1});
  EXPECT_EQ(m.groups({MeshAxis::kData}), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(m.groups({MeshAxis::kTensor}).size(), 5u);
  EXPECT_THROW(Mesh({.pipeline = 1, .data = 0, .context = 1, .tensor = 1}), InputError);
}

}  // namespace
}  // namespace zerod
