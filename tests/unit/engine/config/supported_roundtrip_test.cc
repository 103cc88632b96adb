// check_supported (recognised, not built yet) and job_to_json (every field, parses back equal).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "config_test_util.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

std::vector<std::string> unsupported(const JobConfig& cfg) {
  try {
    check_supported(cfg);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

TEST(CheckSupported, MinimalJobIsSupported) {
  EXPECT_TRUE(unsupported(parse(testing_config::minimal_job().dump()).config).empty());
}

TEST(CheckSupported, EachUnbuiltOptionIsNamed) {
  struct Case {
    json patch;
    const char* path;
  };
  const Case cases[] = {
      {{{"activation_checkpointing", {{"partition_activations", true}}}},
       "activation_checkpointing.partition_activations:"},
      {{{"activation_checkpointing", {{"cpu_checkpointing", true}}}},
       "activation_checkpointing.cpu_checkpointing:"},
      {{{"aio", {{"use_gds", true}}}}, "aio.use_gds:"},
  };
  for (const Case& c : cases) {
    const ParsedJob job = parse(job_with(c.patch));  // valid: recognised and range-checked
    const auto problems = unsupported(job.config);
    EXPECT_TRUE(contains(problems, c.path)) << c.patch << "\n" << joined(problems);
    for (const std::string& p : problems) {
      EXPECT_NE(p.find("is not implemented yet in zerod"), std::string::npos) << p;
    }
  }
  // Checkpointing, fine-tuning from a model file, TensorBoard, comms_logger and optimizer
  // offload (optimizer and parameters) to cpu and nvme are built.
  EXPECT_TRUE(
      unsupported(
          parse(
              job_with({{"model", {{"init_from", "w.safetensors"}}},
                        {"tensorboard", {{"enabled", true}}},
                        {"comms_logger", {{"enabled", true}}},
                        {"zero_optimization",
                         {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
                        {"checkpoint", {{"async", true}}},
                        {"train", {{"steps", 5}, {"save_interval", 2}, {"checkpoint_dir", "ck"}}}}))
              .config)
          .empty());
  EXPECT_TRUE(
      unsupported(
          parse(job_with({{"zero_optimization",
                           {{"stage", 3},
                            {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/n"}}},
                            {"offload_param", {{"device", "nvme"}, {"nvme_path", "/n"}}}}}}))
              .config)
          .empty());
  // Every ZeRO stage is built.
  for (int stage : {0, 1, 2, 3}) {
    EXPECT_TRUE(
        unsupported(parse(job_with({{"zero_optimization", {{"stage", stage}}}})).config).empty())
        << "stage " << stage;
  }
}

TEST(CheckSupported, CollectsEveryUnbuiltOption) {
  const ParsedJob job = parse(job_with(
      {{"activation_checkpointing", {{"partition_activations", true}, {"cpu_checkpointing", true}}},
       {"aio", {{"use_gds", true}}}}));
  try {
    check_supported(job.config);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems().size(), 3u) << joined(e.problems());
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// A job that sets a non-default value in every section.
json rich_job() {
  return json::parse(R"({
    "train_batch_size": 48, "gradient_accumulation_steps": 3,
    "steps_per_print": 7, "wall_clock_breakdown": true, "dump_state": true,
    "gradient_clipping": 1.5, "prescale_gradients": true, "gradient_predivide_factor": 2.0,
    "optimizer": {"type": "adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                  "weight_decay": 0.05, "bias_correction": false, "adam_w_mode": false}},
    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3,
                  "decay_lr_rate": 0.1, "cycle_first_step_size": 100, "cycle_second_step_size": 50,
                  "cycle_first_stair_count": 2, "decay_step_size": 10, "cycle_momentum": true,
                  "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}},
    "fp16": {"enabled": true, "auto_cast": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 200, "hysteresis": 4, "consecutive_hysteresis": true,
             "min_loss_scale": 0.5},
    "zero_optimization": {"stage": 3, "contiguous_gradients": false, "reduce_scatter": false,
      "reduce_bucket_size": 1e7, "allgather_partitions": false, "allgather_bucket_size": 2e7,
      "overlap_comm": false, "load_from_fp32_weights": false, "sub_group_size": 1e8,
      "stage3_prefetch_bucket_size": 123, "stage3_param_persistence_threshold": 456,
      "stage3_max_live_parameters": 789, "stage3_max_reuse_distance": 1011,
      "stage3_gather_16bit_weights_on_model_save": true, "round_robin_gradients": true,
      "offload_param": {"device": "nvme", "nvme_path": "/nvme/p", "buffer_count": 6,
                        "buffer_size": 1e6, "max_in_cpu": 1e7, "pin_memory": true},
      "offload_optimizer": {"device": "cpu", "buffer_count": 8, "pin_memory": true,
                            "pipeline_read": true, "pipeline_write": true, "fast_init": true,
                            "ratio": 0.3}},
    "aio": {"block_size": 4096, "queue_depth": 16, "intra_op_parallelism": 2,
            "single_submit": true, "overlap_events": false, "use_gds": true},
    "checkpoint": {"tag_validation": "ignore", "load_universal": true,
                   "use_node_local_storage": true, "async": true},
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
      "contiguous_memory_optimization": true, "number_checkpoints": 3,
      "synchronize_checkpoint_boundary": true, "profile": true},
    "csv_monitor": {"enabled": true, "output_path": "runs/", "job_name": "j"},
    "tensorboard": {"enabled": true, "output_path": "tb/", "job_name": "t"},
    "comms_logger": {"enabled": true, "verbose": true, "prof_all": false, "debug": true,
                     "prof_ops": ["all_reduce", "all_gather"]},
    "model": {"type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 32, "vocab_size": 300,
              "seq_len": 64, "init_from": "w.safetensors", "activation_checkpointing": true,
              "init_std": 0.015},
    "data": {"train": ["a/*.bin", "b/*.bin"], "val_fraction": 0.25, "seed": 18446744073709551615,
             "document_masking": true, "eos_token_id": 299},
    "train": {"steps": 77, "device": "cuda", "device_comm": "gloo", "checkpoint_dir": "ck/", "save_interval": 5, "keep_last": 3,
              "eval_interval": 11, "eval_batches": 4, "seed": 9, "peak_flops": 3.5e13}
  })");
}

TEST(JobToJson, RoundTripsEveryField) {
  for (const int world : {0, 2}) {  // 0: not resolved
    ParsedJob job = parse(rich_job().dump());
    if (world > 0) resolve_job(job.config, world);
    const json out = job_to_json(job.config);
    const ParsedJob back = parse_job_text(out.dump(2), "test.json");
    EXPECT_EQ(back.config, job.config) << out.dump(2);
    EXPECT_TRUE(back.warnings.empty()) << joined(back.warnings);
    // Printing the re-parsed config gives the same JSON.
    EXPECT_EQ(job_to_json(back.config), out);
  }
}

TEST(JobToJson, RoundTripsEachScheduleAndDefaults) {
  const json schedulers[] = {
      nullptr,
      {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 1e-6}, {"warmup_type", "linear"}}}},
      {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 500}, {"warmup_num_steps", 20}}}},
      {{"type", "WarmupCosineLR"},
       {"params", {{"total_num_steps", 500}, {"warmup_min_ratio", 0.1}, {"cos_min_ratio", 0.2}}}},
  };
  for (const json& s : schedulers) {
    json j = testing_config::minimal_job();
    j["scheduler"] = s;
    ParsedJob job = parse(j.dump());
    resolve_job(job.config, 3);
    const ParsedJob back = parse(job_to_json(job.config).dump());
    EXPECT_EQ(back.config, job.config) << s;
  }
}

