// Each section's defaults (DeepSpeed's, written out here from its source) and values read from a
// file, including the rules DeepSpeed applies to the optimizer, scheduler and ZeRO.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

TEST(ConfigDefaults, MinimalJobHasDeepSpeedDefaults) {
  const ParsedJob job = parse(testing_config::minimal_job().dump());
  const JobConfig& c = job.config;
  EXPECT_TRUE(job.warnings.empty());
  EXPECT_EQ(c.source, "test.json");
  // Top level (deepspeed/runtime/constants.py; steps_per_print: the documented 10).
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.dump_state);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  // Optimizer (FusedAdam's signature).
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.bias_correction);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  // fp16 / bf16.
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.compute_dtype(), DType::kF32);
  // ZeRO (DeepSpeedZeroConfig).
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_TRUE(c.zero.allgather_partitions);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_FALSE(c.zero.overlap_comm.has_value());
  EXPECT_FALSE(c.zero.overlap_comm_resolved);
  EXPECT_TRUE(c.zero.load_from_fp32_weights);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_FALSE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 1.0);
  // aio (swap_tensor/constants.py).
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  // checkpoint, activation checkpointing, monitors, comms logger.
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_FALSE(c.checkpoint.load_universal);
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_FALSE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.tensorboard.output_path, "");
  EXPECT_FALSE(c.comms_logger.enabled);
  EXPECT_TRUE(c.comms_logger.prof_all);
  // zerod sections.
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.padded_vocab_size, 50304);  // 393 x 128
  EXPECT_FALSE(c.model.init_from.has_value());
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.train.eval_batches, 20);
}

TEST(ConfigSections, CommentsAreAllowed) {
  const std::string text = R"(// a job file
{
  /* batch */ "train_micro_batch_size_per_gpu": 4,  // per rank
  "train": {"steps": 3 /* three */}
})";
  const ParsedJob job = parse(text);
  EXPECT_EQ(job.config.micro_batch(), 4);
  EXPECT_EQ(job.config.train.steps, 3);
}

TEST(ConfigSections, OptimizerTypesAndAdamWMode) {
  struct Case {
    json optimizer;
    std::string type;
    bool adam_w_mode;
    double weight_decay;
  };
  const Case cases[] = {
      {{{"type", "adam"}}, "Adam", true, 0.0},  // "Adam" is decoupled by default
      {{{"type", "ADAMW"}}, "AdamW", true, 0.0},
      {{{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}, "Adam", false, 0.0},
      // torch.optim.AdamW's default decay applies only with torch_adam in decoupled mode.
      {{{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}, "AdamW", true, 0.01},
      {{{"type", "Adam"}, {"params", {{"torch_adam", true}, {"adam_w_mode", false}}}},
       "Adam",
       false,
       0.0},
      {{{"type", "Adam"}, {"params", {{"torch_adam", true}, {"weight_decay", 0.2}}}},
       "Adam",
       true,
       0.2},
  };
  for (const Case& c : cases) {
    const ParsedJob job = parse(job_with({{"optimizer", c.optimizer}}));
    EXPECT_EQ(job.config.optimizer.type, c.type) << c.optimizer;
    EXPECT_EQ(job.config.optimizer.adam_w_mode, c.adam_w_mode) << c.optimizer;
    EXPECT_EQ(job.config.optimizer.weight_decay, c.weight_decay) << c.optimizer;
  }
  // AdamW ignores adam_w_mode: false, as in DeepSpeed, with a warning.
  const ParsedJob w =
      parse(job_with({{"optimizer", {{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}}}));
  EXPECT_TRUE(w.config.optimizer.adam_w_mode);
  EXPECT_TRUE(contains(w.warnings, "optimizer.params.adam_w_mode")) << joined(w.warnings);
}

TEST(ConfigSections, OptimizerParams) {
  const ParsedJob job = parse(job_with({{"optimizer",
                                         {{"type", "AdamW"},
                                          {"params",
                                           {{"lr", 6e-4},
                                            {"betas", {0.9, 0.95}},
                                            {"eps", 1e-6},
                                            {"weight_decay", 0.1},
                                            {"bias_correction", false}}}}}}));
  const OptimizerConfig& o = job.config.optimizer;
  EXPECT_EQ(o.lr, 6e-4);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.95);
  EXPECT_EQ(o.eps, 1e-6);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_FALSE(o.bias_correction);
}

TEST(ConfigSections, OptimizerErrors) {
  const auto adamax = problems_of(job_with({{"optimizer", {{"type", "Adamax"}}}}));
  ASSERT_EQ(adamax.size(), 1u) << joined(adamax);
  EXPECT_EQ(adamax[0],
            "optimizer.type: \"Adamax\" is not supported by zerod (supported: Adam, AdamW, SGD, "
            "Adagrad, Lion, Muon, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)");
  EXPECT_TRUE(contains(problems_of(job_with({{"optimizer", {{"type", "MuAdam"}}}})),
                       "not supported by zerod"));
  EXPECT_TRUE(contains(problems_of(job_with({{"optimizer", {{"type", "RMSprop"}}}})),
                       "not supported by zerod (supported: Adam, AdamW, SGD, Adagrad, Lion, "
                       "Muon, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"optimizer", {{"type", "Adamm"}}}})),
                       "did you mean 'Adam'?"));
  EXPECT_TRUE(contains(problems_of(job_with({{"optimizer", {{"params", {{"lr", 1}}}}}})),
                       "optimizer.type: required"));

  const auto mgn = problems_of(
      job_with({{"optimizer", {{"type", "Adam"}, {"params", {{"max_grad_norm", 1.0}}}}}}));
  ASSERT_EQ(mgn.size(), 1u) << joined(mgn);
  EXPECT_NE(mgn[0].find("optimizer.params.max_grad_norm:"), std::string::npos);
  EXPECT_NE(mgn[0].find("gradient_clipping"), std::string::npos);

  EXPECT_EQ(
      problems_of(job_with({{"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9}}}}}}})),
      std::vector<std::string>{
          "optimizer.params.betas: expected an array of 2 numbers in [0, 1), got [0.9]"});
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9, 1.0}}}}}}})),
      "optimizer.params.betas: expected an array of 2 numbers in [0, 1), got [0.9,1.0]"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "Adam"}, {"params", {{"amsgrad", true}}}}}})),
      "optimizer.params.amsgrad: true is not supported by zerod (only false)"));
}

