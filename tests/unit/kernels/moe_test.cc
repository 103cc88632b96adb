// The mixture-of-experts kernels (kernels/cpu/moe_router.h, moe_permute.h, grouped_matmul.h)
// against torch: tests/unit/kernels/moe_reference.py (Debian's python3 with python3-torch)
// writes the router's outputs and gradients for random and adversarial routings (ties, every
// token to one expert, empty experts, capacity above N, k = E, one expert) under every drop
// policy and both aux losses (Hugging Face's, DeepSpeed's top-1/2/k), and whole layers (router
// matmul, router, permutation, grouped matmul, combine) with every gradient. The routing is torch's
// fp32 decision, the values and gradients torch's float64 autograd on the same fp32 inputs and
// decisions (so the reference is exact and zerod's fp32 is judged, not the two fp32 rounding
// patterns against each other). Floats must agree within 1e-5 relative (an element's error over
// max(|torch|, 5e-2 * the largest |torch| of the tensor): an element that cancels to ~0 is judged
// on the tensor's scale, as an fp32 sum of larger terms cannot do better there; torch's own fp32
// autograd is printed beside zerod's for the router); chosen experts, dropped slots, counts and
// capacities exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/grouped_matmul.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/torch_reference.h"

namespace zerod::cpu {
namespace {

using Json = nlohmann::json;
using VecF = std::vector<float>;
using VecI = std::vector<int32_t>;
using VecL = std::vector<int64_t>;

const Json& references() {
  static const Json refs = testing::run_torch_reference("moe_reference.py");
  return refs;
}

#define REQUIRE_REFERENCES()                                                                 \
  ASSERT_TRUE(references().contains("router"))                                               \
      << "tests/unit/kernels/moe_reference.py failed: it needs /usr/bin/python3 with torch " \
         "(python3-torch, tools/deps.sh)"

// The largest error of got against want, each relative to max(|want|, 5e-2 * max |want|).
double worst_relative(const VecF& got, const Json& want) {
  double scale = 0;
  for (const auto& w : want) scale = std::max(scale, std::fabs(w.get<double>()));
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    worst = std::max(worst, std::fabs(got[i] - w) / std::max({std::fabs(w), 5e-2 * scale, 1e-30}));
  }
  return worst;
}

// got within 1e-5 of want (worst_relative).
void expect_close(const VecF& got, const Json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double worst = worst_relative(got, want);
  EXPECT_LE(worst, 1e-5) << what << ": beyond 1e-5 relative";
}

void expect_close(double got, double want, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), 1e-5 * std::fabs(want) + 1e-12)
      << what << ": " << got << " vs torch " << want;
}

MoeRouterOptions options_of(const Json& o) {
  MoeRouterOptions r;
  r.num_experts = o["num_experts"];
  r.top_k = o["top_k"];
  r.renormalize = o["renormalize"];
  r.drop_tokens = o["drop_tokens"];
  r.capacity_factor = o["capacity_factor"];
  r.min_capacity = o["min_capacity"];
  const std::string p = o["drop_policy"];
  r.drop_policy = p == "probs"      ? MoeDropPolicy::kProbs
                  : p == "position" ? MoeDropPolicy::kPosition
                                    : MoeDropPolicy::kChoiceRank;
  r.aux_loss = o["aux_loss"] == "hf" ? MoeAuxLoss::kHuggingFace : MoeAuxLoss::kDeepSpeed;
  return r;
}

// The router's forward outputs for N rows.
struct Routed {
  VecF probs, lse, weight;
  VecI expert;
  VecL aux_counts, kept;
  MoeRouterStats stats;
  Routed(const VecF& logits, int64_t N, const MoeRouterOptions& o)
      : probs(logits.size()),
        lse(static_cast<size_t>(N)),
        weight(static_cast<size_t>(N * o.top_k)),
        expert(weight.size()),
        aux_counts(static_cast<size_t>(o.num_experts)),
        kept(aux_counts.size()) {
    stats = moe_router_forward(probs.data(), lse.data(), expert.data(), weight.data(),
                               aux_counts.data(), kept.data(), nullptr, logits.data(), N, o);
  }
};

