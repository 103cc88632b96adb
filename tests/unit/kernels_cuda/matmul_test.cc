// Matmul (cuBLASLt) of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/matmul.h"

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int64_t N;
  int C, OC;
};
// A model-like shape, odd sizes (unaligned leading dimensions) and a tall one.
constexpr Shape kShapes[] = {{64, 128, 192}, {37, 50, 70}, {1000, 64, 96}};

std::string label(DType dt, const Shape& s) {
  return std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
         " OC=" + std::to_string(s.OC);
}

TEST(CudaMatmul, ForwardMatchesTheCpuWithAndWithoutBias) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const VecF inp = be.round(test::randn(s.N * s.C, 70));
      const VecF w = be.round(test::randn(int64_t{s.OC} * s.C, 71, 0.2f));
      // One spare element in front: bias + 1 is a 2- or 4-byte aligned bias pointer, which
      // takes the path without the cuBLASLt epilogue.
      const VecF b = be.round(test::randn(s.OC + 1, 72));
      Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_b = be.compute(b);
      const int64_t NO = s.N * s.OC;
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(variant == 0 ? "aligned bias" : variant == 1 ? "unaligned bias" : "no bias");
        const float* cpu_bias = variant == 0 ? b.data() : variant == 1 ? b.data() + 1 : nullptr;
        const void* gpu_bias = variant == 0   ? d_b.data()
                               : variant == 1 ? d_b.as<char>() + be.gpu->compute_elem_size()
                                              : nullptr;
        VecF out(NO);
        be.cpu->matmul_forward(out.data(), inp.data(), w.data(), cpu_bias, s.N, s.C, s.OC);
        Buffer d_out = be.poisoned_compute(NO);
        be.gpu->matmul_forward(d_out.data(), d_inp.data(), d_w.data(), gpu_bias, s.N, s.C, s.OC);
        EXPECT_TRUE(test::close(be.read_compute(d_out, NO), out, test::tolerance(dt)));
      }
    }
  }
}

TEST(CudaMatmul, BackwardOverwritesOrAccumulatesLikeTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      for (int variant = 0; variant < 4; ++variant) {
        // 0: dinp =, with dbias; 1: dinp +=, with dbias; 2: no dinp, no dbias; 3: dinp = and
        // dbias without dweight (zero-bubble's input-gradient pass: dweight left untouched).
        SCOPED_TRACE(label(dt, s) + " variant " + std::to_string(variant));
        Backends be(dt);
        const int64_t NC = s.N * s.C, OCC = int64_t{s.OC} * s.C;
        const VecF inp = be.round(test::randn(NC, 80));
        const VecF w = be.round(test::randn(OCC, 81, 0.2f));
        const VecF dout = be.round(test::randn(s.N * s.OC, 82));
        VecF dinp = be.round(test::randn(NC, 83, 0.5f));
        VecF dw = be.round(test::randn(OCC, 84, 0.5f)), db = be.round(test::randn(s.OC, 85, 0.5f));
        Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_dout = be.compute(dout);
        Buffer d_dinp = variant == 0 ? be.poisoned_compute(NC) : be.compute(dinp);
        Buffer d_dw = be.compute(dw), d_db = be.compute(db);
        const bool with_dinp = variant != 2, with_db = variant != 2, acc = variant == 1;
        const bool with_dw = variant != 3;
        be.cpu->matmul_backward(with_dinp ? dinp.data() : nullptr, with_dw ? dw.data() : nullptr,
                                with_db ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                                s.N, s.C, s.OC, acc);
        be.gpu->matmul_backward(with_dinp ? d_dinp.data() : nullptr,
                                with_dw ? d_dw.data() : nullptr, with_db ? d_db.data() : nullptr,
                                d_dout.data(), d_inp.data(), d_w.data(), s.N, s.C, s.OC, acc);
        EXPECT_TRUE(test::close(be.read_compute(d_dw, OCC), dw, test::tolerance(dt)));
        EXPECT_TRUE(test::close(be.read_compute(d_db, s.OC), db, test::tolerance(dt)));
        if (with_dinp) {
          EXPECT_TRUE(test::close(be.read_compute(d_dinp, NC), dinp, test::tolerance(dt)));
        }
      }
    }
  }
}

// ZEROD_CUBLASLT_TUNE=K times K of the heuristic's algorithms on each shape's first product:
// the products that add to their output (dweight, accumulated dinp) must see it as it was before
// the timed runs (saved and restored), and every result still matches the CPU.
TEST(CudaMatmul, TunedAlgorithmsKeepTheResultsOfAccumulatingProducts) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(setenv("ZEROD_CUBLASLT_TUNE", "8", 1), 0);
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const int64_t NC = s.N * s.C, OCC = int64_t{s.OC} * s.C, NO = s.N * s.OC;
      const VecF inp = be.round(test::randn(NC, 100));
      const VecF w = be.round(test::randn(OCC, 101, 0.2f));
      const VecF b = be.round(test::randn(s.OC, 102));
      const VecF dout = be.round(test::randn(NO, 103));
      VecF dinp = be.round(test::randn(NC, 104, 0.5f)), dw = be.round(test::randn(OCC, 105, 0.5f));
      Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_b = be.compute(b);
      Buffer d_dout = be.compute(dout), d_dinp = be.compute(dinp), d_dw = be.compute(dw);
      VecF out(NO);
      be.cpu->matmul_forward(out.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC);
      Buffer d_out = be.poisoned_compute(NO);
      be.gpu->matmul_forward(d_out.data(), d_inp.data(), d_w.data(), d_b.data(), s.N, s.C, s.OC);
      EXPECT_TRUE(test::close(be.read_compute(d_out, NO), out, test::tolerance(dt)));
      be.cpu->matmul_backward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(),
                              s.N, s.C, s.OC, /*accumulate=*/true);
      be.gpu->matmul_backward(d_dinp.data(), d_dw.data(), nullptr, d_dout.data(), d_inp.data(),
                              d_w.data(), s.N, s.C, s.OC, /*accumulate=*/true);
      EXPECT_TRUE(test::close(be.read_compute(d_dw, OCC), dw, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_dinp, NC), dinp, test::tolerance(dt)));
    }
  }
  unsetenv("ZEROD_CUBLASLT_TUNE");
}

