// models/kernels/cpu/gemm.cpp: the CPU GEMM through OpenBLAS (cblas_sgemm), with the operands rounded first under
// BF16 / F16 (precision.cpp); and which OpenBLAS kernels run (blas_core, blas_core_upgrade).
#include "models/kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>

namespace dpt::models {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string blas_core_upgrade() {
  if (std::getenv("OPENBLAS_CORETYPE")) return "";  // the user's choice
  static const std::set<std::string> older = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                              "katmai", "coppermine", "northwood", "banias", "sandybridge"};
  std::string core = blas_core();
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!older.count(core)) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void CpuKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                      int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
  const Precision p = detail::thread_precision();
  if (M == 0 || N == 0) return;
  if (p != Precision::F32 && K > 0) {
    // op(A) is M x K, stored as (trans_a ? K x M : M x K); likewise B. Round them, then multiply in float32.
    A = detail::rounded(A, trans_a ? K : M, trans_a ? M : K, lda, p, 0);
    lda = trans_a ? M : K;
    B = detail::rounded(B, trans_b ? N : K, trans_b ? K : N, ldb, p, 1);
    ldb = trans_b ? K : N;
  }
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "gemm dimensions exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace dpt::models