// SGD, Adagrad and Lion: torch.optim's / lion-pytorch's defaults, each key read, type names
// case-insensitive (DeepSpeed's "sgd", "adagrad", "lion").
TEST(ConfigSections, SgdAdagradLionDefaultsAndParams) {
  const ParsedJob sgd = parse(job_with({{"optimizer", {{"type", "sgd"}}}}));
  EXPECT_EQ(sgd.config.optimizer.type, "SGD");
  EXPECT_EQ(sgd.config.optimizer.lr, 1e-3);
  EXPECT_EQ(sgd.config.optimizer.momentum, 0.0);
  EXPECT_EQ(sgd.config.optimizer.dampening, 0.0);
  EXPECT_EQ(sgd.config.optimizer.weight_decay, 0.0);
  EXPECT_FALSE(sgd.config.optimizer.nesterov);
  const ParsedJob sgd2 = parse(job_with(
      {{"optimizer",
        {{"type", "SGD"},
         {"params",
          {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 1e-4}, {"nesterov", true}}}}}}));
  EXPECT_EQ(sgd2.config.optimizer.lr, 0.1);
  EXPECT_EQ(sgd2.config.optimizer.momentum, 0.9);
  EXPECT_EQ(sgd2.config.optimizer.weight_decay, 1e-4);
  EXPECT_TRUE(sgd2.config.optimizer.nesterov);

  const ParsedJob ada = parse(job_with({{"optimizer", {{"type", "Adagrad"}}}}));
  EXPECT_EQ(ada.config.optimizer.type, "Adagrad");
  EXPECT_EQ(ada.config.optimizer.lr, 1e-2);
  EXPECT_EQ(ada.config.optimizer.lr_decay, 0.0);
  EXPECT_EQ(ada.config.optimizer.initial_accumulator_value, 0.0);
  EXPECT_EQ(ada.config.optimizer.eps, 1e-10);
  EXPECT_EQ(ada.config.optimizer.weight_decay, 0.0);
  const ParsedJob ada2 = parse(job_with({{"optimizer",
                                          {{"type", "adagrad"},
                                           {"params",
                                            {{"lr_decay", 0.01},
                                             {"initial_accumulator_value", 0.1},
                                             {"eps", 1e-8},
                                             {"weight_decay", 0.05}}}}}}));
  EXPECT_EQ(ada2.config.optimizer.lr_decay, 0.01);
  EXPECT_EQ(ada2.config.optimizer.initial_accumulator_value, 0.1);
  EXPECT_EQ(ada2.config.optimizer.eps, 1e-8);
  EXPECT_EQ(ada2.config.optimizer.weight_decay, 0.05);

  const ParsedJob lion = parse(job_with({{"optimizer", {{"type", "LION"}}}}));
  EXPECT_EQ(lion.config.optimizer.type, "Lion");
  EXPECT_EQ(lion.config.optimizer.lr, 1e-3);  // DeepSpeed FusedLion's defaults
  EXPECT_EQ(lion.config.optimizer.beta1, 0.9);
  EXPECT_EQ(lion.config.optimizer.beta2, 0.999);
  EXPECT_EQ(lion.config.optimizer.weight_decay, 0.0);
  const ParsedJob lion2 = parse(
      job_with({{"optimizer",
                 {{"type", "Lion"},
                  {"params", {{"lr", 3e-4}, {"betas", {0.95, 0.98}}, {"weight_decay", 0.1}}}}}}));
  EXPECT_EQ(lion2.config.optimizer.lr, 3e-4);
  EXPECT_EQ(lion2.config.optimizer.beta1, 0.95);
  EXPECT_EQ(lion2.config.optimizer.beta2, 0.98);
  EXPECT_EQ(lion2.config.optimizer.weight_decay, 0.1);
}

