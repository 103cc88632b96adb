// The parallelism section: its keys and DeepSpeed's aliases, the data-parallel size and batch
// triangle over it, the rank layout `zerod check` prints, and the rules against the model.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "engine/config/config_error.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;
using testing_config::resolve_problems;

TEST(Parallelism, WithoutTheSectionTheWorldIsTheDataParallelGroup) {
  ParsedJob job = parse(job_with(json::object()));
  resolve_job(job.config, 4);
  EXPECT_EQ(job.config.parallelism, ParallelismConfig{});
  EXPECT_EQ(job.config.data_parallel_size, 4);
  EXPECT_EQ(job.config.global_batch(), 8);  // micro 2 x accumulation 1 x 4
  const json layout = job_to_json(job.config)["resolved"]["layout"];
  EXPECT_EQ(layout["data"], json::parse("[[0, 1, 2, 3]]"));
  EXPECT_EQ(layout["tensor"], json::parse("[[0], [1], [2], [3]]"));
  EXPECT_EQ(job.config.model.padded_vocab_size, 50304);  // unchanged: 128-aligned
}

TEST(Parallelism, TheBatchTriangleAndLayoutUseTheDataParallelSize) {
  ParsedJob job = parse(job_with({{"parallelism", {{"tensor", 2}, {"context", 2}}}}));
  resolve_job(job.config, 8);
  const JobConfig& c = job.config;
  EXPECT_EQ(c.data_parallel_size, 2);
  EXPECT_EQ(c.global_batch(), 4);  // micro 2 x accumulation 1 x data-parallel 2
  const json r = job_to_json(c)["resolved"];
  EXPECT_EQ(r["data_parallel_size"], 2);
  EXPECT_EQ(r["layout"]["tensor"], json::parse("[[0, 1], [2, 3], [4, 5], [6, 7]]"));
  EXPECT_EQ(r["layout"]["context"], json::parse("[[0, 2], [1, 3], [4, 6], [5, 7]]"));
  EXPECT_EQ(r["layout"]["data"], json::parse("[[0, 4], [1, 5], [2, 6], [3, 7]]"));
  EXPECT_EQ(r["layout"]["zero"], json::parse("[[0, 2, 4, 6], [1, 3, 5, 7]]"));
  // The resolved job reads back to the same config, and a wrong layout is caught.
  EXPECT_EQ(parse(job_to_json(c).dump()).config, c);
  json bad = job_to_json(c);
  bad["resolved"]["layout"]["tensor"] = json::parse("[[0, 2]]");
  EXPECT_TRUE(contains(problems_of(bad.dump()), "resolved.layout"));
  // 6 ranks cannot hold tensor 2 x context 2.
  EXPECT_TRUE(contains(
      resolve_problems(job_with({{"parallelism", {{"tensor", 2}, {"context", 2}}}}), 6),
      "world size 6 is not divisible by parallelism.tensor 2 x parallelism.context 2 = 4"));
  EXPECT_TRUE(contains(
      resolve_problems(job_with({{"train_batch_size", 6}, {"parallelism", {{"tensor", 2}}}}), 4),
      "train_batch_size 6 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 1 "
      "x data-parallel size 2"));
}

TEST(Parallelism, DeepSpeedAliasesAndTheirConflicts) {
  ParsedJob a =
      parse(job_with({{"tensor_parallel", {{"autotp_size", 2}}}, {"sequence_parallel_size", 2}}));
  EXPECT_EQ(a.config.parallelism.tensor, 2);
  EXPECT_EQ(a.config.parallelism.context, 2);
  EXPECT_EQ(a.config.parallelism.context_impl, "ulysses");
  EXPECT_TRUE(contains(problems_of(job_with({{"tensor_parallel", {{"autotp_size", 2}}},
                                             {"parallelism", {{"tensor", 4}}}})),
                       "tensor_parallel.autotp_size: 2 conflicts with parallelism.tensor 4"));
  // 12 heads over tensor 4 leave 3 per rank, which Ulysses cannot split in 2.
  EXPECT_TRUE(contains(problems_of(job_with({{"tensor_parallel", {{"autotp_size", 4}}},
                                             {"sequence_parallel_size", 2}})),
                       "parallelism.context: 2 (ulysses) does not divide the 3 heads per tensor "
                       "rank"));
  EXPECT_TRUE(contains(problems_of(job_with({{"tensor_parallel", {{"tp_overlap", true}}}})),
                       "tensor_parallel.tp_overlap: unknown key"));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"parallelism", {{"context_impl", "star"}}}})),
               "parallelism.context_impl: \"star\" is not allowed (allowed: ulysses, ring)"));
}

