// zerod_gemm_bench: GFLOP/s of zerod's sgemm (the AVX-512 engine) against OpenBLAS cblas_sgemm,
// both measured in this process, for 2048^3 and the matmul shapes of training (the CPU benchmark
// model and GPT-2 124M), plus attention-sized blocks on one thread. --bf16 adds the bf16
// products of bf16 mode (kernels/cpu/bf16_gemm.h) on the same shapes.
//
// OpenBLAS runs as the environment configured it (OPENBLAS_CORETYPE, ...): the header prints
// the core type it picked. Both libraries get the same thread count (--threads, default
// omp_get_max_threads()). Each library runs each shape for at least --min-time seconds and
// --reps times, in two blocks per library with pauses between, and reports its best run.
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_info.h"
#include "core/error.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/gemm.h"

namespace {

using zerod::cpu::GemmImpl;

struct Shape {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;  // as the engine calls it: 1 where a gradient is accumulated
};

struct Result {
  double ours = 0.0;
  double blas = 0.0;
  double bf16 = 0.0;       // bf16_gemm on operands converted beforehand (--bf16)
  double bf16_conv = 0.0;  // bf16_gemm on fp32 operands: their conversion included (--bf16)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result measure(const Shape& s, bool have_ours, bool bf16, double min_time, int min_reps) {
  const int64_t lda = s.ta ? s.M : s.K;
  const int64_t ldb = s.tb ? s.K : s.N;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> A(static_cast<size_t>(s.M * s.K)), B(static_cast<size_t>(s.K * s.N));
  std::vector<float> C(static_cast<size_t>(s.M * s.N));
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);
  for (auto& x : C) x = u(rng) * 1e-3f;
  const double flop =
      2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);

  auto run_ours = [&] {
    zerod::cpu::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, s.beta,
                      C.data(), s.N);
  };
  auto run_blas = [&] {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(s.M), static_cast<blasint>(s.N), static_cast<blasint>(s.K),
                1.0f, A.data(), static_cast<blasint>(lda), B.data(), static_cast<blasint>(ldb),
                s.beta, C.data(), static_cast<blasint>(s.N));
  };
  std::vector<uint16_t> a16, b16;
  zerod::cpu::Bf16Operand a_bf16, b_bf16;
  if (bf16) {
    a_bf16 = zerod::cpu::to_bf16(a16, A.data(), s.ta ? s.K : s.M, s.ta ? s.M : s.K, lda);
    b_bf16 = zerod::cpu::to_bf16(b16, B.data(), s.tb ? s.N : s.K, s.tb ? s.K : s.N, ldb);
  }
  auto run_bf16 = [&] {
    zerod::cpu::bf16_gemm(s.ta, s.tb, s.M, s.N, s.K, a_bf16, b_bf16, s.beta, C.data(), s.N);
  };
  auto run_bf16_conv = [&] {
    zerod::cpu::bf16_gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, s.beta, C.data(),
                          s.N);
  };
  // Warm-up: packing buffers, thread pools, page faults of C.
  if (have_ours) run_ours();
  run_blas();
  if (bf16) {
    run_bf16();
    run_bf16_conv();
  }

  // Each library runs in blocks with a pause before each: OpenBLAS's idle threads spin for
  // ~0.1 s after a call (and OpenMP's briefly), and measured right after the other library a
  // call can lose half a core to them. Two rounds of blocks even out slow drifts of the machine.
  auto block = [&](const auto& fn, double* best) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    double spent = 0.0;
    for (int rep = 0; rep < (min_reps + 1) / 2 || spent < min_time / 2; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      const double t = seconds_since(t0);
      spent += t;
      *best = std::max(*best, flop / t / 1e9);
    }
  };
  Result r;
  for (int round = 0; round < 2; ++round) {
    if (have_ours) block(run_ours, &r.ours);
    block(run_blas, &r.blas);
    if (bf16) {
      block(run_bf16, &r.bf16);
      block(run_bf16_conv, &r.bf16_conv);
    }
  }
  return r;
}

std::vector<Shape> training_shapes() {
  // (N, C, OC): N = B*T rows. forward out = inp x W^T; backward dinp = dout x W and
  // dW += dout^T x inp (kernels/cpu/matmul.cc).
  const int64_t cfg[][3] = {
      // CPU benchmark model: B=4, T=256, C=256, vocab padded to 50304 (tied LM head last).
      {1024, 256, 768},
      {1024, 256, 256},
      {1024, 256, 1024},
      {1024, 1024, 256},
      {1024, 256, 50304},
      // GPT-2 124M, N = 1024 rows: qkv, attn proj, fc, fc proj, LM head.
      {1024, 768, 2304},
      {1024, 768, 768},
      {1024, 768, 3072},
      {1024, 3072, 768},
      {1024, 768, 50304}};
  std::vector<Shape> shapes;
  for (const auto& c : cfg) {
    const int64_t n = c[0], ch = c[1], oc = c[2];
    const std::string tag = "C=" + std::to_string(ch) + " OC=" + std::to_string(oc);
    shapes.push_back({"fwd  " + tag, false, true, n, oc, ch, 0.0f});
    shapes.push_back({"dinp " + tag, false, false, n, ch, oc, 0.0f});
    shapes.push_back({"dW   " + tag, true, false, oc, ch, n, 1.0f});
  }
  return shapes;
}