TEST(ConfigSections, SgdAdagradLionErrorsNameTheKeyAndListTheValidOnes) {
  // Another type's key: named, with the keys of this type.
  EXPECT_EQ(problems_of(
                job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"betas", {0.9, 0.99}}}}}}})),
            std::vector<std::string>{
                "optimizer.params.betas: unknown key (valid for SGD: lr, momentum, dampening, "
                "weight_decay, nesterov, maximize, differentiable, foreach)"});
  EXPECT_EQ(problems_of(job_with({{"optimizer", {{"type", "Lion"}, {"params", {{"eps", 1e-8}}}}}})),
            std::vector<std::string>{
                "optimizer.params.eps: unknown key (valid for Lion: lr, betas, weight_decay)"});
  EXPECT_EQ(
      problems_of(job_with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"lr_decy", 0.1}}}}}})),
      std::vector<std::string>{
          "optimizer.params.lr_decy: unknown key; did you mean 'lr_decay'? (valid for Adagrad: "
          "lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize, differentiable, "
          "foreach)"});
  // Adam lists its keys too.
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "Adam"}, {"params", {{"momentum", 0.9}}}}}})),
      "optimizer.params.momentum: unknown key (valid for Adam: lr, betas, eps, "
      "weight_decay, bias_correction, adam_w_mode, torch_adam, amsgrad)"));
  // Values out of range, wrong types, torch's own rules.
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"momentum", -0.1}}}}}})),
      "optimizer.params.momentum:"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"dampening", 1.5}}}}}})),
      "optimizer.params.dampening:"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"nesterov", "yes"}}}}}})),
      "optimizer.params.nesterov:"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"nesterov", true}}}}}})),
      "optimizer.params.nesterov: true needs a momentum > 0 and dampening 0"));
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer",
                     {{"type", "SGD"},
                      {"params", {{"nesterov", true}, {"momentum", 0.9}, {"dampening", 0.1}}}}}})),
      "optimizer.params.nesterov: true needs a momentum > 0 and dampening 0"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"optimizer", {{"type", "SGD"}, {"params", {{"maximize", true}}}}}})),
      "optimizer.params.maximize: true is not supported by zerod (only false)"));
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"optimizer", {{"type", "Adagrad"}, {"params", {{"initial_accumulator_value", -1}}}}}})),
      "optimizer.params.initial_accumulator_value:"));
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "Lion"}, {"params", {{"betas", {0.9, 1.0}}}}}}})),
      "optimizer.params.betas: expected an array of 2 numbers in [0, 1), got [0.9,1.0]"));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"optimizer", {{"type", "Lino"}}}})), "did you mean 'Lion'?"));
}

TEST(ConfigSections, OneCycleMomentumWarnsWithSgdAndAdagrad) {
  const json one_cycle = {{"type", "OneCycle"},
                          {"params", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}}}};
  for (const std::string type : {"SGD", "Adagrad"}) {
    const ParsedJob j =
        parse(job_with({{"optimizer", {{"type", type}}}, {"scheduler", one_cycle}}));
    EXPECT_TRUE(contains(j.warnings, "scheduler.params.cycle_momentum: has no effect with " + type))
        << joined(j.warnings);
  }
  const ParsedJob lion =
      parse(job_with({{"optimizer", {{"type", "Lion"}}}, {"scheduler", one_cycle}}));
  EXPECT_TRUE(lion.warnings.empty()) << joined(lion.warnings);
}

TEST(ConfigSections, Schedulers) {
  const ParsedJob wl = parse(job_with({{"scheduler",
                                        {{"type", "WarmupLR"},
                                         {"params",
                                          {{"warmup_min_lr", 1e-5},
                                           {"warmup_max_lr", 1e-3},
                                           {"warmup_num_steps", 50},
                                           {"warmup_type", "linear"}}}}}}));
  EXPECT_EQ(wl.config.scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(wl.config.scheduler.warmup_min_lr, 1e-5);
  EXPECT_EQ(wl.config.scheduler.warmup_num_steps, 50);
  EXPECT_EQ(wl.config.scheduler.warmup_type, WarmupType::kLinear);

  const ParsedJob oc = parse(job_with({{"scheduler",
                                        {{"type", "OneCycle"},
                                         {"params",
                                          {{"cycle_min_lr", 1e-4},
                                           {"cycle_max_lr", 1e-3},
                                           {"cycle_first_stair_count", 3},
                                           {"cycle_momentum", false}}}}}}));
  EXPECT_EQ(oc.config.scheduler.type, SchedulerType::kOneCycle);
  EXPECT_EQ(oc.config.scheduler.cycle_first_step_size, 2000);  // DeepSpeed default
  EXPECT_FALSE(oc.config.scheduler.cycle_second_step_size.has_value());
  EXPECT_EQ(oc.config.scheduler.cycle_second_stair_count, 3);  // defaults to the first's
  EXPECT_FALSE(oc.config.scheduler.cycle_momentum);

  const ParsedJob cos = parse(job_with(
      {{"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 100}}}}}}));
  EXPECT_EQ(cos.config.scheduler.total_num_steps, 100);
  EXPECT_EQ(cos.config.scheduler.cos_min_ratio, 0.0001);
  EXPECT_EQ(cos.config.scheduler.warmup_num_steps, 1000);
  EXPECT_TRUE(contains(cos.warnings, "is less than warmup_num_steps 1000"));
}

TEST(ConfigSections, SchedulerErrors) {
  EXPECT_TRUE(contains(problems_of(job_with({{"scheduler", {{"type", "LRRangeTest"}}}})),
                       "\"LRRangeTest\" is recognised but not supported by zerod"));
  EXPECT_TRUE(contains(problems_of(job_with({{"scheduler", {{"type", "warmuplr"}}}})),
                       "did you mean 'WarmupLR'?"));
  EXPECT_TRUE(contains(problems_of(job_with({{"scheduler", {{"type", "WarmupDecayLR"}}}})),
                       "scheduler.params.total_num_steps: required for WarmupDecayLR"));
  const auto oc = problems_of(job_with({{"scheduler", {{"type", "OneCycle"}}}}));
  EXPECT_TRUE(contains(oc, "scheduler.params.cycle_min_lr: required for OneCycle")) << joined(oc);
  EXPECT_TRUE(contains(oc, "scheduler.params.cycle_max_lr: required for OneCycle")) << joined(oc);
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "exp"}}}}}})),
      "scheduler.params.warmup_type: \"exp\" is not allowed (allowed: log, linear)"));
  // Keys of another schedule are unknown for this one.
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"cycle_min_lr", 0}}}}}})),
      "scheduler.params.cycle_min_lr: unknown key"));
  // WarmupCosineLR divides by total - max(2, warmup).
  EXPECT_TRUE(contains(
      problems_of(job_with({{"scheduler",
                             {{"type", "WarmupCosineLR"},
                              {"params", {{"total_num_steps", 2}, {"warmup_num_steps", 0}}}}}})),
      "scheduler.params.total_num_steps: 2 must differ from the warmup length 2"));
}

