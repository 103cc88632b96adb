// GPU training benchmark, zerod side (tools/device/gpu_bench.sh runs it after the PyTorch
// baseline, tools/device/gpu_bench.py, on the same GPU): GPT-2 124M (12 layers, 12 heads, 768
// wide, sequence 1024, vocabulary 50257 padded to 50304), bf16, AdamW, gradient clipping, one
// micro-batch per step, synthetic tokens, the real trainer on train.device "cuda".
//
// The micro-batch is the largest power of two from 8 up to --max-batch whose step fits in GPU
// memory (unless --batch is given). Prints progress on stderr and one JSON line on stdout with
// the keys of the PyTorch side: tokens/s from the median step time, and MFU counted the same way
// (6 * N + 12 * L * H * Q * T FLOPs per token, N the parameters with the padded vocabulary)
// against --peak-flops (989e12: H100/H200 SXM dense bf16).
//
// With --breakdown, a few more steps run with wall_clock_breakdown (the GPU synchronized around
// every op) and the JSON gains "breakdown_ms": milliseconds per step in each kind of op, for
// deciding what to tune (those steps are not part of the throughput).
//
//   zerod_gpu_bench [--steps 20] [--warmup 5] [--batch 0] [--max-batch 64] [--stage 0]
//                   [--breakdown] [--offload none|optimizer|all]
//                   [--dtype bf16|fp32] [--layers 12 --heads 12 --embd 768 --seq 1024 ...]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_job.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/train/rank_device.h"
#include "engine/train/trainer.h"

namespace {

using namespace zerod;

TrainDevice g_device = TrainDevice::kCuda;  // --device (cpu: a smoke test of this program)

std::string g_offload = "none";  // --offload: none, optimizer (to CPU memory), all (+ parameters)

JobConfig gpu_job(const bench::BenchShape& shape, const bench::SyntheticData& data, int64_t steps,
                  int stage) {
  std::string zero = fmt::format(R"({{"stage": {})", stage);
  if (g_offload != "none")
    zero += R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})";
  if (g_offload == "all") zero += R"(, "offload_param": {"device": "cpu", "pin_memory": true})";
  zero += "}";
  JobConfig cfg = bench::bench_job(shape, data, steps, 1, zero);
  cfg.train.device = g_device;
  cfg.wall_clock_breakdown = false;  // (it synchronizes the GPU around every op)
  cfg.steps_per_print = 0;
  return cfg;
}

