// A blended data.train end to end: `zerod train` on two sources weighted 3:1 logs each source's
// realised share and passes, and a bad blend stops the job with exit 2 naming the source.
#include <gtest/gtest.h>

#include <string>

#include "tests/e2e_shards/shards_fixture.h"

namespace zerod {
namespace {

TEST_F(ShardsTokenizer, BlendedSourcesTrainAndReportTheirShares) {
  std::string web, code;
  for (int i = 0; i < 400; ++i) web += "the web says hello " + std::to_string(i) + "\n";
  for (int i = 0; i < 100; ++i) code += "int x" + std::to_string(i) + " = 1;\n";
  write("web.txt", web);
  write("code.txt", code);
  for (const char* src : {"web", "code"}) {
    const RunResult r = run_in(
        dir_, kShards,
        std::string("--val-fraction 0.1 --out-dir data --prefix ") + src + " " + src + ".txt");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  write("job.json", R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
      "steps_per_print": 5,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": [{"path": "data/web_train_*.bin", "weight": 3},
                         {"path": "data/code_train_*.bin", "weight": 1}],
               "val": "data/web_val_*.bin"},
      "train": {"steps": 10}})");
  const RunResult t = run_in(dir_, kZerod, "train job.json");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("data blend: 'data/web_train_*.bin': weight 3 (75.00%) -> 75.00% of the "
                          "stream; this run draws 60 samples"),
            std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("data blend: 'data/code_train_*.bin': weight 1 (25.00%) -> 25.00% of the "
                          "stream; this run draws 20 samples"),
            std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("step 10/10"), std::string::npos) << t.output;

  // One shard in two sources.
  write("dup.json", R"({"train_micro_batch_size_per_gpu": 4,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": [{"path": "data/web_train_*.bin", "weight": 3},
                         {"path": "data/*_train_*.bin", "weight": 1}]},
      "train": {"steps": 1}})");
  const RunResult d = run_in(dir_, kZerod, "train dup.json");
  EXPECT_EQ(d.code, 2) << d.output;
  EXPECT_NE(d.output.find("data.train[1].path"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("also matches data.train[0].path"), std::string::npos) << d.output;
}

}  // namespace
}  // namespace zerod