TEST(ConfigSections, Precision) {
  const ParsedJob f = parse(job_with({{"fp16",
                                       {{"enabled", true},
                                        {"loss_scale", 0},
                                        {"initial_scale_power", 12},
                                        {"loss_scale_window", 500},
                                        {"hysteresis", 3},
                                        {"consecutive_hysteresis", true},
                                        {"min_loss_scale", 2}}}}));
  EXPECT_TRUE(f.config.fp16.enabled);
  EXPECT_EQ(f.config.fp16.initial_scale_power, 12);
  EXPECT_EQ(f.config.fp16.loss_scale_window, 500);
  EXPECT_EQ(f.config.fp16.hysteresis, 3);
  EXPECT_TRUE(f.config.fp16.consecutive_hysteresis);
  EXPECT_EQ(f.config.fp16.min_loss_scale, 2.0);
  EXPECT_EQ(f.config.compute_dtype(), DType::kF16);

  EXPECT_EQ(parse(job_with({{"bf16", {{"enabled", true}}}})).config.compute_dtype(), DType::kBF16);

  const auto both =
      problems_of(job_with({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}));
  ASSERT_EQ(both.size(), 1u) << joined(both);
  EXPECT_NE(both[0].find("bf16.enabled"), std::string::npos);
  EXPECT_NE(both[0].find("fp16.enabled"), std::string::npos);

  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"fp16", {{"enabled", true}, {"initial_scale_power", 2}, {"min_loss_scale", 8}}}})),
      "fp16.min_loss_scale: 8 is above the initial dynamic loss scale 2^2 = 4"));
}

TEST(ConfigSections, ZeroAndOverlapComm) {
  const ParsedJob z = parse(job_with({{"zero_optimization",
                                       {{"stage", 2},
                                        {"reduce_bucket_size", 2e8},
                                        {"contiguous_gradients", false},
                                        {"round_robin_gradients", true}}}}));
  EXPECT_EQ(z.config.zero.stage, 2);
  EXPECT_EQ(z.config.zero.reduce_bucket_size, 200000000);
  EXPECT_FALSE(z.config.zero.contiguous_gradients);
  EXPECT_TRUE(z.config.zero.round_robin_gradients);
  EXPECT_FALSE(z.config.zero.overlap_comm_resolved);  // unset below stage 3: false

  EXPECT_TRUE(
      parse(job_with({{"zero_optimization", {{"stage", 3}}}})).config.zero.overlap_comm_resolved);
  const ParsedJob off =
      parse(job_with({{"zero_optimization", {{"stage", 3}, {"overlap_comm", false}}}}));
  EXPECT_FALSE(off.config.zero.overlap_comm_resolved);
  EXPECT_TRUE(parse(job_with({{"zero_optimization", {{"stage", 1}, {"overlap_comm", true}}}}))
                  .config.zero.overlap_comm_resolved);

  // The pydantic field names and their stage3_ aliases are both accepted.
  const ParsedJob alias = parse(job_with({{"zero_optimization",
                                           {{"stage", 3},
                                            {"prefetch_bucket_size", 1234},
                                            {"stage3_max_live_parameters", 99},
                                            {"gather_16bit_weights_on_model_save", true}}}}));
  EXPECT_EQ(alias.config.zero.stage3_prefetch_bucket_size, 1234);
  EXPECT_EQ(alias.config.zero.stage3_max_live_parameters, 99);
  EXPECT_TRUE(alias.config.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(contains(
      problems_of(job_with({{"zero_optimization",
                             {{"prefetch_bucket_size", 1}, {"stage3_prefetch_bucket_size", 2}}}})),
      "zero_optimization.stage3_prefetch_bucket_size: 2 conflicts with prefetch_bucket_size 1"));
}

TEST(ConfigSections, OffloadRules) {
  const ParsedJob nvme =
      parse(job_with({{"zero_optimization",
                       {{"stage", 3},
                        {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/nvme"}}},
                        {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}}}}));
  EXPECT_EQ(nvme.config.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(nvme.config.zero.offload_optimizer.nvme_path, "/nvme");
  EXPECT_EQ(nvme.config.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(nvme.config.zero.offload_param.pin_memory);
  const ParsedJob partial = parse(
      job_with({{"zero_optimization",
                 {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}}}));
  EXPECT_EQ(partial.config.zero.offload_optimizer.ratio, 0.5);
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"zero_optimization",
            {{"stage", 3},
             {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/n"}, {"ratio", 0.5}}}}}})),
      "zero_optimization.offload_optimizer.ratio: 0.5 (partial offload) applies to device "
      "\"cpu\""));

  const auto p =
      problems_of(job_with({{"zero_optimization",
                             {{"stage", 2},
                              {"offload_param", {{"device", "cpu"}}},
                              {"offload_optimizer", {{"device", "nvme"}, {"ratio", 0.5}}}}}}));
  EXPECT_TRUE(contains(
      p, "zero_optimization.offload_param.device: \"cpu\" needs zero_optimization.stage 3"))
      << joined(p);
  EXPECT_TRUE(contains(
      p, "zero_optimization.offload_optimizer.nvme_path: required when device is \"nvme\""))
      << joined(p);
  EXPECT_TRUE(contains(p,
                       "zero_optimization.offload_optimizer.ratio: 0.5 (partial offload) needs "
                       "zero_optimization.stage 3"))
      << joined(p);
  EXPECT_TRUE(contains(
      problems_of(job_with({{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}})),
      "needs zero_optimization.stage 1, 2 or 3, got stage 0"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"zero_optimization", {{"offload_param", {{"device", "gpu"}}}}}})),
      "zero_optimization.offload_param.device: \"gpu\" is not allowed (allowed: none, cpu, nvme)"));
}