bool out_of_memory(const std::exception& e) {
  return std::string(e.what()).find("out of GPU memory") != std::string::npos ||
         std::string(e.what()).find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod GPU training benchmark (GPT-2 124M on one GPU)"};
  int steps = 20, warmup = 5, max_batch = 64, stage = 0;
  bool breakdown = false;
  std::string device = "cuda";
  double peak = 989e12;
  bench::BenchShape shape;
  shape.layers = 12;
  shape.heads = 12;
  shape.embd = 768;
  shape.seq = 1024;
  shape.vocab = 50257;
  shape.batch = 0;
  shape.dtype = "bf16";
  app.add_option("--steps", steps, "measured steps")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured first steps")->capture_default_str();
  app.add_option("--device", device, "cuda, or cpu to smoke-test this program on a tiny shape")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--breakdown", breakdown, "also time each kind of op (synchronized) in 3 steps");
  app.add_option("--max-batch", max_batch, "largest micro-batch the search tries")
      ->capture_default_str();
  app.add_option("--stage", stage, "ZeRO stage (one GPU)")->check(CLI::Range(0, 3));
  app.add_option("--offload", g_offload,
                 "ZeRO-Offload to CPU memory: optimizer states, or all (+ parameters, stage 3)")
      ->check(CLI::IsMember({"none", "optimizer", "all"}))
      ->capture_default_str();
  app.add_option("--peak-flops", peak, "FLOP/s that MFU is measured against")
      ->capture_default_str();
  shape.add_options(app);  // --batch 0: search
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  try {
    if (device == "cpu") g_device = TrainDevice::kCpu;
    if (g_device == TrainDevice::kCuda && visible_gpus() == 0) {
      std::fprintf(stderr, "zerod_gpu_bench: no GPU visible\n");
      return 2;
    }
    // The micro-batch: the largest power of two that runs two steps.
    if (shape.batch <= 0) {
      for (int b = 8; b <= max_batch; b *= 2) {
        bench::BenchShape probe = shape;
        probe.batch = b;
        try {
          bench::SyntheticData data(probe, 4 * b);
          TrainerOptions quiet;
          quiet.log_steps = false;
          Trainer t(gpu_job(probe, data, 2, stage), quiet);
          t.run();
          shape.batch = b;
          std::fprintf(stderr, "zerod_gpu_bench: micro-batch %d fits\n", b);
        } catch (const std::exception& e) {
          if (!out_of_memory(e)) throw;
          std::fprintf(stderr, "zerod_gpu_bench: micro-batch %d: out of memory, stopping\n", b);
          break;
        }
      }
      ZD_CHECK_INPUT(shape.batch > 0, "even micro-batch 8 does not fit on this GPU");
    }

    bench::SyntheticData data(shape, static_cast<int64_t>(warmup + steps + 1) * shape.batch);
    const JobConfig cfg = gpu_job(shape, data, warmup + steps, stage);
    std::vector<double> times;
    double last_loss = 0;
    // Device memory in use after each step: cudaMemGetInfo's total - free (the CUDA context and
    // the cuBLASLt workspace included), the most seen.
    int64_t gpu_used_peak = 0;
    Trainer* running = nullptr;
    TrainerOptions opts;
    opts.log_steps = false;
    opts.on_step = [&](const StepMetrics& m) {
      if (m.step > warmup) times.push_back(m.seconds);
      last_loss = m.loss;
      int64_t free_bytes = 0, total_bytes = 0;
      if (running != nullptr && running->backend().device_memory_info(&free_bytes, &total_bytes))
        gpu_used_peak = std::max(gpu_used_peak, total_bytes - free_bytes);
    };
    Trainer trainer(cfg, opts);
    running = &trainer;
    std::fprintf(stderr, "zerod_gpu_bench: micro-batch %d, seq %d, %d warm-up + %d timed steps\n",
                 shape.batch, shape.seq, warmup, steps);
    trainer.run();
    ZD_CHECK(!times.empty(), "no timed steps");

    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    double mean = 0;
    for (double t : times) mean += t / static_cast<double>(times.size());
    const ModelSpec& spec = trainer.model().spec();
    const double n_params = static_cast<double>(spec.num_parameters_padded());
    const double q = spec.n_embd / spec.n_head;
    const double fpt = 6 * n_params + 12.0 * spec.n_layer * spec.n_head * q * shape.seq;
    const double tokens = static_cast<double>(shape.batch) * shape.seq;
    const double tps = tokens / median;
    nlohmann::json out = {
        {"impl", "zerod"},
        {"device", device == "cpu" ? std::string("cpu") : trainer.backend().device_name()},
        {"model", fmt::format("gpt2 L{} H{} C{}", spec.n_layer, spec.n_head, spec.n_embd)},
        {"params", static_cast<int64_t>(n_params)},
        {"layers", spec.n_layer},
        {"heads", spec.n_head},
        {"embd", spec.n_embd},
        {"seq", shape.seq},
        {"vocab", spec.vocab_size},
        {"vocab_padded", spec.vp()},
        {"micro_batch", shape.batch},
        {"tokens_per_step", static_cast<int64_t>(tokens)},
        {"dtype", shape.dtype},
        {"zero_stage", stage},
        {"offload", g_offload},
        {"warmup_steps", warmup},
        {"timed_steps", steps},
        {"step_ms_median", median * 1e3},
        {"step_ms_mean", mean * 1e3},
        {"step_ms_min", sorted.front() * 1e3},
        {"step_ms_max", sorted.back() * 1e3},
        {"tokens_per_s", tps},
        {"tokens_per_s_mean", tokens / mean},
        {"flops_per_token", fpt},
        {"flops_formula", "6*N + 12*L*H*Q*T"},
        {"peak_flops", peak},
        {"mfu", fpt * tps / peak},
        {"final_loss", last_loss},
        {"max_mem_gib", static_cast<double>(trainer.memory().total_peak()) / (1 << 30)},
        {"max_mem_what", "zerod's tracker: device and host buffers of the rank together"},
        {"gpu_used_peak_gib", static_cast<double>(gpu_used_peak) / (1 << 30)},
        {"gpu_used_what",
         "cudaMemGetInfo total - free after each step, the most seen (CUDA "
         "context and cuBLASLt workspace included)"},
    };
    if (breakdown) {
      // 1 unmeasured + 2 measured steps with every op synchronized and timed.
      JobConfig timed = gpu_job(shape, data, 3, stage);
      timed.wall_clock_breakdown = true;
      TrainerOptions quiet;
      quiet.log_steps = false;
      Trainer t(timed, quiet);
      t.run();  // (the model's times cover all 3 steps; the first includes warm-up)
      const OpTimes& o = t.model().times();
      const double per = 1e3 / 3.0;
      out["breakdown_ms"] = {{"forward", o.forward * per},
                             {"backward", o.backward * per},
                             {"zero_wait", o.zero_wait * per},
                             {"matmul_fwd", o.matmul_fwd * per},
                             {"matmul_bwd", o.matmul_bwd * per},
                             {"attention_fwd", o.attention_fwd * per},
                             {"attention_bwd", o.attention_bwd * per},
                             {"layernorm", o.layernorm * per},
                             {"gelu", o.gelu * per},
                             {"residual", o.residual * per},
                             {"classifier", o.classifier * per},
                             {"encoder", o.encoder * per}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "zerod_gpu_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod_gpu_bench: %s\n", e.what());
    return 1;
  }
}