TEST(Parallelism, TheModelMustSplitEvenly) {
  // GPT-2 124M: 12 heads, MLP 3072, vocabulary 50257.
  EXPECT_TRUE(
      contains(problems_of(job_with({{"parallelism", {{"tensor", 5}}}})),
               "parallelism.tensor: 5 does not divide the 12 attention heads (model.n_head)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"parallelism", {{"tensor", 8}}}})),
                       "parallelism.tensor: 8 does not divide the 12 attention heads"));
  // The vocabulary is padded to a multiple of 128 and of tensor (the same 128-multiple for
  // powers of two, so checkpoints reshard across them), and the job says when that changes it.
  ParsedJob t2 = parse(job_with({{"parallelism", {{"tensor", 2}}}}));
  EXPECT_EQ(t2.config.model.padded_vocab_size, 50304);
  EXPECT_FALSE(contains(t2.warnings, "padded to"));
  ParsedJob t3 =
      parse(job_with({{"parallelism", {{"tensor", 3}}}, {"model", {{"vocab_size", 1000}}}}));
  EXPECT_EQ(t3.config.model.padded_vocab_size, 1152);  // lcm(128, 3) = 384
  EXPECT_TRUE(contains(t3.warnings, "1000 padded to 1152 rows"));
  // Llama: key/value head groups split whole.
  const json llama = {{"type", "llama"},          {"hidden_size", 64},
                      {"intermediate_size", 96},  {"num_hidden_layers", 2},
                      {"num_attention_heads", 8}, {"num_key_value_heads", 2},
                      {"vocab_size", 256}};
  EXPECT_TRUE(contains(problems_of(job_with({{"model", llama}, {"parallelism", {{"tensor", 4}}}})),
                       "parallelism.tensor: 4 does not divide the 2 key/value heads"));
  EXPECT_TRUE(problems_of(job_with({{"model", llama}, {"parallelism", {{"tensor", 2}}}})).empty());
  EXPECT_TRUE(contains(problems_of(job_with({{"model", llama}, {"parallelism", {{"context", 4}}}})),
                       "parallelism.context: 4 (ulysses) does not divide the 8 attention heads "
                       "and 2 key/value heads"));
  EXPECT_TRUE(problems_of(job_with({{"model", llama},
                                    {"parallelism", {{"context", 4}, {"context_impl", "ring"}}}}))
                  .empty());
  // Per tensor rank: 8 heads and 2 key/value heads over tensor 2 leave 1 key/value head each.
  EXPECT_TRUE(contains(
      problems_of(job_with({{"model", llama}, {"parallelism", {{"tensor", 2}, {"context", 2}}}})),
      "parallelism.context: 2 (ulysses) does not divide the 1 key/value heads per tensor rank"));
  // Each sequence splits into 2C chunks (context rank r holds chunks r and 2C-1-r).
  EXPECT_TRUE(contains(
      problems_of(job_with({{"model", {{"seq_len", 1000}}},
                            {"parallelism", {{"context", 16}, {"context_impl", "ring"}}}})),
      "parallelism.context: 16: a sequence of 1000 positions (model.seq_len) does not split into "
      "2 x 16 = 32 equal chunks"));
  EXPECT_TRUE(
      problems_of(job_with({{"parallelism", {{"context", 4}, {"context_impl", "ring"}}}})).empty());
  json odd_ffn = llama;
  odd_ffn["intermediate_size"] = 98;
  EXPECT_TRUE(
      contains(problems_of(job_with({{"model", odd_ffn}, {"parallelism", {{"tensor", 4}}}})),
               "does not divide the MLP width 98 (model.intermediate_size)"));
  EXPECT_TRUE(contains(parse(job_with({{"parallelism", {{"sequence_parallel", true}}}})).warnings,
                       "parallelism.sequence_parallel: true has no effect"));
}

