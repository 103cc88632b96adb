// Hostile or careless input: JSON nested far too deep is refused before a tree is built (no stack
// overflow), messages quote at most a prefix and the length of a long value, and batch sizes
// that do not fit the engine's integers are refused naming the key.
#include <gtest/gtest.h>

#include <string>

#include "config_test_util.h"
#include "engine/config/input_limits.h"
#include "engine/config/json_reader.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::problems_of;

std::string nested_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// The whole message of parse_job_text's ConfigError ("" when it parses).
std::string message_of(const std::string& text) {
  try {
    parse_job_text(text, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(InputLimits, DeeplyNestedJsonIsRefusedNamingTheDepthAndTheLimit) {
  // 100,000 nested arrays: a stack overflow (SIGSEGV) when a tree of them is built or printed.
  const auto problems = problems_of(nested_arrays(100000));
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_EQ(problems[0],
            "JSON nests 100000 levels deep (past the limit at line 1, column 65); at most 64 are "
            "allowed");
  // Unclosed, inside a section, as objects: the same refusal, never a crash.
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\": ";
  for (const std::string& text :
       {std::string(100000, '['), "{\"train\": {\"steps\": " + nested_arrays(100000) + "}}",
        "{\"model\": " + objects}) {
    const std::string msg = message_of(text);
    EXPECT_NE(msg.find("levels deep"), std::string::npos) << msg.substr(0, 300);
    EXPECT_NE(msg.find("at most 64 are allowed"), std::string::npos) << msg.substr(0, 300);
    EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
  }
}

TEST(InputLimits, NestingUpToTheLimitParsesAndBracketsInStringsAndCommentsDoNotCount) {
  // The top-level object is level 1: 63 arrays inside it make 64.
  EXPECT_EQ(problems_of(job_with({{"x", json::parse(nested_arrays(63))}})),
            std::vector<std::string>{"x: unknown key"});
  const auto deeper = problems_of(job_with({{"x", json::parse(nested_arrays(64))}}));
  ASSERT_EQ(deeper.size(), 1u) << joined(deeper);
  EXPECT_NE(deeper[0].find("JSON nests 65 levels deep"), std::string::npos) << deeper[0];
  // Brackets in strings (escaped quotes included) and comments are text, not nesting.
  const std::string brackets(100000, '[');
  const std::string text = "// " + brackets + "\n{\"train_micro_batch_size_per_gpu\": 2, /* " +
                           brackets + " */ \"train\": {\"steps\": 10}, \"x\": \"\\\"" + brackets +
                           "\"}";
  EXPECT_EQ(problems_of(text), std::vector<std::string>{"x: unknown key"});
}

TEST(InputLimits, MessagesQuoteAPrefixAndTheLengthOfLongValues) {
  const std::string big(10000, 'a');
  // A long value of the wrong type.
  auto problems = problems_of(job_with({{"zero_optimization", {{"stage", big}}}}));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_LT(problems[0].size(), 250u) << problems[0].substr(0, 300);
  EXPECT_NE(problems[0].find("zero_optimization.stage: expected an integer, got \"aaaa"),
            std::string::npos)
      << problems[0].substr(0, 300);
  EXPECT_NE(problems[0].find("... (10002 bytes)"), std::string::npos) << problems[0].substr(0, 300);
  // A long unknown key, and a long duplicate key.
  problems = problems_of(job_with({{big, 1}}));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_LT(problems[0].size(), 250u) << problems[0].substr(0, 300);
  EXPECT_NE(problems[0].find("(10000 bytes)"), std::string::npos) << problems[0].substr(0, 300);
  problems = problems_of(R"({"train": {"steps": 10}, "train_micro_batch_size_per_gpu": 2, ")" +
                         big + R"(": 1, ")" + big + R"(": 2})");
  EXPECT_TRUE(contains(problems, "duplicate key")) << joined(problems).substr(0, 600);
  for (const auto& p : problems) EXPECT_LT(p.size(), 300u) << p.substr(0, 300);
  // A long top-level value that is not an object.
  std::string msg = message_of(json(std::vector<std::string>(1000, big)).dump());
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
  EXPECT_NE(msg.find("expected a JSON object at the top level"), std::string::npos) << msg;
  // A syntax error after a long token: nlohmann's "last read" would be the whole token.
  msg = message_of("{\"train\": \"" + big + "\n\"}");
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 500);
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg.substr(0, 500);
  EXPECT_NE(msg.find("parse error at line 2"), std::string::npos) << msg.substr(0, 500);
}

TEST(InputLimits, TheSharedHelpers) {
  using config::clip_input;
  using config::json_depth_problem;
  EXPECT_EQ(json_depth_problem(nested_arrays(64)), "");
  EXPECT_EQ(json_depth_problem("{\"a\":\n [[1], {\"b\": [2]}]}", 2),
            "JSON nests 4 levels deep (past the limit at line 2, column 3); at most 2 are allowed");
  // Not JSON at all, unbalanced, comments and strings that never end: no crash, no false alarm.
  for (const char* text : {"", "]]]]", "/* [[[[", "// [[[[", "\"[[[[", "\"\\", "[\"\\\"[[[\"]"}) {
    EXPECT_EQ(json_depth_problem(text, 2), "") << text;
  }
  // What model_section.cc's read of a config.json uses: the problem under the file's name.
  config::Problems problems;
  EXPECT_TRUE(config::json_depth_ok("{\"a\": [1]}", "dir/config.json", problems));
  EXPECT_FALSE(config::json_depth_ok(nested_arrays(100000), "dir/config.json", problems));
  ASSERT_EQ(problems.errors.size(), 1u);
  EXPECT_EQ(problems.errors[0].rfind("dir/config.json: JSON nests 100000 levels deep", 0), 0u)
      << problems.errors[0];
  EXPECT_THROW(config::check_json_depth(nested_arrays(65), "x.json"), ConfigError);

  EXPECT_EQ(clip_input("short"), "short");
  EXPECT_EQ(clip_input(std::string(128, 'a')), std::string(128, 'a'));
  EXPECT_EQ(clip_input(std::string(10240, 'a')), std::string(128, 'a') + "... (10240 bytes)");
  EXPECT_EQ(clip_input("abcdef", 3), "abc... (6 bytes)");
  // Never half a UTF-8 character: "é" is 2 bytes.
  EXPECT_EQ(clip_input("a\xc3\xa9\xc3\xa9", 2), "a... (5 bytes)");
}

TEST(InputLimits, BatchSizesThatDoNotFitAreRefusedNamingTheKey) {
  const int64_t huge = int64_t{1} << 40;  // was trained as "micro_batch 0" (an int cast)
  for (const char* key :
       {"train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"}) {
    EXPECT_EQ(problems_of(job_with({{key, huge}})),
              std::vector<std::string>{std::string(key) +
                                       ": 1099511627776 is out of range (allowed: 1 to "
                                       "2147483647)"})
        << key;
  }
  EXPECT_TRUE(problems_of(job_with({{"train_micro_batch_size_per_gpu", 2147483647}})).empty());
  // Each fits, the global batch they derive does not.
  ParsedJob job = testing_config::parse(job_with(
      {{"train_micro_batch_size_per_gpu", 1 << 30}, {"gradient_accumulation_steps", 1 << 30}}));
  try {
    resolve_job(job.config, 4);
    FAIL() << "a global batch of 2^62 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
  }
  job = testing_config::parse(job_with({{"train_micro_batch_size_per_gpu", 1 << 30}}));
  EXPECT_THROW(resolve_job(job.config, 4), ConfigError);  // 2^32 sequences per step
}

}  // namespace
}  // namespace zerod