// Each optimizer type round-trips, and prints only its own parameters (with its defaults).
TEST(JobToJson, RoundTripsEachOptimizerType) {
  const json optimizers[] = {
      {{"type", "SGD"}},
      {{"type", "SGD"},
       {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 1e-4}, {"nesterov", true}}}},
      {{"type", "SGD"}, {"params", {{"momentum", 0.5}, {"dampening", 0.25}}}},
      {{"type", "Adagrad"}},
      {{"type", "Adagrad"},
       {"params",
        {{"lr_decay", 0.01},
         {"initial_accumulator_value", 0.1},
         {"eps", 1e-8},
         {"weight_decay", 0.05}}}},
      {{"type", "Lion"}},
      {{"type", "Lion"}, {"params", {{"lr", 3e-4}, {"betas", {0.95, 0.98}}, {"weight_decay", 1}}}},
  };
  const std::map<std::string, std::set<std::string>> keys = {
      {"SGD", {"lr", "momentum", "dampening", "weight_decay", "nesterov"}},
      {"Adagrad", {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"}},
      {"Lion", {"lr", "betas", "weight_decay"}}};
  for (const json& o : optimizers) {
    json j = testing_config::minimal_job();
    j["optimizer"] = o;
    ParsedJob job = parse(j.dump());
    resolve_job(job.config, 2);
    const json out = job_to_json(job.config);
    const ParsedJob back = parse(out.dump());
    EXPECT_EQ(back.config, job.config) << o;
    EXPECT_TRUE(back.warnings.empty()) << joined(back.warnings);
    std::set<std::string> printed;
    for (const auto& [k, v] : out["optimizer"]["params"].items()) printed.insert(k);
    EXPECT_EQ(printed, keys.at(o["type"].get<std::string>())) << out["optimizer"];
  }
}

TEST(JobToJson, PrintsDefaultsAndDerivedValues) {
  ParsedJob job =
      parse(job_with({{"train_batch_size", 16}, {"zero_optimization", {{"stage", 3}}}}));
  resolve_job(job.config, 2);
  const json j = job_to_json(job.config);
  EXPECT_EQ(j["train_batch_size"], 16);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 2);
  EXPECT_EQ(j["gradient_accumulation_steps"], 4);  // 16 // 2 // 2
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["buffer_count"], 5);
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], nullptr);  // as given: unset
  EXPECT_EQ(j["aio"]["queue_depth"], 8);
  EXPECT_EQ(j["fp16"]["hysteresis"], 2);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], json({0.9, 0.999}));
  EXPECT_EQ(j["model"]["init_from"], nullptr);
  EXPECT_EQ(j["resolved"]["world_size"], 2);
  EXPECT_EQ(j["resolved"]["padded_vocab_size"], 50304);
  EXPECT_EQ(j["resolved"]["overlap_comm"], true);  // stage 3 default
  EXPECT_EQ(j["resolved"]["compute_dtype"], "fp32");
}

TEST(JobToJson, ResolvedValuesMustMatchTheFile) {
  json j = testing_config::minimal_job();
  j["resolved"] = {{"padded_vocab_size", 100}};
  EXPECT_TRUE(contains(problems_of(j.dump()),
                       "resolved.padded_vocab_size: 100 does not match the value derived from this "
                       "file (50304)"));
  j["resolved"] = {{"world_size", 4}};
  EXPECT_EQ(parse(j.dump()).config.world_size, 4);
}

}  // namespace
}  // namespace zerod
