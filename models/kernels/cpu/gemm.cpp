// models/kernels/cpu/gemm.cpp: the CPU GEMM, in oneDNN's sgemm (default) or OpenBLAS's (DPT_CPU_GEMM=openblas), with
// the operands rounded first under BF16 / F16 (precision.cpp); and which OpenBLAS kernels run (blas_core,
// blas_core_upgrade).
#include "models/kernels/cpu/cpu_kernels.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>

#include "models/kernels/cpu/onednn_conv.h"

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

namespace detail {

namespace {
thread_local int tl_gemm_onednn = -1;  // -1: as DPT_CPU_GEMM says
}  // namespace

bool gemm_onednn() {
  static const bool by_env = [] {
    const char* v = std::getenv("DPT_CPU_GEMM");
    if (!v || !*v || std::string(v) == "onednn") return true;
    if (std::string(v) == "openblas") return false;
    DPT_THROW(ConfigError, "DPT_CPU_GEMM={}: expected onednn or openblas", v);
  }();
  return tl_gemm_onednn < 0 ? by_env : tl_gemm_onednn == 1;
}

void set_gemm_onednn(bool on) { tl_gemm_onednn = on ? 1 : 0; }

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS's rule, C = beta C (beta 0: C not read); oneDNN's sgemm returns without touching C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  if (gemm_onednn() && onednn::max_threads() == 1) {
    // Debian's oneDNN 2.6.3 sgemm corrupts memory when a signal is delivered while its kernels run (a no-op SIGALRM
    // handler firing every 37 us broke it within 1800 calls; its convolutions and OpenBLAS took the same unharmed):
    // dptrain's stop handlers (SIGUSR1, SIGTERM) did, in integration.checkpoint_failure. So the calling thread
    // holds every signal for the call, and they arrive after it (or at another thread); and oneDNN runs it on this
    // thread alone: with more OpenMP threads its workers would take signals mid-kernel, so OpenBLAS runs those.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    const dnnl_status_t st =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    DPT_CHECK(st == dnnl_success, "oneDNN sgemm {}x{}x{} (lda {}, ldb {}, ldc {}): status {}", M, N, K, lda, ldb, ldc,
              static_cast<int>(st));
    return;
  }
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "gemm dimensions exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace detail

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
  detail::sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace dpt::models