// cuBLASLt is loaded on first use (dlopen), not linked: every entry point resolves, from the
// library of the headers' major version (no GPU needed).
TEST(CudaMatmul, CublasLtLoadsOnFirstUseWithEveryEntryPoint) {
  const cuda::CublasLtLibrary& lt = cuda::cublaslt();
  EXPECT_STREQ(lt.GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(lt.GetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  const std::string path = cuda::cublaslt_path();
  EXPECT_NE(path.find("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR)), std::string::npos)
      << path;
  for (const void* f :
       {reinterpret_cast<const void*>(lt.Create), reinterpret_cast<const void*>(lt.Matmul),
        reinterpret_cast<const void*>(lt.MatmulAlgoGetHeuristic),
        reinterpret_cast<const void*>(lt.MatrixLayoutDestroy)})
    EXPECT_NE(f, nullptr);
}

TEST(CudaMatmul, TuneSettingIsParsedOrRefused) {
  EXPECT_EQ(cuda::parse_cublaslt_tune(nullptr), 1);
  EXPECT_EQ(cuda::parse_cublaslt_tune(""), 1);
  EXPECT_EQ(cuda::parse_cublaslt_tune("8"), 8);
  EXPECT_EQ(cuda::parse_cublaslt_tune("32"), 32);
  for (const char* bad : {"0", "33", "-1", "8x", "fast"}) {
    try {
      cuda::parse_cublaslt_tune(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("ZEROD_CUBLASLT_TUNE"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// The fully connected layer and its GELU as one op (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues
// in 16-bit storage; fp32 and shapes cuBLASLt refuses (OC not a multiple of 8) take the separate
// ops) against the CPU's separate matmul and GELU, forward (pre and out) and backward (dpre,
// dweight and dbias accumulated).
constexpr Shape kGeluShapes[] = {{64, 128, 192}, {1000, 64, 256}, {37, 48, 70}};

TEST(CudaMatmul, FusedGeluForwardAndBackwardMatchTheSeparateOps) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kGeluShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      EXPECT_EQ(be.gpu->fuses_matmul_gelu(), dt != DType::kF32);
      EXPECT_FALSE(be.cpu->fuses_matmul_gelu());
      const int64_t NC = s.N * s.C, NO = s.N * s.OC, OCC = int64_t{s.OC} * s.C;
      const VecF inp = be.round(test::randn(NC, 90));
      const VecF w = be.round(test::randn(OCC, 91, 0.2f));
      const VecF b = be.round(test::randn(s.OC, 92, 0.5f));
      VecF pre(NO), out(NO);
      be.cpu->matmul_forward(pre.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC);
      pre = be.round(pre);
      be.cpu->gelu_forward(out.data(), pre.data(), NO);
      out = be.round(out);
      Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_b = be.compute(b);
      Buffer d_pre = be.poisoned_compute(NO), d_out = be.poisoned_compute(NO);
      be.gpu->matmul_gelu_forward(d_out.data(), d_pre.data(), d_inp.data(), d_w.data(), d_b.data(),
                                  s.N, s.C, s.OC);
      EXPECT_TRUE(test::close(be.read_compute(d_pre, NO), pre, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_out, NO), out, test::tolerance(dt)));

      // Backward of the next layer, whose input is out = gelu(pre): a (N, OC) -> (N, C2) matmul.
      const int C2 = 72;
      const VecF w2 = be.round(test::randn(int64_t{C2} * s.OC, 93, 0.2f));
      const VecF dout = be.round(test::randn(s.N * C2, 94));
      VecF dw2 = be.round(test::randn(int64_t{C2} * s.OC, 95, 0.5f));
      VecF db2 = be.round(test::randn(C2, 96, 0.5f));
      Buffer d_w2 = be.compute(w2), d_dout = be.compute(dout), d_dw2 = be.compute(dw2),
             d_db2 = be.compute(db2), d_gin = be.compute(out), d_gpre = be.compute(pre);
      VecF dpre(NO);
      be.cpu->matmul_backward(dpre.data(), dw2.data(), db2.data(), dout.data(), out.data(),
                              w2.data(), s.N, s.OC, C2, false);
      dpre = be.round(dpre);
      be.cpu->gelu_backward(dpre.data(), pre.data(), dpre.data(), NO);
      Buffer d_dpre = be.poisoned_compute(NO);
      be.gpu->matmul_backward_dgelu(d_dpre.data(), d_dw2.data(), d_db2.data(), d_dout.data(),
                                    d_gin.data(), d_w2.data(), d_gpre.data(), s.N, s.OC, C2);
      EXPECT_TRUE(test::close(be.read_compute(d_dpre, NO), dpre, test::tolerance(dt)));
      EXPECT_TRUE(
          test::close(be.read_compute(d_dw2, int64_t{C2} * s.OC), dw2, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_db2, C2), db2, test::tolerance(dt)));
    }
  }
}

}  // namespace
}  // namespace zerod
