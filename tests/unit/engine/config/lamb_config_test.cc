// The "Lamb" optimizer section: DeepSpeed FusedLamb's defaults and keys, its refusals
// (max_grad_norm, amsgrad), the trust-ratio clamp's range, and job_to_json's round trip.
#include <gtest/gtest.h>

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

std::vector<std::string> lamb_problems(const json& params) {
  return problems_of(job_with({{"optimizer", {{"type", "Lamb"}, {"params", params}}}}));
}

TEST(LambConfig, FusedLambDefaultsAndParams) {
  const ParsedJob d = parse(job_with({{"optimizer", {{"type", "lamb"}}}}));
  const OptimizerConfig& o = d.config.optimizer;
  EXPECT_TRUE(d.warnings.empty()) << joined(d.warnings);
  EXPECT_EQ(o.type, "Lamb");
  EXPECT_EQ(o.lr, 1e-3);  // deepspeed/ops/lamb/fused_lamb.py
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_FALSE(o.eps_inside_sqrt);
  EXPECT_EQ(o.weight_decay, 0.0);
  EXPECT_TRUE(o.bias_correction);
  EXPECT_EQ(o.max_coeff, 10.0);
  EXPECT_EQ(o.min_coeff, 0.01);

  const ParsedJob g = parse(job_with({{"optimizer",
                                       {{"type", "Lamb"},
                                        {"params",
                                         {{"lr", 2e-3},
                                          {"betas", {0.8, 0.95}},
                                          {"eps", 1e-6},
                                          {"eps_inside_sqrt", true},
                                          {"weight_decay", 0.01},
                                          {"bias_correction", false},
                                          {"max_coeff", 0.3},
                                          {"min_coeff", 0.05},
                                          {"amsgrad", false}}}}}}));
  EXPECT_TRUE(g.warnings.empty()) << joined(g.warnings);
  const OptimizerConfig& q = g.config.optimizer;
  EXPECT_EQ(q.lr, 2e-3);
  EXPECT_EQ(q.beta1, 0.8);
  EXPECT_EQ(q.beta2, 0.95);
  EXPECT_EQ(q.eps, 1e-6);
  EXPECT_TRUE(q.eps_inside_sqrt);
  EXPECT_EQ(q.weight_decay, 0.01);
  EXPECT_FALSE(q.bias_correction);
  EXPECT_EQ(q.max_coeff, 0.3);
  EXPECT_EQ(q.min_coeff, 0.05);
}

TEST(LambConfig, BadInputNamesTheKeyAndListsTheValidOnes) {
  EXPECT_EQ(lamb_problems({{"momentum", 0.9}}),
            std::vector<std::string>{
                "optimizer.params.momentum: unknown key (valid for Lamb: lr, betas, eps, "
                "eps_inside_sqrt, weight_decay, bias_correction, max_coeff, min_coeff, amsgrad)"});
  EXPECT_TRUE(contains(lamb_problems({{"max_coef", 1.0}}),
                       "optimizer.params.max_coef: unknown key; did you mean 'max_coeff'?"));
  // Clipping is the top-level gradient_clipping, as for Adam.
  const auto mgn = lamb_problems({{"max_grad_norm", 1.0}});
  ASSERT_EQ(mgn.size(), 1u) << joined(mgn);
  EXPECT_NE(mgn[0].find("optimizer.params.max_grad_norm: not supported as an optimizer "
                        "parameter"),
            std::string::npos)
      << mgn[0];
  EXPECT_NE(mgn[0].find("gradient_clipping"), std::string::npos);
  EXPECT_TRUE(contains(lamb_problems({{"amsgrad", true}}),
                       "optimizer.params.amsgrad: true is not supported by zerod (only false: "
                       "FusedLamb has no AMSGrad variant)"));
  // The clamp: non-negative coefficients, min_coeff <= max_coeff.
  EXPECT_TRUE(contains(lamb_problems({{"max_coeff", -1.0}}), "optimizer.params.max_coeff:"));
  EXPECT_TRUE(contains(lamb_problems({{"min_coeff", -0.5}}), "optimizer.params.min_coeff:"));
  EXPECT_EQ(lamb_problems({{"min_coeff", 2.0}, {"max_coeff", 1.0}}),
            std::vector<std::string>{"optimizer.params.min_coeff: 2 is above max_coeff 1 (the "
                                     "trust ratio is clamped to [min_coeff, max_coeff])"});
  EXPECT_TRUE(contains(lamb_problems({{"betas", {0.9, 1.0}}}),
                       "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"));
  EXPECT_TRUE(
      contains(lamb_problems({{"eps_inside_sqrt", 1}}), "optimizer.params.eps_inside_sqrt:"));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"optimizer", {{"type", "Lamp"}}}})), "did you mean 'Lamb'?"));
}

// job_to_json prints Lamb's parameters only, and they parse back to the same configuration.
TEST(LambConfig, RoundTripsThroughJobToJson) {
  for (const json& params : {json::object(), json{{"lr", 2e-3},
                                                  {"betas", {0.8, 0.95}},
                                                  {"eps_inside_sqrt", true},
                                                  {"weight_decay", 0.01},
                                                  {"bias_correction", false},
                                                  {"max_coeff", 0.3},
                                                  {"min_coeff", 0.05}}}) {
    json j = testing_config::minimal_job();
    j["optimizer"] = {{"type", "Lamb"}, {"params", params}};
    ParsedJob job = parse(j.dump());
    resolve_job(job.config, 2);
    const json out = job_to_json(job.config);
    const ParsedJob back = parse(out.dump());
    EXPECT_EQ(back.config, job.config) << params;
    EXPECT_TRUE(back.warnings.empty()) << joined(back.warnings);
    std::set<std::string> printed;
    for (const auto& [k, v] : out["optimizer"]["params"].items()) printed.insert(k);
    EXPECT_EQ(printed,
              (std::set<std::string>{"lr", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                                     "bias_correction", "max_coeff", "min_coeff"}));
  }
}

}  // namespace
}  // namespace zerod