TEST(ConfigSections, AioCheckpointActivationMonitors) {
  const ParsedJob j = parse(job_with(
      {{"aio",
        {{"block_size", 262144},
         {"queue_depth", 32},
         {"intra_op_parallelism", 4},
         {"single_submit", true},
         {"overlap_events", false}}},
       {"checkpoint", {{"tag_validation", "FAIL"}, {"load_universal", true}}},
       {"activation_checkpointing",
        {{"partition_activations", true},
         {"contiguous_memory_optimization", true},
         {"number_checkpoints", 4}}},
       {"csv_monitor", {{"enabled", true}, {"output_path", "runs/"}, {"job_name", "gpt2"}}},
       {"comms_logger", {{"enabled", true}, {"prof_ops", {"all_reduce"}}, {"prof_all", false}}}}));
  const JobConfig& c = j.config;
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");  // case-insensitive, canonical spelling kept
  EXPECT_TRUE(c.checkpoint.load_universal);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 4);
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "runs/");
  EXPECT_EQ(c.csv_monitor.job_name, "gpt2");
  EXPECT_EQ(c.comms_logger.prof_ops, std::vector<std::string>{"all_reduce"});
  EXPECT_FALSE(c.comms_logger.prof_all);

  EXPECT_TRUE(
      contains(problems_of(job_with({{"checkpoint", {{"tag_validation", "Loud"}}}})),
               "checkpoint.tag_validation: \"Loud\" is not allowed (allowed: Ignore, Warn, Fail)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"activation_checkpointing",
                                              {{"contiguous_memory_optimization", true}}}})),
                       "needs activation_checkpointing.partition_activations: true"));
}

