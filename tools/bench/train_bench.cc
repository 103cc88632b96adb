// CPU training benchmark, zerod side: one fixed shape (the issue's), synthetic tokens, the real
// trainer. Prints tokens/s (median over the measured steps), achieved GFLOP/s, the sgemm rates
// of our matmul engine and of OpenBLAS measured in the same run, and where the step time goes.
// --model llama trains the Llama bench shape instead (4 layers, hidden 256, 4 heads / 2 KV heads,
// SwiGLU 688, vocabulary 32000, untied output head; seq, micro-batch, dtype as for GPT-2).
//
//   zerod_train_bench [--model gpt2|llama] [--steps N] [--warmup N] [--layers L] [--embd C]
//                     [--heads H] [--kv-heads K] [--intermediate I] [--seq T] [--batch B]
//                     [--vocab V] [--dtype fp32|bf16] [--json]
// tools/bench/train_bench.sh runs it next to the PyTorch reference and prints the ratio.
#include <cblas.h>
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "bench_job.h"
#include "core/cpu_info.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "core/rng.h"
#include "core/timer.h"
#include "engine/train/memory_preflight.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"

namespace {

using namespace zerod;

double sgemm_rate(cpu::GemmImpl impl, bool ta, bool tb, int M, int N, int K) {
  const cpu::GemmImpl saved = cpu::gemm_impl();
  cpu::set_gemm_impl(impl);
  std::vector<float> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N);
  fill_normal(a.data(), static_cast<int64_t>(a.size()), 0, 1, 1, 0);
  fill_normal(b.data(), static_cast<int64_t>(b.size()), 0, 1, 1, 1);
  const int lda = ta ? M : K, ldb = tb ? K : N;
  double best = 1e30;
  Stopwatch total;
  for (int i = 0; i < 50 && (i < 4 || total.seconds() < 1.0); ++i) {
    Stopwatch sw;
    cpu::sgemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N);
    if (i > 0) best = std::min(best, sw.seconds());
  }
  cpu::set_gemm_impl(saved);
  return 2.0 * M * N * K / best / 1e9;
}

