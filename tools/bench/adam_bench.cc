// CPU Adam benchmark: zerod's AdamW step (the CPU backend's kernel, which the optimizer offload
// will run on host shards) over N fp32 parameters against PyTorch's torch.optim.AdamW on the
// CPU (Debian's python3-torch) with the same thread count, in the same run. Prints elements/s
// of both and the ratio. With --optimizer sgd|adagrad|lion|lamb, zerod's step of that optimizer
// alone (SGD with Nesterov momentum, Adagrad, Lion, Lamb's two passes over one tensor), on the
// path --isa picks (their vector loops are kernels/cpu/optim_simd.h; --isa scalar for the scalar
// definition).
//
//   zerod_adam_bench [--params 100000000] [--steps 5] [--threads 2] [--isa auto|avx512|avx2|scalar]
//                    [--optimizer adamw|sgd|adagrad|lion|lamb]
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/lamb.h"

using namespace zerod;

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod CPU Adam benchmark (vs torch.optim.AdamW)"};
  int64_t n = 100000000;
  int steps = 5, threads = 2;
  app.add_option("--params", n, "fp32 parameters")->capture_default_str();
  app.add_option("--steps", steps, "measured steps (after one warm-up)")->capture_default_str();
  app.add_option("--threads", threads, "threads for both")->capture_default_str();
  std::string isa = "auto";
  app.add_option("--isa", isa, "zerod's vector path")
      ->check(CLI::IsMember({"auto", "avx512", "avx2", "scalar"}))
      ->capture_default_str();
  std::string optimizer = "adamw";
  app.add_option("--optimizer", optimizer, "the step measured (torch's only for adamw)")
      ->check(CLI::IsMember({"adamw", "sgd", "adagrad", "lion", "lamb"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::map<std::string, cpu::AdamIsa> isas = {{"auto", cpu::AdamIsa::kAuto},
                                                    {"avx512", cpu::AdamIsa::kAvx512},
                                                    {"avx2", cpu::AdamIsa::kAvx2},
                                                    {"scalar", cpu::AdamIsa::kScalar}};
  cpu::set_adamw_isa(isas.at(isa));
  omp_set_num_threads(threads);

  std::vector<float> master(static_cast<size_t>(n), 0.01f), m(static_cast<size_t>(n), 0.0f),
      v(static_cast<size_t>(n), 0.0f), grad(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    grad[static_cast<size_t>(i)] = 1e-3f * static_cast<float>((i % 97) - 48);
  auto be = make_cpu_backend(DType::kF32);
  AdamWParams p;
  p.lr = 1e-3f;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = 0.01f;
  p.adam_w_mode = true;
  p.bias_correction = true;
  p.grad_scale = 1.0f;
  if (optimizer == "sgd") {
    p.kind = OptimizerKind::kSgd;
    p.momentum = 0.9;
    p.nesterov = true;
  } else if (optimizer == "adagrad") {
    p.kind = OptimizerKind::kAdagrad;
    p.eps = 1e-10;
  } else if (optimizer == "lion") {
    p.kind = OptimizerKind::kLion;
  } else if (optimizer == "lamb") {
    p.kind = OptimizerKind::kLamb;
  }
  double best = 1e30;
  for (int s = 0; s <= steps; ++s) {
    p.step = s + 1;
    Stopwatch sw;
    if (p.kind == OptimizerKind::kLamb) {
      const Backend::LambSums q =
          cpu::lamb_moments(master.data(), m.data(), v.data(), grad.data(), n, p);
      cpu::lamb_apply(master.data(), m.data(), v.data(), nullptr, n, p,
                      cpu::lamb_coeff(q.w2, q.u2, cpu::lamb_constants(p)), DType::kF32);
    } else {
      be->optimizer_update(master.data(), m.data(), v.data(), grad.data(), nullptr, n, p);
    }
    if (s > 0) best = std::min(best, sw.seconds());  // step 0 warms the pages up
  }
  const double ours = static_cast<double>(n) / best;
  if (optimizer != "adamw") {
    fmt::print("CPU {}, {} fp32 parameters, {} threads (best of {} steps)\n", optimizer, n, threads,
               steps);
    fmt::print("zerod ({} path): {:.3f} s/step = {:.0f} M elements/s\n",
               cpu::adamw_isa_name(cpu::adamw_isa()), best, ours / 1e6);
    return 0;
  }

  const std::string py =
      fmt::format(R"PY(
import json, time, torch
torch.set_num_threads({threads})
n = {n}
p = torch.nn.Parameter(torch.full((n,), 0.01))
p.grad = (torch.arange(n) % 97 - 48).float() * 1e-3
opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
best = 1e30
for s in range({steps} + 1):
    t = time.perf_counter(); opt.step(); dt = time.perf_counter() - t
    if s > 0: best = min(best, dt)
print(json.dumps({{"seconds": best, "torch": torch.__version__}}))
)PY",
                  fmt::arg("threads", threads), fmt::arg("n", n), fmt::arg("steps", steps));
  FILE* f = std::fopen("/tmp/zerod_adam_bench.py", "w");
  std::fputs(py.c_str(), f);
  std::fclose(f);
  std::string out;
  if (FILE* pp = popen("/usr/bin/python3 /tmp/zerod_adam_bench.py 2>&1", "r")) {
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof(buf), pp)) > 0) out.append(buf, k);
    pclose(pp);
  }
  const auto j = nlohmann::json::parse(
      out.substr(out.find('{') == std::string::npos ? 0 : out.rfind('{')), nullptr, false);
  fmt::print("CPU AdamW, {} fp32 parameters, {} threads (best of {} steps)\n", n, threads, steps);
  fmt::print("zerod ({} path): {:.3f} s/step = {:.0f} M elements/s\n",
             cpu::adamw_isa_name(cpu::adamw_isa()), best, ours / 1e6);
  if (j.is_discarded() || !j.contains("seconds")) {
    fmt::print("torch: not measured ({})\n", out);
    return 1;
  }
  const double theirs = static_cast<double>(n) / j["seconds"].get<double>();
  fmt::print("torch {} AdamW: {:.3f} s/step = {:.0f} M elements/s\n", j["torch"].get<std::string>(),
             j["seconds"].get<double>(), theirs / 1e6);
  fmt::print("ratio zerod / torch: {:.2f}\n", ours / theirs);
  return 0;
}