TEST(ConfigSections, ModelDataTrain) {
  const ParsedJob j = parse(job_with(
      {{"model",
        {{"n_layer", 2},
         {"n_head", 4},
         {"n_embd", 64},
         {"vocab_size", 256},
         {"seq_len", 128},
         {"init_std", 0.01},
         {"activation_checkpointing", true}}},
       {"data", {{"train", "data/train_*.bin"}, {"val", {"a/*.bin", "b/*.bin"}}, {"seed", 7}}},
       {"train",
        {{"steps", 100},
         {"device", "cuda"},
         {"eval_interval", 10},
         {"eval_batches", 5},
         {"keep_last", 2},
         {"checkpoint_dir", "ckpt"},
         {"peak_flops", 1e12},
         {"collective_timeout", 30},
         {"rendezvous_timeout", 60.5},
         {"allow_batch_change", true},
         {"seed", 42}}}}));
  const JobConfig& c = j.config;
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.padded_vocab_size, 256);
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_EQ(c.data.train, std::vector<std::string>{"data/train_*.bin"});
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"a/*.bin", "b/*.bin"}));
  EXPECT_EQ(c.data.seed, 7u);
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_EQ(c.train.device, TrainDevice::kCuda);
  EXPECT_EQ(c.train.eval_interval, 10);
  EXPECT_EQ(c.train.keep_last, 2);
  EXPECT_EQ(c.train.peak_flops, 1e12);
  EXPECT_EQ(c.train.collective_timeout, 30.0);
  EXPECT_EQ(c.train.rendezvous_timeout, 60.5);
  EXPECT_TRUE(c.train.allow_batch_change);
  EXPECT_FALSE(parse(job_with(nlohmann::json::object())).config.train.allow_batch_change);
  EXPECT_EQ(c.train.seed, 42u);

  // padded_vocab_size: up to a multiple of 128.
  for (auto [vocab, padded] :
       {std::pair{1, 128}, {128, 128}, {129, 256}, {50257, 50304}, {65536, 65536}}) {
    EXPECT_EQ(parse(job_with({{"model", {{"vocab_size", vocab}}}})).config.model.padded_vocab_size,
              padded)
        << vocab;
  }

  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"n_embd", 770}, {"n_head", 12}}}})),
                       "model.n_embd: 770 is not divisible by model.n_head 12"));
  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"vocab_size", 70000}}}})),
                       "model.vocab_size: 70000 is out of range (allowed: 1 to 65536)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"type", "gemma"}}}})),
                       "model.type: \"gemma\" is not allowed (allowed: gpt2, llama, mistral, "
                       "qwen2, mixtral)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"val_fraction", 1.0}}}})),
                       "data.val_fraction: 1.0 is out of range (allowed: [0, 1))"));
  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"val", "v.bin"}, {"val_fraction", 0.1}}}})),
                       "data.val_fraction: 0.1 cannot be combined with data.val"));
  EXPECT_TRUE(contains(problems_of(job_with({{"train", {{"eval_interval", 5}}}})),
                       "train.eval_interval: 5 needs validation data"));
  EXPECT_TRUE(contains(problems_of(job_with({{"train", {{"save_interval", 5}}}})),
                       "train.save_interval: 5 needs train.checkpoint_dir"));
  EXPECT_EQ(problems_of(R"({"train_micro_batch_size_per_gpu": 1, "train": {}})"),
            std::vector<std::string>{"train.steps: required (optimizer steps to run)"});
  EXPECT_TRUE(contains(problems_of(R"({"train_micro_batch_size_per_gpu": 1})"), "train: required"));
  EXPECT_TRUE(contains(problems_of(job_with({{"train", {{"steps", 0}}}})),
                       "train.steps: 0 is out of range (allowed: >= 1)"));
  const auto gpu = problems_of(job_with({{"train", {{"steps", 1}, {"device", "gpu"}}}}));
  ASSERT_EQ(gpu.size(), 1u) << joined(gpu);
  EXPECT_NE(gpu[0].find("train.device"), std::string::npos) << gpu[0];
  EXPECT_NE(gpu[0].find("cuda"), std::string::npos) << gpu[0];
}

TEST(ConfigSections, DataDocumentMasking) {
  const DataConfig off = parse(job_with(nlohmann::json::object())).config.data;
  EXPECT_FALSE(off.document_masking);
  EXPECT_FALSE(off.eos_token_id.has_value());
  const ParsedJob on =
      parse(job_with({{"model", {{"vocab_size", 300}}},
                      {"data", {{"document_masking", true}, {"eos_token_id", 299}}}}));
  EXPECT_TRUE(on.config.data.document_masking);
  EXPECT_EQ(on.config.data.eos_token_id, 299);
  EXPECT_TRUE(on.warnings.empty()) << joined(on.warnings);
  // Tensor and sequence parallelism (whole sequences on every rank) are fine.
  EXPECT_TRUE(problems_of(job_with({{"model", {{"n_head", 12}}},
                                    {"parallelism", {{"tensor", 2}, {"sequence_parallel", true}}},
                                    {"data", {{"document_masking", true}, {"eos_token_id", 0}}}}))
                  .empty());

  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"document_masking", "yes"}}}})),
                       "data.document_masking: expected a boolean"));
  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"document_masking", true}}}})),
                       "data.eos_token_id: required with data.document_masking: true"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"data", {{"document_masking", true}, {"eos_token_id", -1}}}})),
      "data.eos_token_id: -1 is out of range"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"model", {{"vocab_size", 300}}},
                            {"data", {{"document_masking", true}, {"eos_token_id", 300}}}})),
      "data.eos_token_id: 300 is not a token of the model: model.vocab_size is 300"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"data", {{"document_masking", true}, {"eos_token_id", 1.5}}}})),
      "data.eos_token_id:"));
  const auto cp =
      problems_of(job_with({{"parallelism", {{"context", 2}}},
                            {"data", {{"document_masking", true}, {"eos_token_id", 5}}}}));
  EXPECT_TRUE(contains(cp,
                       "data.document_masking: true cannot be combined with "
                       "parallelism.context 2"))
      << joined(cp);
  // Without masking an EOS id is only a warning (unused); context parallelism is fine then.
  const ParsedJob unused =
      parse(job_with({{"parallelism", {{"context", 2}}}, {"data", {{"eos_token_id", 5}}}}));
  EXPECT_TRUE(contains(unused.warnings, "data.eos_token_id: 5 is unused"))
      << joined(unused.warnings);
}