TEST(MoeRouter, MatchesTorchOnRandomAndAdversarialRoutings) {
  REQUIRE_REFERENCES();
  ASSERT_EQ(references()["router"].size(), 20u);
  for (const Json& c : references()["router"]) {
    const std::string what = c["name"];
    const MoeRouterOptions o = options_of(c["options"]);
    const int64_t N = c["N"];
    const VecF logits = c["logits"].get<VecF>();
    const Routed r(logits, N, o);
    // Exact: the chosen experts with the dropped slots (-1), counts, capacity.
    EXPECT_EQ(r.expert, c["expert"].get<VecI>()) << what << ": experts / dropped slots";
    EXPECT_EQ(r.aux_counts, c["aux_counts"].get<VecL>()) << what << ": aux counts";
    EXPECT_EQ(r.kept, c["kept"].get<VecL>()) << what << ": kept counts";
    EXPECT_EQ(r.stats.capacity, c["capacity"].get<int64_t>()) << what << ": capacity";
    const int64_t dropped = std::count(r.expert.begin(), r.expert.end(), -1);
    EXPECT_EQ(r.stats.dropped, dropped) << what;
    expect_close(r.probs, c["probs"], what + " probs");
    expect_close(r.lse, c["lse"], what + " lse");
    expect_close(r.weight, c["weight"], what + " weights");
    expect_close(r.stats.aux_loss, c["aux"].get<double>(), what + " aux loss");
    expect_close(r.stats.z_loss, c["z"].get<double>(), what + " z loss");

    const VecF dweight = c["dweight"].get<VecF>();
    MoeRouterLossGrad lg;
    lg.aux_coef = c["options"]["aux_coef"];
    lg.aux_counts = r.aux_counts.data();
    lg.aux_tokens = N;
    lg.z_coef = c["options"]["z_coef"];
    VecF dlogits(logits.size(), 123.0f);  // overwritten
    moe_router_backward(dlogits.data(), dweight.data(), r.probs.data(), r.lse.data(),
                        r.expert.data(), N, o, lg);
    expect_close(dlogits, c["dlogits"], what + " dlogits");
    // For the record: torch's own fp32 autograd against the same exact values.
    std::printf("%-36s dlogits worst relative error: zerod %.2e, torch fp32 %.2e\n", what.c_str(),
                worst_relative(dlogits, c["dlogits"]),
                worst_relative(c["dlogits_fp32"].get<VecF>(), c["dlogits"]));
  }
}

// A whole layer as a model would run it, every gradient against torch's autograd.
TEST(MoeLayer, RouterPermuteGroupedMatmulCombineMatchTorch) {
  REQUIRE_REFERENCES();
  ASSERT_EQ(references()["layer"].size(), 4u);
  for (const Json& c : references()["layer"]) {
    const std::string what = c["name"];
    const MoeRouterOptions o = options_of(c["options"]);
    const int64_t N = c["N"];
    const int C = c["C"], OC = c["OC"], E = o.num_experts, k = o.top_k;
    const VecF x = c["x"].get<VecF>(), wg = c["wg"].get<VecF>(), w = c["w"].get<VecF>(),
               b = c["b"].get<VecF>(), dy = c["dy"].get<VecF>(),
               rbias = c["router_bias"].get<VecF>();

    // Forward.
    VecF logits(static_cast<size_t>(N * E));
    matmul_forward(logits.data(), x.data(), wg.data(), rbias.data(), N, C, E);
    const Routed r(logits, N, o);
    EXPECT_EQ(r.expert, c["expert"].get<VecI>()) << what;
    EXPECT_EQ(r.kept, c["kept"].get<VecL>()) << what;
    VecL offsets(static_cast<size_t>(E + 1));
    VecI row_token(static_cast<size_t>(N * k)), slot_row(static_cast<size_t>(N * k));
    const int64_t R = moe_permute_plan(offsets.data(), row_token.data(), slot_row.data(),
                                       r.expert.data(), N, k, E);
    for (int e = 0; e < E; ++e) EXPECT_EQ(offsets[e + 1] - offsets[e], r.kept[e]) << what;
    VecF xp(static_cast<size_t>(R * C)), yp(static_cast<size_t>(R * OC));
    VecF y(static_cast<size_t>(N * OC), 7.0f);  // overwritten
    moe_permute_forward(xp.data(), x.data(), row_token.data(), R, C);
    grouped_matmul_forward(yp.data(), xp.data(), w.data(), b.data(), offsets.data(), E, C, OC);
    moe_unpermute_forward(y.data(), yp.data(), r.weight.data(), slot_row.data(), N, k, OC);
    expect_close(y, c["y"], what + " y");
    expect_close(r.stats.aux_loss, c["aux"].get<double>(), what + " aux");
    expect_close(r.stats.z_loss, c["z"].get<double>(), what + " z");

    // Backward.
    VecF dyp(yp.size(), 5.0f), dweight(static_cast<size_t>(N * k), 5.0f);
    moe_unpermute_backward(dyp.data(), dweight.data(), dy.data(), yp.data(), r.weight.data(),
                           slot_row.data(), N, k, OC);
    VecF dxp(xp.size(), 3.0f), dw(w.size(), 0.0f), db(b.size(), 0.0f);
    grouped_matmul_backward(dxp.data(), dw.data(), db.data(), dyp.data(), xp.data(), w.data(),
                            offsets.data(), E, C, OC, /*accumulate_dinp=*/false);
    VecF dx(x.size(), 0.0f);
    moe_permute_backward(dx.data(), dxp.data(), slot_row.data(), N, k, C);
    MoeRouterLossGrad lg;
    lg.aux_coef = c["options"]["aux_coef"];
    lg.aux_counts = r.aux_counts.data();
    lg.aux_tokens = N;
    lg.z_coef = c["options"]["z_coef"];
    VecF dlogits(logits.size());
    moe_router_backward(dlogits.data(), dweight.data(), r.probs.data(), r.lse.data(),
                        r.expert.data(), N, o, lg);
    VecF dwg(wg.size(), 0.0f);
    matmul_backward(dx.data(), dwg.data(), nullptr, dlogits.data(), x.data(), wg.data(), N, C, E,
                    /*accumulate_dinp=*/true);
    expect_close(dx, c["dx"], what + " dx");
    expect_close(dwg, c["dwg"], what + " d router weight");
    expect_close(dw, c["dw"], what + " d expert weights");
    expect_close(db, c["db"], what + " d expert biases");
  }
}

}  // namespace
}  // namespace zerod::cpu
