// Stage partition (parallel/pipeline/partition.h): uniform splits as evenly as possible, the
// parameter balance puts fewer layers on the stages that also hold the embedding or the head and
// is never worse than uniform, an explicit list is taken as given, and every bad request is
// refused naming its numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "parallel/pipeline/partition.h"

namespace zerod::pipeline {
namespace {

PartitionRequest request(int layers, int stages,
                         PartitionMethod method = PartitionMethod::kUniform) {
  PartitionRequest r;
  r.layers = layers;
  r.stages = stages;
  r.method = method;
  return r;
}

int64_t largest_stage(const PartitionRequest& r, const std::vector<int>& counts) {
  const std::vector<int> first = stage_first_layers(counts);
  int64_t worst = 0;
  for (int s = 0; s < r.stages; ++s) {
    int64_t load = (s == 0 ? r.first_params : 0) + (s == r.stages - 1 ? r.last_params : 0);
    for (int l = first[s]; l < first[s + 1]; ++l) load += r.layer_params[l];
    worst = std::max(worst, load);
  }
  return worst;
}

TEST(PipelinePartition, UniformIsAsEvenAsPossible) {
  EXPECT_EQ(partition_layers(request(12, 4)), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(partition_layers(request(10, 4)), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(partition_layers(request(4, 4)), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(stage_first_layers({3, 3, 2, 2}), (std::vector<int>{0, 3, 6, 8, 10}));
}

TEST(PipelinePartition, ParametersBalanceTheEmbeddingAndHead) {
  // GPT-2 small's counts: 7.1M per block, the embedding 39.4M (wte + wpe), the last stage ln_f
  // and the tied head's copy of wte (38.6M).
  PartitionRequest r = request(12, 4, PartitionMethod::kParameters);
  r.layer_params.assign(12, 7'087'872);
  r.first_params = 38'597'376 + 786'432;
  r.last_params = 1'536 + 38'597'376;
  const std::vector<int> p = partition_layers(r);
  EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), 12);
  // The embedding alone outweighs five blocks and the tied head's copy of it five more: one
  // block each on the first and last stage, the other ten evenly between.
  EXPECT_EQ(p, (std::vector<int>{1, 5, 5, 1}));
  EXPECT_LE(largest_stage(r, p), largest_stage(r, partition_layers(request(12, 4))));
  // Equal layers and nothing extra: the uniform split (spare layers on the later stages).
  PartitionRequest even = request(10, 4, PartitionMethod::kParameters);
  even.layer_params.assign(10, 5);
  const std::vector<int> e = partition_layers(even);
  EXPECT_EQ(largest_stage(even, e), 15);
  EXPECT_EQ(e, (std::vector<int>{2, 2, 3, 3}));
  // A heavy head moves layers off the last stage.
  PartitionRequest head = request(8, 2, PartitionMethod::kParameters);
  head.layer_params.assign(8, 10);
  head.last_params = 40;
  EXPECT_EQ(partition_layers(head), (std::vector<int>{6, 2}));
  // Brute force over every split of 9 layers into 3 stages with uneven layers: the DP's largest
  // stage is the smallest there is.
  PartitionRequest odd = request(9, 3, PartitionMethod::kParameters);
  odd.layer_params = {5, 1, 9, 2, 2, 8, 3, 7, 4};
  odd.first_params = 6;
  odd.last_params = 3;
  int64_t brute = INT64_MAX;
  for (int a = 1; a <= 7; ++a)
    for (int b = 1; a + b <= 8; ++b) brute = std::min(brute, largest_stage(odd, {a, b, 9 - a - b}));
  EXPECT_EQ(largest_stage(odd, partition_layers(odd)), brute);
}

TEST(PipelinePartition, ExplicitListsAndRefusals) {
  PartitionRequest r = request(12, 3, PartitionMethod::kExplicit);
  r.counts = {2, 6, 4};
  EXPECT_EQ(partition_layers(r), r.counts);
  EXPECT_NE(partition_problem(4, 8, PartitionMethod::kUniform, {})
                .find("8 pipeline stages for 4 "
                      "layers"),
            std::string::npos);
  EXPECT_NE(partition_problem(12, 3, PartitionMethod::kExplicit, {2, 6, 5}).find("sum to 13"),
            std::string::npos);
  EXPECT_NE(partition_problem(12, 3, PartitionMethod::kExplicit, {6, 6}).find("2 layer counts"),
            std::string::npos);
  EXPECT_NE(partition_problem(12, 3, PartitionMethod::kExplicit, {6, 0, 6}).find("stage 1 gets 0"),
            std::string::npos);
  r.counts = {2, 6, 5};
  EXPECT_THROW(partition_layers(r), InputError);
}

}  // namespace
}  // namespace zerod::pipeline