TEST(Parallelism,
     TensorSequenceAndContextRunOnCpuAndOnGpusOverStagedGlooWhileNcclGroupsAreNotBuiltYet) {
  ParsedJob job = parse(job_with({{"parallelism", {{"tensor", 2}}}}));
  resolve_job(job.config, 2);
  EXPECT_NO_THROW(check_supported(job.config));
  ParsedJob sp = parse(job_with({{"parallelism", {{"tensor", 2}, {"sequence_parallel", true}}}}));
  resolve_job(sp.config, 2);
  EXPECT_TRUE(sp.config.parallelism.sequence_parallel);
  EXPECT_NO_THROW(check_supported(sp.config));
  auto refused = [](const json& patch, const std::string& what) {
    ParsedJob bad = parse(job_with(patch));
    resolve_job(bad.config, 4);
    try {
      check_supported(bad.config);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.problems(), what)) << joined(e.problems());
    }
  };
  for (const char* impl : {"ulysses", "ring"}) {
    ParsedJob cp = parse(job_with({{"parallelism", {{"context", 2}, {"context_impl", impl}}}}));
    resolve_job(cp.config, 4);
    EXPECT_EQ(cp.config.data_parallel_size, 2);
    EXPECT_NO_THROW(check_supported(cp.config));
  }
  // GPU ranks: over Gloo with host staging (train.device_comm auto or gloo); NCCL sub-groups are
  // not built yet, so train.device_comm nccl is refused, naming the dimension.
  const json nccl = {{"device", "cuda"}, {"device_comm", "nccl"}};
  refused({{"parallelism", {{"context", 2}}}, {"train", nccl}},
          "parallelism.context: 2 with train.device cuda and train.device_comm \"nccl\": NCCL "
          "sub-groups are not enabled yet");
  refused({{"parallelism", {{"tensor", 2}}}, {"train", nccl}},
          "parallelism.tensor: 2 with train.device cuda and train.device_comm \"nccl\"");
  for (const char* comm : {"auto", "gloo"}) {
    for (const json& par : {json{{"tensor", 2}}, json{{"context", 2}}, json{{"pipeline", 2}}}) {
      ParsedJob gpu = parse(job_with({{"parallelism", par},
                                      {"gradient_accumulation_steps", 2},
                                      {"model", {{"n_layer", 2}}},
                                      {"train", {{"device", "cuda"}, {"device_comm", comm}}}}));
      resolve_job(gpu.config, 4);
      EXPECT_NO_THROW(check_supported(gpu.config)) << comm << " " << par.dump();
      EXPECT_FALSE(nccl_between_ranks(gpu.config)) << comm << " " << par.dump();
    }
  }
  ParsedJob plain = parse(job_with({{"parallelism", {{"tensor", 1}, {"context", 1}}}}));
  resolve_job(plain.config, 2);
  EXPECT_NO_THROW(check_supported(plain.config));
}

// Which GPU jobs exchange device tensors over NCCL: data parallel only with train.device_comm
// auto (the default) or nccl, more than one rank; never on CPU ranks or with gloo.
TEST(Parallelism, DeviceCommChoosesNcclForDataParallelGpuJobsOnly) {
  auto nccl = [](const json& train, int world, const json& par = json::object()) {
    json j = {{"train", train}};
    if (!par.empty()) j["parallelism"] = par;
    ParsedJob job = parse(job_with(j));
    resolve_job(job.config, world);
    return nccl_between_ranks(job.config);
  };
  const json cuda = {{"device", "cuda"}};
  EXPECT_TRUE(nccl(cuda, 2));
  EXPECT_FALSE(nccl(cuda, 1));
  EXPECT_FALSE(nccl({{"device", "cpu"}}, 2));
  EXPECT_FALSE(nccl(cuda, 4, {{"tensor", 2}}));
  {  // PowerSGD: auto takes Gloo (its hook has not run over NCCL), an explicit nccl is refused.
    json j = {{"train", cuda}, {"communication_compression", {{"type", "powersgd"}, {"rank", 2}}}};
    ParsedJob job = parse(job_with(j));
    resolve_job(job.config, 2);
    EXPECT_FALSE(nccl_between_ranks(job.config));
    EXPECT_NO_THROW(check_supported(job.config));
    j["train"]["device_comm"] = "nccl";
    ParsedJob forced = parse(job_with(j));
    resolve_job(forced.config, 2);
    EXPECT_TRUE(nccl_between_ranks(forced.config));
    try {
      check_supported(forced.config);
      ADD_FAILURE() << "PowerSGD over NCCL accepted";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.problems(),
                           "communication_compression.type: \"powersgd\" with "
                           "train.device cuda and train.device_comm \"nccl\""))
          << joined(e.problems());
    }
  }
  EXPECT_TRUE(nccl({{"device", "cuda"}, {"device_comm", "nccl"}}, 2));
  EXPECT_FALSE(nccl({{"device", "cuda"}, {"device_comm", "gloo"}}, 2));
  ParsedJob job = parse(job_with({{"train", {{"device", "cuda"}, {"device_comm", "gloo"}}}}));
  EXPECT_EQ(job.config.train.device_comm, DeviceComm::kGloo);
  EXPECT_EQ(job_to_json(job.config)["train"]["device_comm"], "gloo");
  const std::vector<std::string> bad =
      problems_of(job_with({{"train", {{"device", "cuda"}, {"device_comm", "mpi"}}}}));
  EXPECT_TRUE(contains(bad, "train.device_comm")) << joined(bad);
  EXPECT_TRUE(contains(bad, "gloo")) << joined(bad);
}

}  // namespace
}  // namespace zerod