// The bf16 products' rate (GFLOP/s) on operands converted beforehand (what the CPU's bf16
// dot-product engine gives), 0 where bf16 mode computes its products in fp32.
double bf16_gemm_rate(bool ta, bool tb, int M, int N, int K) {
  if (!cpu::bf16_gemm_unavailable().empty()) return 0;
  std::vector<float> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N);
  fill_normal(a.data(), static_cast<int64_t>(a.size()), 0, 1, 1, 0);
  fill_normal(b.data(), static_cast<int64_t>(b.size()), 0, 1, 1, 1);
  std::vector<uint16_t> a16, b16;
  const cpu::Bf16Operand A = cpu::to_bf16(a16, a.data(), ta ? K : M, ta ? M : K, ta ? M : K);
  const cpu::Bf16Operand B = cpu::to_bf16(b16, b.data(), tb ? N : K, tb ? K : N, tb ? K : N);
  double best = 1e30;
  Stopwatch total;
  for (int i = 0; i < 50 && (i < 4 || total.seconds() < 1.0); ++i) {
    Stopwatch sw;
    cpu::bf16_gemm(ta, tb, M, N, K, A, B, 0.0f, c.data(), N);
    if (i > 0) best = std::min(best, sw.seconds());
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  // Resident before anything of ours runs: code, the libraries' data and relocations (with the
  // CUDA backend compiled in, libcublasLt alone is ~140 MiB of it, loaded in CPU runs too).
  const int64_t rss_start = resident_bytes();
  log::init();
  CLI::App app{"zerod CPU training benchmark"};
  int steps = 10, warmup = 2;
  bench::BenchShape shape;
  bool json = false;
  app.add_option("--steps", steps, "measured steps")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured first steps")->capture_default_str();
  shape.add_options(app);
  shape.add_model_options(app);
  app.add_flag("--json", json, "end with one JSON line of the results (for train_bench.sh)");
  CLI11_PARSE(app, argc, argv);
  shape.apply_model_defaults(app);
  const bool llama = shape.model == "llama";
  spdlog::set_level(spdlog::level::warn);

  const int layers = shape.layers, embd = shape.embd, heads = shape.heads, seq = shape.seq,
            batch = shape.batch, vocab = shape.vocab;
  const std::string& dtype = shape.dtype;
  const bench::SyntheticData data(shape, int64_t{batch} * (steps + warmup + 2));
  const JobConfig job = bench::bench_job(shape, data, steps + warmup, 1);
  TrainerOptions opts;
  opts.log_steps = false;
  Trainer trainer(job, opts);
  const TrainResult r = trainer.run();
  // Peak resident memory of the whole process over the training (before the sgemm rates below
  // allocate their matrices), against the planner's model states + activations + buffers: the
  // bytes the job allocates, which the planner models, and with the process's own start-up
  // resident bytes added (measured, not predicted).
  const int64_t peak_rss = peak_resident_bytes();
  const Plan plan = make_plan(job_plan_request(
      job, trainer.model().spec(), static_cast<int>(trainer.backend().compute_elem_size())));
  const PlanRow* planned = job_plan_row(plan, job);
  const int64_t predicted = planned ? planned->device + planned->host : 0;
  const double mib = 1024.0 * 1024.0;
  std::vector<double> step_seconds;
  for (size_t i = static_cast<size_t>(warmup); i < r.steps.size(); ++i)
    step_seconds.push_back(r.steps[i].seconds);
  const OpTimes times = trainer.model().times();
  std::sort(step_seconds.begin(), step_seconds.end());
  const double median = step_seconds[step_seconds.size() / 2];
  const double tokens_per_step = double(batch) * seq;
  const double tps = tokens_per_step / median;
  const double flops_token = trainer.model().spec().flops_per_token(seq);
  const double gflops = flops_token * tps / 1e9;

  const bool have512 = cpu_info().avx512f;
  const double ours_big =
      have512 ? sgemm_rate(cpu::GemmImpl::kAvx512, false, true, 2048, 2048, 2048) : 0;
  const double blas_big = sgemm_rate(cpu::GemmImpl::kBlas, false, true, 2048, 2048, 2048);
  const int N = batch * seq, Vp = trainer.model().spec().vp();
  const double ours_head =
      have512 ? sgemm_rate(cpu::GemmImpl::kAvx512, false, true, N, Vp, embd) : 0;
  const double blas_head = sgemm_rate(cpu::GemmImpl::kBlas, false, true, N, Vp, embd);
  const bool bf16 = dtype == "bf16";
  const double bf16_big = bf16 ? bf16_gemm_rate(false, true, 2048, 2048, 2048) : 0;
  const double bf16_head = bf16 ? bf16_gemm_rate(false, true, N, Vp, embd) : 0;

  const double total_steps = static_cast<double>(r.steps.size());
  const double t_model = times.total() / total_steps;
  if (llama) {
    const ModelSpec& spec = trainer.model().spec();
    fmt::print(
        "zerod CPU training benchmark (Llama): {} layers, {} heads / {} KV heads, {} wide, SwiGLU "
        "{}, seq {}, micro-batch {}, vocab {} (padded {}), untied head, {:.2f}M parameters, {}, "
        "AdamW\n",
        layers, heads, spec.kv_heads(), embd, spec.ffn(), seq, batch, vocab, Vp,
        double(spec.num_parameters()) / 1e6, dtype);
  } else {
    fmt::print(
        "zerod CPU training benchmark: {} layers, {} heads, {} wide, seq {}, micro-batch {}, vocab "
        "{} (padded {}), {}, AdamW\n",
        layers, heads, embd, seq, batch, vocab, Vp, dtype);
  }
  fmt::print("threads {}, matmul engine {}, OPENBLAS_CORETYPE={}, OpenBLAS core {}\n",
             omp_get_max_threads(), cpu::gemm_impl_name(cpu::gemm_impl()),
             std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)",
             openblas_get_corename());
  if (dtype == "bf16") fmt::print("{}\n", cpu::bf16_products_note());
  fmt::print(
      "zerod: {:.0f} tokens/s (median step {:.1f} ms over {} steps), {:.1f} MFLOP/token -> {:.1f} "
      "GFLOP/s achieved\n",
      tps, median * 1e3, step_seconds.size(), flops_token / 1e6, gflops);
  fmt::print(
      "sgemm 2048^3 NT: ours {:.1f} GFLOP/s, OpenBLAS {:.1f} GFLOP/s; LM head {}x{}x{}: ours "
      "{:.1f}, OpenBLAS {:.1f}\n",
      ours_big, blas_big, N, Vp, embd, ours_head, blas_head);
  fmt::print("achieved / sgemm(2048^3, ours): {:.0f}%\n", have512 ? 100 * gflops / ours_big : 0.0);
  if (bf16_big > 0)
    fmt::print(
        "bf16 products on converted operands: 2048^3 NT {:.1f} GFLOP/s, LM head {:.1f}; achieved / "
        "bf16 2048^3: {:.0f}%\n",
        bf16_big, bf16_head, 100 * gflops / bf16_big);
  auto pct = [&](double t) { return 100.0 * t / total_steps / median; };
  fmt::print("step time (per step, all steps incl. warm-up): model ops {:.1f} ms of {:.1f} ms\n",
             t_model * 1e3, median * 1e3);
  fmt::print(
      "  matmul fwd {:.1f}% | matmul bwd {:.1f}% | attention fwd {:.1f}% bwd {:.1f}% | {} "
      "{:.1f}% | {} {:.1f}% | residual {:.1f}% | classifier {:.1f}% | encoder {:.1f}% | rounding "
      "{:.1f}%\n",
      pct(times.matmul_fwd), pct(times.matmul_bwd), pct(times.attention_fwd),
      pct(times.attention_bwd), llama ? "rmsnorm" : "layernorm", pct(times.layernorm),
      llama ? "swiglu" : "gelu", pct(times.gelu), pct(times.residual), pct(times.classifier),
      pct(times.encoder), pct(times.rounding));
  fmt::print("  optimizer {:.1f}% | data {:.1f}% | other {:.1f}%\n", pct(r.optimizer_seconds),
             pct(r.data_seconds),
             100.0 - pct(times.total() + r.optimizer_seconds + r.data_seconds));
  fmt::print(
      "memory: peak RSS {:.1f} MiB (VmHWM, whole process; {:.1f} MiB resident at start), tracked "
      "peak {:.1f} MiB; planner {:.1f} MiB (weights {:.1f} + gradients {:.1f} + optimizer {:.1f} "
      "+ activations {:.1f} + buffers {:.1f}); peak RSS / planner {:.3f}, peak RSS / (planner + "
      "start) {:.3f}\n",
      peak_rss / mib, rss_start / mib, trainer.memory().total_peak() / mib, predicted / mib,
      planned ? planned->weights / mib : 0.0, planned ? planned->gradients / mib : 0.0,
      planned ? planned->optimizer / mib : 0.0, planned ? planned->activations / mib : 0.0,
      planned ? planned->buffers / mib : 0.0,
      predicted > 0 ? double(peak_rss) / double(predicted) : 0.0,
      predicted > 0 ? double(peak_rss) / double(predicted + rss_start) : 0.0);
  if (json) {
    fmt::print(
        R"({{"tokens_per_s": {:.1f}, "gflops": {:.1f}, "step_ms": {:.1f}, "sgemm_ours_2048": {:.1f}, "sgemm_openblas_2048": {:.1f}, "sgemm_ours_head": {:.1f}, "sgemm_openblas_head": {:.1f}, "bf16gemm_2048": {:.1f}, "bf16gemm_head": {:.1f}, "engine": "{}", "threads": {}, "dtype": "{}", "model": "{}", "mflop_per_token": {:.2f}, "min_step_ms": {:.1f}, "max_step_ms": {:.1f}, "params": {}, "peak_rss_mib": {:.1f}, "rss_start_mib": {:.1f}, "tracked_peak_mib": {:.1f}, "predicted_mib": {:.1f}}})"
        "\n",
        tps, gflops, median * 1e3, ours_big, blas_big, ours_head, blas_head, bf16_big, bf16_head,
        cpu::gemm_impl_name(cpu::gemm_impl()), omp_get_max_threads(), dtype,
        llama ? "llama" : "gpt2", flops_token / 1e6, step_seconds.front() * 1e3,
        step_seconds.back() * 1e3, trainer.model().spec().num_parameters(), peak_rss / mib,
        rss_start / mib, trainer.memory().total_peak() / mib, predicted / mib);
  }
  return 0;
}
