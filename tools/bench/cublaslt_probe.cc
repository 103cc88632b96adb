// zerod_cublaslt_probe: which cuBLASLt bias-gradient epilogues exist for the products of a
// GPT-2 training step on this GPU, and what each costs against the way zerod computes the bias
// gradient today (the plain product, then kernels/cuda/bias.h's column sums) measured in the
// same run. The device sessions found no algorithm for BGRADB and DGELU_BGRAD with an fp32
// bias-gradient type; this asks for bf16 and fp32, and for the other operand order (BGRADA with
// the weight gradient transposed), so the next change to the step is decided by a measurement.
//
// For each linear layer of GPT-2 124M (N = batch x seq rows; (C, OC) = (768, 2304), (768, 768),
// (768, 3072), (3072, 768)), bf16 operands, fp32 compute:
//   wgrad            dweight (OC,C) += dout^T inp (as Matmul::backward), then bias_backward
//   wgrad+BGRADB     the same product with the BGRADB epilogue writing dbias (bias type bf16|f32)
//   wgradT+BGRADA    dweight^T (C,OC) = inp^T dout with BGRADA (the operands swapped)
// and for the fc layer's input gradient (the product before the GELU):
//   dgelu            dpre = (dout W) * gelu'(pre) (DGELU epilogue), then bias_backward over dpre
//   dgelu+BGRAD      DGELU_BGRAD writing dbias too (bias type bf16|f32)
// Each row: algorithms the heuristic found, microseconds (median of --iters after --warmup, CUDA
// events), the ratio to the baseline of its group, and whether the epilogue's bias gradient
// matches bias_backward's (max relative difference). Also the product + bias_backward with its
// vector kernel (ZEROD_BIAS_GRAD_VECTOR). One JSON object per row to --json.
//   zerod_cublaslt_probe [--rows 32768] [--iters 20] [--warmup 3] [--json FILE]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/storage.h"
#include "tools/bench/cuda_buffer.h"

namespace {

void lt_ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublaslt_probe: %s: status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

using zerod::bench::cuda_ok;
using zerod::bench::DeviceBuffer;

// Uniform values in [-scale, scale) (xorshift: the buffers hold up to 10^8 values).
void fill_bf16(DeviceBuffer& b, uint64_t seed, float scale) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<uint16_t> h(b.bytes / 2);
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    v = zerod::f32_to_bf16_bits(scale * (2.0f * u - 1.0f));
  }
  cuda_ok(cudaMemcpy(b.p, h.data(), b.bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

// A vector of n values (bf16 or fp32 on the device) as floats.
std::vector<float> read_vector(const void* p, int64_t n, bool bf16) {
  std::vector<float> out(static_cast<size_t>(n));
  if (bf16) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    cuda_ok(cudaMemcpy(h.data(), p, h.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    for (size_t i = 0; i < h.size(); ++i) out[i] = zerod::bf16_bits_to_f32(h[i]);
  } else {
    cuda_ok(cudaMemcpy(out.data(), p, out.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// One product's descriptors; `found` is 0 when the heuristic offers nothing.
struct Product {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ~Product() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

struct Epi {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_16BF;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};

template <class V>
void set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& v) {
  lt_ok(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof(v)), "cublasLtMatmulDescSetAttribute");
}

// Column-major D (m,n) = op(A) op(B) (+ beta D), as kernels/cuda/matmul.cc sets it up.
void make(Product& p, cublasLtHandle_t lt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          int64_t lda, int64_t ldb, int64_t ldd, const Epi& e, size_t workspace) {
  lt_ok(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (e.epilogue != CUBLASLT_EPILOGUE_DEFAULT) set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, e.epilogue);
  if (e.bias != nullptr) {
    set(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
    set(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, e.bias_type);
  }
  if (e.aux != nullptr) {
    set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux);
    set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, e.aux_ld);
  }
  lt_ok(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda), "layout A");
  lt_ok(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb), "layout B");
  lt_ok(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, m, n, ldd), "layout D");
  cublasLtMatmulPreference_t pref = nullptr;
  lt_ok(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const uint64_t ws = workspace;
  lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof(ws)),
        "PreferenceSetAttribute");
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &p.result, &p.found);
  if (s != CUBLAS_STATUS_SUCCESS) p.found = 0;
  cublasLtMatmulPreferenceDestroy(pref);
}