TEST(ConfigSections, UnsupportedDeepSpeedFeatures) {
  const auto amp = problems_of(job_with({{"amp", {{"enabled", true}, {"opt_level", "O1"}}}}));
  ASSERT_EQ(amp.size(), 1u) << joined(amp);
  EXPECT_NE(amp[0].find("amp: zerod does not support"), std::string::npos) << amp[0];
  for (const char* key : {"pipeline", "compression_training", "data_efficiency", "flops_profiler",
                          "wandb", "autotuning", "sparse_attention", "curriculum_learning"}) {
    EXPECT_TRUE(contains(problems_of(job_with({{key, {{"some", 1}}}})),
                         std::string(key) + ": zerod does not support"))
        << key;
  }
  // Present but switched off: accepted.
  EXPECT_TRUE(problems_of(job_with({{"amp", {{"enabled", false}}},
                                    {"flops_profiler", {{"enabled", false}, {"profile_step", 1}}},
                                    {"wandb", {{"enabled", false}}}}))
                  .empty());
  // Keys accepted only at DeepSpeed's default.
  EXPECT_TRUE(problems_of(job_with({{"sparse_gradients", false}})).empty());
  EXPECT_TRUE(contains(problems_of(job_with({{"sparse_gradients", true}})),
                       "sparse_gradients: true is not supported by zerod (only false)"));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"zero_optimization", {{"zero_quantized_weights", true}}}})),
               "zero_optimization.zero_quantized_weights: true is not supported by zerod"));
  // Keys with no effect: a warning, not an error.
  const ParsedJob no_op =
      parse(job_with({{"zero_allow_untested_optimizer", true},
                      {"zero_optimization", {{"ignore_unused_parameters", true}}}}));
  EXPECT_TRUE(contains(no_op.warnings,
                       "zero_allow_untested_optimizer: DeepSpeed option that has no effect"));
  EXPECT_TRUE(contains(no_op.warnings, "zero_optimization.ignore_unused_parameters"));
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

using testing_config::contains;
using testing_config::job_with;
using testing_config::parse;
using testing_config::problems_of;

// data.train as a blend of weighted globs, data.tokenizer; both survive job_to_json.
TEST(ConfigSections, DataBlendAndTokenizer) {
  const ParsedJob j = parse(job_with(
      {{"data",
        {{"train",
          {{{"path", "web/*.bin"}, {"weight", 0.7}}, {{"path", "code/*.bin"}, {"weight", 3}}}},
         {"val", "val/*.bin"},
         {"tokenizer", "tok/tokenizer.json"}}}}));
  const DataConfig& d = j.config.data;
  EXPECT_EQ(d.train, (std::vector<std::string>{"web/*.bin", "code/*.bin"}));
  EXPECT_EQ(d.train_weights, (std::vector<double>{0.7, 3.0}));
  EXPECT_EQ(d.tokenizer, "tok/tokenizer.json");
  EXPECT_EQ(parse(job_to_json(j.config).dump()).config, j.config);
  // Plain globs: no weights, no tokenizer.
  const DataConfig plain = parse(job_with({{"data", {{"train", "a/*.bin"}}}})).config.data;
  EXPECT_TRUE(plain.train_weights.empty());
  EXPECT_TRUE(plain.tokenizer.empty());
  EXPECT_FALSE(
      job_to_json(parse(job_with({{"data", {{"train", "a/*.bin"}}}})).config)["data"].contains(
          "tokenizer"));

  auto blend = [](const nlohmann::json& train) {
    return problems_of(job_with({{"data", {{"train", train}, {"val", "v.bin"}}}}));
  };
  EXPECT_TRUE(
      contains(blend({{{"path", "a"}, {"weight", 0}}}), "data.train[0].weight: 0 is out of range"));
  EXPECT_TRUE(contains(blend({{{"path", "a"}, {"weight", -1}}}), "data.train[0].weight"));
  EXPECT_TRUE(contains(blend({{{"path", "a"}}}), "data.train[0].weight: required"));
  EXPECT_TRUE(contains(blend({{{"weight", 1}}}), "data.train[0].path: required"));
  EXPECT_TRUE(
      contains(blend({{{"path", ""}, {"weight", 1}}}), "data.train[0].path: must not be empty"));
  EXPECT_TRUE(contains(blend({{{"path", "a"}, {"weight", "high"}}}), "data.train[0].weight"));
  EXPECT_TRUE(
      contains(blend({{{"path", "a"}, {"weight", 1}, {"wieght", 2}}}), "data.train[0].wieght"));
  EXPECT_TRUE(contains(blend({{{"path", "a"}, {"weight", 1}}, "b/*.bin"}), "data.train[1]"));
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"data", {{"train", {{{"path", "a"}, {"weight", 1}}}}, {"val_fraction", 0.1}}}})),
      "data.val_fraction: 0.1 cannot be combined with a blend"));
  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"tokenizer", ""}}}})),
                       "data.tokenizer: must not be empty"));
  EXPECT_TRUE(contains(problems_of(job_with({{"data", {{"tokenizer", 7}}}})), "data.tokenizer"));
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

