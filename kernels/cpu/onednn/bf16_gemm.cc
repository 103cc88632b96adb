// bf16_gemm on oneDNN's matmul primitive (see kernels/cpu/bf16_gemm.h).
//
// Per call: A and B are converted into thread-local bf16 buffers in their stored layout (rows x
// cols, compact), described to oneDNN with strides that express the transposes; C is fp32 with
// its own row stride; beta != 0 is a sum post-op, the bias a (1,N) fp32 operand. Primitives are
// cached per thread by everything their descriptors depend on (shapes, transposes, ldc, beta,
// bias), so a training step's repeated shapes create each primitive once.
#include <immintrin.h>
#include <dnnl.hpp>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/bf16_gemm.h"

namespace zerod::cpu {

namespace {

using dnnl::memory;

// Round to nearest even, as a vector instruction where the CPU converts in hardware.
__attribute__((target("avx512f,avx512bf16,avx512vl"))) void to_bf16_avx512(uint16_t* out,
                                                                           const float* in,
                                                                           int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<const __m256i&>(v));
  }
  for (; i < n; ++i) out[i] = f32_to_bf16_bits(in[i]);
}

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, bool, bool>;

struct Primitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::vector<uint16_t> a, b;
  std::map<Key, Primitive> primitives;
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

const Primitive& primitive(ThreadState& st, bool trans_a, bool trans_b, int64_t M, int64_t N,
                           int64_t K, int64_t ldc, float beta, bool bias) {
  const Key key{trans_a, trans_b, M, N, K, ldc, beta != 0.0f, bias};
  auto it = st.primitives.find(key);
  if (it != st.primitives.end()) return it->second;
  const memory::desc a_md({M, K}, memory::data_type::bf16,
                          trans_a ? memory::dims{1, M} : memory::dims{K, 1});
  const memory::desc b_md({K, N}, memory::data_type::bf16,
                          trans_b ? memory::dims{1, K} : memory::dims{N, 1});
  const memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::desc desc =
        bias ? dnnl::matmul::desc(
                   a_md, b_md, memory::desc({1, N}, memory::data_type::f32, memory::format_tag::ab),
                   c_md)
             : dnnl::matmul::desc(a_md, b_md, c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, st.engine);
    dnnl::matmul prim(pd);
    return st.primitives.emplace(key, Primitive{pd, prim}).first->second;
  } catch (const dnnl::error& e) {
    ZD_THROW("oneDNN bf16 matmul (M={}, N={}, K={}, transa={}, transb={}): {}", M, N, K, trans_a,
             trans_b, e.what());
  }
}

}  // namespace

std::string bf16_gemm_unavailable() {
  if (!cpu_info().avx512bf16) return "this CPU has no avx512_bf16 instructions";
  return "";
}

Bf16Operand to_bf16(std::vector<uint16_t>& storage, const float* in, int64_t rows, int64_t cols,
                    int64_t ld) {
  storage.resize(static_cast<size_t>(rows * cols));
  uint16_t* out = storage.data();
  // Memory-bound: rows in parallel where there is enough to share.
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
  for (int64_t r = 0; r < rows; ++r) to_bf16_avx512(out + r * cols, in + r * ld, cols);
  return {storage.data(), rows, cols};
}

void bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, Bf16Operand A,
               Bf16Operand B, float beta, float* C, int64_t ldc, const float* bias) {
  if (M <= 0 || N <= 0) return;
  static const std::string why_not = bf16_gemm_unavailable();
  ZD_CHECK(why_not.empty(), "bf16_gemm called where it cannot run: {}", why_not);
  if (K <= 0) {  // no products: C = beta C (+ bias), without reading A or B
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        float& c = C[i * ldc + j];
        c = (beta == 0.0f ? 0.0f : beta * c) + (bias != nullptr ? bias[j] : 0.0f);
      }
    }
    return;
  }
  ZD_CHECK(A.rows == (trans_a ? K : M) && A.cols == (trans_a ? M : K) &&
               B.rows == (trans_b ? N : K) && B.cols == (trans_b ? K : N),
           "bf16_gemm: operands ({}x{}, {}x{}) do not fit M={} N={} K={} transa={} transb={}",
           A.rows, A.cols, B.rows, B.cols, M, N, K, trans_a, trans_b);
  ThreadState& st = state();
  const Primitive& p = primitive(st, trans_a, trans_b, M, N, K, ldc, beta, bias != nullptr);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(p.pd.src_desc(), st.engine, const_cast<uint16_t*>(A.data))},
      {DNNL_ARG_WEIGHTS, memory(p.pd.weights_desc(), st.engine, const_cast<uint16_t*>(B.data))},
      {DNNL_ARG_DST, memory(p.pd.dst_desc(), st.engine, C)}};
  if (bias != nullptr) {
    args.emplace(DNNL_ARG_BIAS, memory(p.pd.bias_desc(), st.engine, const_cast<float*>(bias)));
  }
  p.prim.execute(st.stream, args);
  st.stream.wait();
}

void bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
               const float* bias) {
  if (M <= 0 || N <= 0) return;
  ThreadState& st = state();
  Bf16Operand a, b;
  if (K > 0) {  // A stored (M,K) or, transposed, (K,M); B stored (K,N) or, transposed, (N,K)
    a = to_bf16(st.a, A, trans_a ? K : M, trans_a ? M : K, lda);
    b = to_bf16(st.b, B, trans_b ? N : K, trans_b ? K : N, ldb);
  }
  bf16_gemm(trans_a, trans_b, M, N, K, a, b, beta, C, ldc, bias);
}

}  // namespace zerod::cpu