struct Timer {
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  Timer() {
    cuda_ok(cudaEventCreate(&t0), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&t1), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
  }
  // Median microseconds of `iters` runs of `run` after `warmup`.
  double median_us(const std::function<void()>& run, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) run();
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
      cuda_ok(cudaEventRecord(t0), "cudaEventRecord");
      run();
      cuda_ok(cudaEventRecord(t1), "cudaEventRecord");
      cuda_ok(cudaEventSynchronize(t1), "cudaEventSynchronize");
      float x = 0;
      cuda_ok(cudaEventElapsedTime(&x, t0, t1), "cudaEventElapsedTime");
      ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cuBLASLt bias-gradient epilogues against zerod's separate column sums"};
  int64_t rows = 32768;
  int iters = 20, warmup = 3;
  std::string json_path;
  app.add_option("--rows", rows, "rows N of every product (batch x sequence)");
  app.add_option("--iters", iters, "timed runs per row (median)");
  app.add_option("--warmup", warmup, "untimed runs first");
  app.add_option("--json", json_path, "also write one JSON object per row to this file");
  CLI11_PARSE(app, argc, argv);

  int version = 0;
  version = static_cast<int>(cublasLtGetVersion());
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("cublaslt_probe: %s, cuBLASLt %d, N=%lld\n", prop.name, version,
              static_cast<long long>(rows));

  cublasLtHandle_t lt = nullptr;
  lt_ok(cublasLtCreate(&lt), "cublasLtCreate");
  const size_t workspace_bytes = size_t{32} << 20;
  DeviceBuffer workspace(workspace_bytes);
  Timer timer;
  nlohmann::json all = nlohmann::json::array();
  const float one = 1.0f;