void print_row(const Shape& s, const Result& r, bool have_ours, bool bf16) {
  const char op[3] = {s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', 0};
  if (have_ours) {
    std::printf("%-24s %s %6lld %6lld %6lld  %8.1f  %8.1f  %5.2f", s.name.c_str(), op,
                static_cast<long long>(s.M), static_cast<long long>(s.N),
                static_cast<long long>(s.K), r.ours, r.blas, r.ours / r.blas);
  } else {
    std::printf("%-24s %s %6lld %6lld %6lld  %8s  %8.1f  %5s", s.name.c_str(), op,
                static_cast<long long>(s.M), static_cast<long long>(s.N),
                static_cast<long long>(s.K), "n/a", r.blas, "-");
  }
  if (bf16) {
    const double fp32 = std::max(r.ours, r.blas);
    std::printf("  %8.1f  %8.1f  %5.2f", r.bf16, r.bf16_conv, r.bf16 / fp32);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void print_header(bool bf16) {
  std::printf("%-24s %s %6s %6s %6s  %8s  %8s  %5s", "shape", "op", "M", "N", "K", "ours",
              "OpenBLAS", "ratio");
  if (bf16) std::printf("  %8s  %8s  %5s", "bf16", "bf16+cvt", "/fp32");
  std::printf("\n");
}

int run(int argc, char** argv) {
  CLI::App app{"zerod_gemm_bench: zerod sgemm vs OpenBLAS cblas_sgemm, GFLOP/s"};
  int threads = omp_get_max_threads();
  double min_time = 0.3;
  int reps = 3;
  std::string set = "all";
  app.add_option("--threads", threads, "threads for both libraries")->check(CLI::PositiveNumber);
  app.add_option("--min-time", min_time, "seconds each library runs per shape, at least");
  app.add_option("--reps", reps, "runs per library and shape, at least");
  app.add_option("--shapes", set, "all | big (2048^3) | train | attention")
      ->check(CLI::IsMember({"all", "big", "train", "attention"}));
  bool bf16 = false;
  app.add_flag("--bf16", bf16,
               "also bf16_gemm (oneDNN, bf16 operands, fp32 accumulation): on operands converted "
               "beforehand, and with their conversion; /fp32 = bf16 over the faster fp32 column");
  CLI11_PARSE(app, argc, argv);
  if (bf16 && !zerod::cpu::bf16_gemm_unavailable().empty()) {
    std::fprintf(stderr, "zerod_gemm_bench: --bf16: %s\n",
                 zerod::cpu::bf16_gemm_unavailable().c_str());
    return 2;
  }

  const auto& cpu = zerod::cpu_info();
  const bool have_ours = cpu.avx512f;
  if (have_ours) zerod::cpu::set_gemm_impl(GemmImpl::kAvx512);
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("cpu: %s (avx512f %s), %d cores usable\n",
              cpu.model.empty() ? "unknown" : cpu.model.c_str(), cpu.avx512f ? "yes" : "no",
              cpu.cores);
  std::printf("ours: zerod sgemm, %s engine%s\n",
              zerod::cpu::gemm_impl_name(zerod::cpu::gemm_impl()),
              have_ours ? "" : " unavailable (no AVX-512F): only OpenBLAS is measured");
  std::printf("OpenBLAS: core type %s (OPENBLAS_CORETYPE=%s), %s\n", openblas_get_corename(),
              coretype != nullptr ? coretype : "(unset)", openblas_get_config());
  std::printf(
      "threads: %d (OpenMP for ours, openblas_set_num_threads for OpenBLAS); "
      "GFLOP/s = best run of >= %d runs and >= %.2f s per library and shape\n\n",
      threads, reps, min_time);

  if (set != "attention") print_header(bf16);
  if (set == "all" || set == "big") {
    for (int t = 0; t < 4; ++t) {
      const Shape s{"2048^3", (t & 2) != 0, (t & 1) != 0, 2048, 2048, 2048, 0.0f};
      print_row(s, measure(s, have_ours, bf16, min_time, reps), have_ours, bf16);
    }
  }
  if (set == "all" || set == "train") {
    double log_sum = 0.0, worst = 1e30;
    int n = 0;
    for (const Shape& s : training_shapes()) {
      const Result r = measure(s, have_ours, bf16, min_time, reps);
      print_row(s, r, have_ours, bf16);
      if (have_ours) {
        log_sum += std::log(r.ours / r.blas);
        worst = std::min(worst, r.ours / r.blas);
        ++n;
      }
    }
    if (n > 0) {
      std::printf("training shapes: geometric mean ratio %.2f, lowest %.2f\n",
                  std::exp(log_sum / n), worst);
    }
  }
  if (set == "all" || set == "attention") {
    // Attention calls sgemm inside its own parallel region: one thread, strided T x T x 64.
    std::printf("\nattention blocks (1 thread each):\n");
    print_header(bf16);
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    const std::vector<Shape> shapes = {{"att q k^T  T=256 hs=64", false, true, 256, 256, 64, 0.0f},
                                       {"att P v    T=256 hs=64", false, false, 256, 64, 256, 0.0f},
                                       {"att dP^T   T=256 hs=64", true, false, 256, 64, 256, 1.0f},
                                       {"att q k^T  T=64 hs=64", false, true, 64, 64, 64, 0.0f}};
    for (const Shape& s : shapes)
      print_row(s, measure(s, have_ours, bf16, min_time, reps), have_ours, bf16);
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zerod::Error& e) {
    std::fprintf(stderr, "zerod_gemm_bench: %s\n", e.what());
    return e.exit_code();
  }
}
