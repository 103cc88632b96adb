// zerod_moe_bench: the dropless grouped matmul (kernels/cpu/grouped_matmul.h) against a padded
// batched matmul, every expert padded to the largest expert's row count (the capacity buffer a
// dropless DeepSpeed layer sizes from max(exp_counts)), on skewed routing: R = tokens x top_k
// assignments spread over E experts with Zipf-like counts, count_r ~ 1 / r^s for the r-th
// expert (s = 0: balanced). Both run the same sgemm engine (the padding rows are real zero
// rows, computed); the time is forward + backward (dinp and dweight) of one expert matmul
// (C -> OC), median of --reps, and the ratio is padded / grouped.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/grouped_matmul.h"
#include "kernels/cpu/matmul.h"
#include "tools/bench/bench_timing.h"

namespace {

// R rows over E experts, count_r proportional to 1 / r^s (largest-remainder rounding).
std::vector<int64_t> zipf_counts(int64_t R, int E, double s) {
  std::vector<double> share(static_cast<size_t>(E));
  double total = 0;
  for (int r = 0; r < E; ++r) total += share[static_cast<size_t>(r)] = std::pow(r + 1.0, -s);
  std::vector<int64_t> c(static_cast<size_t>(E));
  std::vector<std::pair<double, int>> rem;
  int64_t given = 0;
  for (int r = 0; r < E; ++r) {
    const double exact = static_cast<double>(R) * share[static_cast<size_t>(r)] / total;
    c[static_cast<size_t>(r)] = static_cast<int64_t>(std::floor(exact));
    given += c[static_cast<size_t>(r)];
    rem.emplace_back(exact - std::floor(exact), r);
  }
  std::sort(rem.begin(), rem.end(), [](auto a, auto b) { return a.first > b.first; });
  for (int64_t i = 0; i < R - given; ++i)
    ++c[static_cast<size_t>(rem[static_cast<size_t>(i)].second)];
  return c;
}

struct Row {
  double s = 0;
  int64_t max_count = 0;
  double grouped = 0, padded = 0;  // seconds per forward + backward
};

Row measure(int64_t R, int E, int C, int OC, double s, int reps, bool bf16) {
  const std::vector<int64_t> counts = zipf_counts(R, E, s);
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[static_cast<size_t>(e)];
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> padded_offsets(static_cast<size_t>(E + 1));
  for (int e = 0; e <= E; ++e) padded_offsets[e] = e * max_count;
  const int64_t P = E * max_count;

  auto fill = [](std::vector<float>& v, float scale) {
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = scale * static_cast<float>((i * 7919) % 1000) / 1000;
  };
  std::vector<float> w(static_cast<size_t>(E) * OC * C), dw(w.size());
  fill(w, 0.02f);
  // Grouped: R rows. Padded: P rows, each expert's real rows then zero rows.
  std::vector<float> x(static_cast<size_t>(R * C)), y(static_cast<size_t>(R * OC)),
      dy(static_cast<size_t>(R * OC)), dx(x.size());
  fill(x, 1.0f);
  fill(dy, 1.0f);
  std::vector<float> xp(static_cast<size_t>(P * C), 0.0f), yp(static_cast<size_t>(P * OC)),
      dyp(static_cast<size_t>(P * OC), 0.0f), dxp(xp.size());
  for (int e = 0; e < E; ++e) {
    std::copy_n(x.begin() + offsets[e] * C, counts[e] * C, xp.begin() + e * max_count * C);
    std::copy_n(dy.begin() + offsets[e] * OC, counts[e] * OC, dyp.begin() + e * max_count * OC);
  }
  auto step = [&](const std::vector<int64_t>& off, std::vector<float>& in, std::vector<float>& out,
                  std::vector<float>& dout, std::vector<float>& din) {
    zerod::cpu::grouped_matmul_forward(out.data(), in.data(), w.data(), nullptr, off.data(), E, C,
                                       OC, bf16);
    zerod::cpu::grouped_matmul_backward(din.data(), dw.data(), nullptr, dout.data(), in.data(),
                                        w.data(), off.data(), E, C, OC, false, bf16);
  };
  Row row;
  row.s = s;
  row.max_count = max_count;
  // Warm-up, then alternate blocks so drifts of a shared machine hit both alike.
  step(offsets, x, y, dy, dx);
  step(padded_offsets, xp, yp, dyp, dxp);
  std::vector<double> tg, tp;
  for (int block = 0; block < 2; ++block) {
    const int n = std::max(1, reps / 2);
    const auto g = zerod::bench::time_each(n, [&] { step(offsets, x, y, dy, dx); });
    const auto p = zerod::bench::time_each(n, [&] { step(padded_offsets, xp, yp, dyp, dxp); });
    tg.push_back(g.median);
    tp.push_back(p.median);
  }
  row.grouped = *std::min_element(tg.begin(), tg.end());
  row.padded = *std::min_element(tp.begin(), tp.end());
  return row;
}

int run(int argc, char** argv) {
  CLI::App app{"zerod_moe_bench: dropless grouped matmul vs padded batched matmul, skewed routing"};
  int64_t tokens = 2048;
  int top_k = 2, experts = 8, C = 512, OC = 1024, reps = 6;
  std::vector<double> skews = {0.0, 0.5, 1.0, 1.5, 2.0};
  bool bf16 = false;
  app.add_option("--tokens", tokens, "tokens routed (N)")->check(CLI::PositiveNumber);
  app.add_option("--top-k", top_k, "assignments per token (k)")->check(CLI::PositiveNumber);
  app.add_option("--experts", experts, "experts (E)")->check(CLI::PositiveNumber);
  app.add_option("--C", C, "expert input channels")->check(CLI::PositiveNumber);
  app.add_option("--OC", OC, "expert output channels")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed forward + backward steps per variant")
      ->check(CLI::PositiveNumber);
  app.add_option("--zipf", skews, "Zipf exponents s of the expert counts (count_r ~ 1/r^s)");
  app.add_flag("--bf16", bf16, "bf16 products (bf16_gemm.h) instead of fp32 sgemm");
  CLI11_PARSE(app, argc, argv);

  const int64_t R = tokens * top_k;
  std::printf(
      "zerod_moe_bench: %lld tokens x top-%d = %lld rows over %d experts, C=%d OC=%d, %s, %d "
      "threads; forward + backward (dinp, dweight) per call, best of 2 medians of %d\n",
      static_cast<long long>(tokens), top_k, static_cast<long long>(R), experts, C, OC,
      bf16 ? "bf16 products" : "fp32", omp_get_max_threads(), std::max(1, reps / 2));
  std::printf("%6s  %9s  %11s  %12s  %11s  %12s  %6s\n", "zipf s", "max rows", "padded rows",
              "rows ratio", "grouped ms", "padded ms", "ratio");
  for (double s : skews) {
    const Row r = measure(R, experts, C, OC, s, reps, bf16);
    const double rows_ratio = static_cast<double>(r.max_count * experts) / static_cast<double>(R);
    std::printf("%6.2f  %9lld  %11lld  %12.2f  %11.2f  %12.2f  %6.2f\n", r.s,
                static_cast<long long>(r.max_count), static_cast<long long>(r.max_count * experts),
                rows_ratio, r.grouped * 1e3, r.padded * 1e3, r.padded / r.grouped);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (...) {
    return zerod::report_current_exception("zerod_moe_bench");
  }
}