  auto launch = [&](Product& p, const void* A, const void* B, void* D, float beta) {
    return cublasLtMatmul(lt, p.op, &one, A, p.a, B, p.b, &beta, D, p.d, D, p.d, &p.result.algo,
                          workspace.p, workspace_bytes, nullptr);
  };
  auto run = [&](Product& p, const void* A, const void* B, void* D, float beta) {
    lt_ok(launch(p, A, B, D, beta), "cublasLtMatmul");
  };
  // An epilogue the heuristic offered but whose launch fails counts as not found (found = -1),
  // reported, not fatal.
  auto usable = [&](Product& p, const void* A, const void* B, void* D, float beta) {
    if (p.found <= 0) return false;
    const cublasStatus_t s = launch(p, A, B, D, beta);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a trial product");
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::printf("cublaslt_probe: the heuristic's algorithm failed to launch: status %d\n",
                  static_cast<int>(s));
      p.found = -1;
      return false;
    }
    return true;
  };
  auto report = [&](const std::string& group, const std::string& name, int64_t C, int64_t OC,
                    int found, double us, double base_us, double bias_rel) {
    nlohmann::json j = {
        {"group", group}, {"row", name},           {"C", C}, {"OC", OC}, {"found", found},
        {"us", us},       {"baseline_us", base_us}};
    if (found > 0) j["ratio"] = base_us / us;
    if (bias_rel >= 0) j["bias_grad_max_rel_diff"] = bias_rel;
    std::printf("%-6s C=%-4lld OC=%-4lld %-22s found %d  %9.1f us  (baseline %9.1f us, x%.3f)%s\n",
                group.c_str(), static_cast<long long>(C), static_cast<long long>(OC), name.c_str(),
                found, us, base_us, found > 0 && us > 0 ? base_us / us : 0.0,
                bias_rel >= 0 ? (" bias rel diff " + std::to_string(bias_rel)).c_str() : "");
    all.push_back(j);
  };

  const std::vector<std::pair<int64_t, int64_t>> layers = {
      {768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  for (const auto& [C, OC] : layers) {
    DeviceBuffer inp(static_cast<size_t>(rows * C) * 2), dout(static_cast<size_t>(rows * OC) * 2);
    DeviceBuffer dweight(static_cast<size_t>(C * OC) * 2);
    DeviceBuffer dbias_ref(static_cast<size_t>(OC) * 2), dbias(static_cast<size_t>(OC) * 4);
    DeviceBuffer scratch(zerod::cuda::bias_backward_scratch_bytes(rows, static_cast<int>(OC)));
    fill_bf16(inp, 1, 1.0f);
    fill_bf16(dout, 2, 0.01f);
    cuda_ok(cudaMemset(dweight.p, 0, dweight.bytes), "cudaMemset");

    // Today: the plain weight-gradient product, then the column sums.
    Product plain;
    make(plain, lt, false, true, C, OC, rows, C, OC, C, Epi{}, workspace_bytes);
    if (plain.found == 0) {
      std::fprintf(stderr, "cublaslt_probe: no algorithm for the plain product\n");
      return 1;
    }
    auto bias_sums = [&] {
      zerod::cuda::bias_backward(zerod::cuda::Storage::kBF16, dbias_ref.p, dout.p, rows,
                                 static_cast<int>(OC), static_cast<float*>(scratch.p), nullptr);
    };
    const double product_us =
        timer.median_us([&] { run(plain, inp.p, dout.p, dweight.p, 1.0f); }, warmup, iters);
    const double base_us = timer.median_us(
        [&] {
          run(plain, inp.p, dout.p, dweight.p, 1.0f);
          bias_sums();
        },
        warmup, iters);
    report("wgrad", "plain product", C, OC, plain.found, product_us, base_us, -1);
    report("wgrad", "product+bias_backward", C, OC, plain.found, base_us, base_us, -1);
    {
      // The same with bias_backward's vector kernel (ZEROD_BIAS_GRAD_VECTOR).
      zerod::cuda::set_bias_grad_vector(true);
      const double us = timer.median_us(
          [&] {
            run(plain, inp.p, dout.p, dweight.p, 1.0f);
            bias_sums();
          },
          warmup, iters);
      cuda_ok(cudaMemset(dbias_ref.p, 0, dbias_ref.bytes), "cudaMemset");
      bias_sums();
      const std::vector<float> got = read_vector(dbias_ref.p, OC, true);
      zerod::cuda::set_bias_grad_vector(false);
      cuda_ok(cudaMemset(dbias_ref.p, 0, dbias_ref.bytes), "cudaMemset");
      bias_sums();
      report("wgrad", "product+vector sums", C, OC, plain.found, us, base_us,
             max_rel_diff(got, read_vector(dbias_ref.p, OC, true)));
    }
    cuda_ok(cudaMemset(dbias_ref.p, 0, dbias_ref.bytes), "cudaMemset");
    bias_sums();
    const std::vector<float> want = read_vector(dbias_ref.p, OC, true);

    for (const bool f32 : {false, true}) {
      const cudaDataType_t bt = f32 ? CUDA_R_32F : CUDA_R_16BF;
      const std::string tn = f32 ? " f32" : " bf16";
      // BGRADB: the bias gradient of the columns of D (OC), reduced over k from B = dout.
      Product bgradb;
      make(bgradb, lt, false, true, C, OC, rows, C, OC, C,
           Epi{CUBLASLT_EPILOGUE_BGRADB, dbias.p, bt, nullptr, 0}, workspace_bytes);
      double us = 0, rel = -1;
      if (usable(bgradb, inp.p, dout.p, dweight.p, 1.0f)) {
        us = timer.median_us([&] { run(bgradb, inp.p, dout.p, dweight.p, 1.0f); }, warmup, iters);
        rel = max_rel_diff(read_vector(dbias.p, OC, !f32), want);
      }
      report("wgrad", "BGRADB" + tn, C, OC, bgradb.found, us, base_us, rel);
      // BGRADA with the operands swapped: dweight^T (C,OC) col-major = (OC,C)... m=OC, n=C.
      Product bgrada;
      make(bgrada, lt, false, true, OC, C, rows, OC, C, OC,
           Epi{CUBLASLT_EPILOGUE_BGRADA, dbias.p, bt, nullptr, 0}, workspace_bytes);
      us = 0;
      rel = -1;
      if (usable(bgrada, dout.p, inp.p, dweight.p, 1.0f)) {
        us = timer.median_us([&] { run(bgrada, dout.p, inp.p, dweight.p, 1.0f); }, warmup, iters);
        rel = max_rel_diff(read_vector(dbias.p, OC, !f32), want);
      }
      report("wgrad", "transposed+BGRADA" + tn, C, OC, bgrada.found, us, base_us, rel);
    }

    // The product before the GELU's backward: only for the fc projection (C=3072 in, OC=768
    // out): dpre (N,C) = (dout (N,OC) x W (OC,C)) * gelu'(pre), then bias_backward over dpre.
    if (C == 3072) {
      DeviceBuffer weight(static_cast<size_t>(OC * C) * 2), pre(static_cast<size_t>(rows * C) * 2);
      DeviceBuffer dpre(static_cast<size_t>(rows * C) * 2), gref(static_cast<size_t>(C) * 2);
      DeviceBuffer gbias(static_cast<size_t>(C) * 4);
      DeviceBuffer gscratch(zerod::cuda::bias_backward_scratch_bytes(rows, static_cast<int>(C)));
      fill_bf16(weight, 3, 0.02f);
      fill_bf16(pre, 4, 1.0f);
      Product dgelu;
      make(dgelu, lt, false, false, C, rows, OC, C, OC, C,
           Epi{CUBLASLT_EPILOGUE_DGELU, nullptr, CUDA_R_16BF, pre.p, C}, workspace_bytes);
      if (dgelu.found == 0) {
        std::fprintf(stderr, "cublaslt_probe: no algorithm for the DGELU product\n");
        return 1;
      }
      auto gsums = [&] {
        zerod::cuda::bias_backward(zerod::cuda::Storage::kBF16, gref.p, dpre.p, rows,
                                   static_cast<int>(C), static_cast<float*>(gscratch.p), nullptr);
      };
      const double dgelu_us =
          timer.median_us([&] { run(dgelu, weight.p, dout.p, dpre.p, 0.0f); }, warmup, iters);
      const double gbase_us = timer.median_us(
          [&] {
            run(dgelu, weight.p, dout.p, dpre.p, 0.0f);
            gsums();
          },
          warmup, iters);
      report("dgelu", "DGELU product", C, OC, dgelu.found, dgelu_us, gbase_us, -1);
      report("dgelu", "DGELU+bias_backward", C, OC, dgelu.found, gbase_us, gbase_us, -1);
      zerod::cuda::set_bias_grad_vector(true);
      const double gvec_us = timer.median_us(
          [&] {
            run(dgelu, weight.p, dout.p, dpre.p, 0.0f);
            gsums();
          },
          warmup, iters);
      zerod::cuda::set_bias_grad_vector(false);
      report("dgelu", "DGELU+vector sums", C, OC, dgelu.found, gvec_us, gbase_us, -1);
      cuda_ok(cudaMemset(gref.p, 0, gref.bytes), "cudaMemset");
      run(dgelu, weight.p, dout.p, dpre.p, 0.0f);
      gsums();
      const std::vector<float> gwant = read_vector(gref.p, C, true);
      for (const bool f32 : {false, true}) {
        const cudaDataType_t bt = f32 ? CUDA_R_32F : CUDA_R_16BF;
        Product fused;
        make(fused, lt, false, false, C, rows, OC, C, OC, C,
             Epi{CUBLASLT_EPILOGUE_DGELU_BGRAD, gbias.p, bt, pre.p, C}, workspace_bytes);
        double us = 0, rel = -1;
        if (usable(fused, weight.p, dout.p, dpre.p, 0.0f)) {
          us = timer.median_us([&] { run(fused, weight.p, dout.p, dpre.p, 0.0f); }, warmup, iters);
          rel = max_rel_diff(read_vector(gbias.p, C, !f32), gwant);
        }
        report("dgelu", std::string("DGELU_BGRAD") + (f32 ? " f32" : " bf16"), C, OC, fused.found,
               us, gbase_us, rel);
      }
    }
  }
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cublasLtDestroy(lt);
  if (!json_path.empty()) std::ofstream(json_path) << all.dump(1) << "\n";
  return 0;
}
