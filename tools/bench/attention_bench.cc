// zerod_attention_bench: the mma attention kernels' variants (kernels/cuda/attention_mma.h) on
// one GPU at a training shape (GPT-2 124M by default: B=32, T=1024, 12 heads of 64, bf16), timed
// with CUDA events (median of --iters after --warmup), each against variant 0 of its kernel as
// the baseline measured in the same run (ratio = variant 0's time / this one's), and each
// variant's outputs compared with variant 0's bitwise (the variants are the same arithmetic in
// other tile shapes: any difference is a bug, exit 1). Forward: every forward variant. Backward
// (the dQ kernel then the dK/dV kernel): every (dQ, dK/dV) pair. TFLOP/s count the causal half:
// forward 4 B NH T^2 HS / 2, backward 2.5 times that (FlashAttention's count).
//   zerod_attention_bench [--batch 32] [--seq 1024] [--heads 12] [--kv-heads 12] [--iters 20]
//                         [--warmup 3] [--json FILE]
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/storage.h"
#include "tools/bench/cuda_buffer.h"

namespace {

using zerod::cuda::AttentionDims;
using zerod::cuda::Storage;

using zerod::bench::cuda_ok;
using zerod::bench::DeviceBuffer;

void fill_bf16(DeviceBuffer& b, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> h(b.bytes / 2);
  for (auto& x : h) x = zerod::f32_to_bf16_bits(nd(rng));
  cuda_ok(cudaMemcpy(b.p, h.data(), b.bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

// Median milliseconds of fn over iters launches (after warmup), timed by events per launch.
template <class F>
double median_ms(F&& fn, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) fn();
  cuda_ok(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(a, stream), "cudaEventRecord");
    fn();
    cuda_ok(cudaEventRecord(b, stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zerod_attention_bench: the mma attention kernel variants against variant 0"};
  int B = 32, T = 1024, NH = 12, KVH = 0, iters = 20, warmup = 3;
  std::string json_path;
  app.add_option("--batch", B)->check(CLI::PositiveNumber);
  app.add_option("--seq", T)->check(CLI::PositiveNumber);
  app.add_option("--heads", NH)->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", KVH, "key/value heads (default: --heads)");
  app.add_option("--iters", iters)->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "also write the results here");
  CLI11_PARSE(app, argc, argv);
  if (KVH <= 0) KVH = NH;
  if (NH % KVH != 0) {
    std::fprintf(stderr, "attention_bench: --heads %d is not a multiple of --kv-heads %d\n", NH,
                 KVH);
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  AttentionDims d{};
  d.B = B;
  d.T = T;
  d.NH = NH;
  d.KVH = KVH;
  d.HS = 64;
  const size_t rows = static_cast<size_t>(B) * T;
  DeviceBuffer qkv(rows * d.qkv_row() * 2), dout(rows * d.out_row() * 2);
  DeviceBuffer out(rows * d.out_row() * 2), lse(static_cast<size_t>(B) * NH * T * 4);
  DeviceBuffer dqkv(rows * d.qkv_row() * 2);
  DeviceBuffer scratch(zerod::cuda::attention_backward_scratch_bytes(d));
  fill_bf16(qkv, 1, 1.0f);
  fill_bf16(dout, 2, 1.0f);
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  if (!zerod::cuda::attention_mma_supported(Storage::kBF16, d, qkv.p, dout.p, out.p, dqkv.p)) {
    std::fprintf(stderr, "attention_bench: the mma kernels do not apply to this shape\n");
    return 2;
  }

  const double fwd_flop = 4.0 * B * NH * static_cast<double>(T) * T * d.HS / 2.0;
  const double bwd_flop = 2.5 * fwd_flop;
  nlohmann::json results = nlohmann::json::array();
  bool identical = true;
  std::printf("device %s; B=%d T=%d NH=%d KVH=%d HS=64 bf16; median of %d (after %d)\n", prop.name,
              B, T, NH, KVH, iters, warmup);
  std::printf("%-10s %8s %8s %10s %s\n", "kernel", "variant", "ms", "TFLOP/s", "vs variant 0");

  // Forward: every variant; the out and lse of variant 0 are the reference (and feed the
  // backward below).
  std::vector<unsigned char> ref_out, ref_lse;
  double base_fwd = 0;
  for (int v = 0; v < zerod::cuda::kMmaForwardVariants; ++v) {
    cuda_ok(cudaMemset(out.p, 0xff, out.bytes), "poison out");
    auto fwd = [&] {
      zerod::cuda::attention_mma_forward(Storage::kBF16, out.p, static_cast<float*>(lse.p), qkv.p,
                                         d, stream, v);
    };
    const double ms = median_ms(fwd, warmup, iters, stream);
    const auto o = out.read();
    const auto l = lse.read();
    if (v == 0) {
      ref_out = o;
      ref_lse = l;
      base_fwd = ms;
    }
    const bool same = o == ref_out && l == ref_lse;
    identical = identical && same;
    std::printf("%-10s %8d %8.3f %10.1f %.3fx%s\n", "forward", v, ms, fwd_flop / ms / 1e9,
                base_fwd / ms, same ? "" : "  OUTPUT DIFFERS FROM VARIANT 0");
    results.push_back({{"kernel", "forward"},
                       {"variant", v},
                       {"ms", ms},
                       {"tflops", fwd_flop / ms / 1e9},
                       {"vs_variant_0", base_fwd / ms},
                       {"identical", same}});
  }
  cuda_ok(cudaMemcpy(out.p, ref_out.data(), out.bytes, cudaMemcpyHostToDevice), "restore out");
  cuda_ok(cudaMemcpy(lse.p, ref_lse.data(), lse.bytes, cudaMemcpyHostToDevice), "restore lse");

  std::vector<unsigned char> ref_dqkv;
  double base_bwd = 0;
  for (int q = 0; q < zerod::cuda::kMmaDqVariants; ++q) {
    for (int k = 0; k < zerod::cuda::kMmaDkdvVariants; ++k) {
      cuda_ok(cudaMemset(dqkv.p, 0xff, dqkv.bytes), "poison dqkv");
      auto bwd = [&] {
        zerod::cuda::attention_mma_backward(Storage::kBF16, dqkv.p, dout.p, qkv.p, out.p,
                                            static_cast<const float*>(lse.p), d,
                                            static_cast<float*>(scratch.p), stream, q, k);
      };
      const double ms = median_ms(bwd, warmup, iters, stream);
      const auto g = dqkv.read();
      if (q == 0 && k == 0) {
        ref_dqkv = g;
        base_bwd = ms;
      }
      const bool same = g == ref_dqkv;
      identical = identical && same;
      const std::string name = std::to_string(q) + "," + std::to_string(k);
      std::printf("%-10s %8s %8.3f %10.1f %.3fx%s\n", "backward", name.c_str(), ms,
                  bwd_flop / ms / 1e9, base_bwd / ms, same ? "" : "  OUTPUT DIFFERS FROM 0,0");
      results.push_back({{"kernel", "backward"},
                         {"dq_variant", q},
                         {"dkdv_variant", k},
                         {"ms", ms},
                         {"tflops", bwd_flop / ms / 1e9},
                         {"vs_variant_0", base_bwd / ms},
                         {"identical", same}});
    }
  }
  cudaStreamDestroy(stream);
  const nlohmann::json doc = {{"device", prop.name},
                              {"B", B},
                              {"T", T},
                              {"NH", NH},
                              {"KVH", KVH},
                              {"HS", 64},
                              {"iters", iters},
                              {"results", results},
                              {"identical", identical}};
  std::printf("%s\n", doc.dump().c_str());
  if (!json_path.empty()) std::ofstream(json_path) << doc.dump(1) << "\n";
  if (!identical) {
    std::fprintf(stderr, "attention_bench: a variant's output differs from variant 0's\n");
    return 1;
  }
  return 0;
}