// Muon: torch.optim.Muon's defaults for the matrices, DeepSpeed's Muon keys for the auxiliary
// AdamW (lr for both unless muon_lr / adam_lr; betas and eps are the AdamW's), the Newton-Schulz
// keys torch names (eps as ns_eps); the result parses back from job_to_json.
TEST(ConfigSections, MuonDefaultsAndDeepSpeedKeys) {
  const ParsedJob d = parse(job_with({{"optimizer", {{"type", "muon"}}}}));
  const OptimizerConfig& o = d.config.optimizer;
  EXPECT_EQ(o.type, "Muon");
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.adam_lr, 1e-3);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.adam_weight_decay, 0.1);
  EXPECT_EQ(o.momentum, 0.95);
  EXPECT_TRUE(o.nesterov);
  EXPECT_EQ(o.ns_coefficients, (std::vector<double>{3.4445, -4.775, 2.0315}));
  EXPECT_EQ(o.ns_eps, 1e-7);
  EXPECT_EQ(o.ns_steps, 5);
  EXPECT_EQ(o.adjust_lr_fn, "original");
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.95);
  EXPECT_EQ(o.eps, 1e-10);
  const ParsedJob g = parse(job_with({{"optimizer",
                                       {{"type", "Muon"},
                                        {"params",
                                         {{"lr", 0.01},
                                          {"muon_lr", 0.02},
                                          {"adam_weight_decay", 0.0},
                                          {"nesterov", false},
                                          {"ns_coefficients", {2.0, -1.5, 0.5}},
                                          {"ns_eps", 1e-6},
                                          {"ns_steps", 3},
                                          {"adjust_lr_fn", "match_rms_adamw"},
                                          {"betas", {0.8, 0.95}},
                                          {"eps", 1e-8},
                                          {"use_addmm", true}}}}}}));
  const OptimizerConfig& q = g.config.optimizer;
  EXPECT_EQ(q.lr, 0.02);
  EXPECT_EQ(q.adam_lr, 0.01);
  EXPECT_EQ(q.weight_decay, 0.1);
  EXPECT_EQ(q.adam_weight_decay, 0.0);
  EXPECT_FALSE(q.nesterov);
  EXPECT_EQ(q.ns_coefficients, (std::vector<double>{2.0, -1.5, 0.5}));
  EXPECT_EQ(q.ns_eps, 1e-6);
  EXPECT_EQ(q.ns_steps, 3);
  EXPECT_EQ(q.adjust_lr_fn, "match_rms_adamw");
  EXPECT_EQ(q.beta1, 0.8);
  EXPECT_EQ(q.eps, 1e-8);
  EXPECT_EQ(parse(job_to_json(g.config).dump()).config.optimizer, q);
}

TEST(ConfigSections, MuonBadInputNamesTheKey) {
  auto muon = [](const json& params) {
    return problems_of(job_with({{"optimizer", {{"type", "Muon"}, {"params", params}}}}));
  };
  EXPECT_TRUE(contains(muon({{"ns_steps", 100}}), "optimizer.params.ns_steps:"));
  EXPECT_TRUE(contains(muon({{"ns_steps", -1}}), "optimizer.params.ns_steps:"));
  EXPECT_TRUE(contains(muon({{"momentum", 1.0}}), "optimizer.params.momentum:"));
  EXPECT_TRUE(contains(muon({{"muon_lr", -0.1}}), "optimizer.params.muon_lr:"));
  EXPECT_TRUE(contains(muon({{"ns_coefficients", {1.0, 2.0}}}),
                       "optimizer.params.ns_coefficients: expected an array of 3 numbers (a, b, "
                       "c), got [1.0,2.0]"));
  EXPECT_TRUE(contains(muon({{"adjust_lr_fn", "rms"}}),
                       "optimizer.params.adjust_lr_fn: \"rms\" is not one of null, \"original\", "
                       "\"match_rms_adamw\""));
  EXPECT_TRUE(contains(muon({{"ns_step", 3}}),
                       "optimizer.params.ns_step: unknown key; did you mean 'ns_steps'?"));
  EXPECT_TRUE(contains(muon({{"foreach", true}}), "optimizer.params.foreach:"));
  // A GPU job with the optimizer states on the device is refused; tensor parallelism is not.
  auto muon_job = [](const json& more) {
    json j = more;
    j["optimizer"] = {{"type", "Muon"}};
    return problems_of(job_with(j));
  };
  EXPECT_TRUE(muon_job({{"parallelism", {{"tensor", 2}}}}).empty());
  const json cuda = {{"device", "cuda"}};
  EXPECT_TRUE(contains(muon_job({{"train", cuda}, {"zero_optimization", {{"stage", 1}}}}),
                       "zero_optimization.offload_optimizer.device: optimizer Muon on "
                       "train.device cuda at stage 1"));
  // Stage 0: the trainer keeps the states on the host itself (offload cannot be set there).
  EXPECT_FALSE(contains(muon_job({{"train", cuda}}), "optimizer Muon"));
  const json offloaded = {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}};
  EXPECT_FALSE(
      contains(muon_job({{"train", cuda}, {"zero_optimization", offloaded}}), "optimizer Muon"));
  // ... on any number of data-parallel GPUs (the exchange goes over the host communicator).
  json gpus = json::parse(job_with({{"train", cuda}, {"zero_optimization", offloaded}}));
  gpus["optimizer"] = {{"type", "Muon"}};
  JobConfig one = parse(gpus.dump()).config, two = one;
  EXPECT_NO_THROW(resolve_job(one, 1));
  EXPECT_NO_THROW(resolve_job(two, 2));
}

}  // namespace
}  // namespace zerod
