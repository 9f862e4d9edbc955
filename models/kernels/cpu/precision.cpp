// models/kernels/cpu/precision.cpp: the CPU set's precision (per thread) and its low-precision emulation: operands
// rounded to bf16 / fp16, then float32 arithmetic (the rounding gemm.cpp and conv.cpp use); and the log line saying
// how the CPU computes in a precision.
#include "models/kernels/cpu/cpu_kernels.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/bfloat16.h"
#include "models/kernels/cpu/onednn_conv.h"

namespace dpt::models {

std::string describe_cpu_gemm() {
  if (!detail::gemm_onednn()) return fmt::format("OpenBLAS ({} kernels; DPT_CPU_GEMM=openblas)", blas_core());
  if (onednn::max_threads() > 1)  // gemm.cpp: oneDNN's sgemm runs on one thread only
    return fmt::format("OpenBLAS ({} kernels; with {} threads: oneDNN's sgemm runs with one)", blas_core(),
                       onednn::max_threads());
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const char* name = isa == dnnl_cpu_isa_avx512_core_amx    ? "avx512_core_amx"
                     : isa == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
                     : isa == dnnl_cpu_isa_avx512_core_vnni ? "avx512_core_vnni"
                     : isa == dnnl_cpu_isa_avx512_core      ? "avx512_core"
                     : isa == dnnl_cpu_isa_avx2_vnni        ? "avx2_vnni"
                     : isa == dnnl_cpu_isa_avx2             ? "avx2"
                     : isa == dnnl_cpu_isa_avx              ? "avx"
                     : isa == dnnl_cpu_isa_sse41            ? "sse41"
                                                            : "other";
  return fmt::format("oneDNN's sgemm ({}; DPT_CPU_GEMM=openblas: OpenBLAS's)", name);
}

std::string describe_cpu_arithmetic(Precision p) {
  const char* name = p == Precision::BF16 ? "bf16" : p == Precision::F16 ? "fp16" : "fp32";
  if (p == Precision::F32)
    return fmt::format("fp32 on the CPU: convolutions in {}, matrix products in {}",
                       onednn::enabled() ? onednn::describe() : "im2col + the GEMM (DPT_CPU_CONV=im2col)",
                       describe_cpu_gemm());
  const std::string emulated =
      fmt::format("operands rounded to {}, float32 arithmetic in {}", name, describe_cpu_gemm());
  if (p == Precision::BF16 && onednn::enabled() && onednn::supports(p))
    return fmt::format("bf16 on the CPU: convolutions in oneDNN's bf16 kernels (float32 accumulation); matrix "
                       "products emulated ({})", emulated);
  return fmt::format("{} on the CPU is emulated: matrix products and convolutions with {} (no {} kernels for this "
                     "CPU in Debian's OpenBLAS or oneDNN): the numerics of {}, slower than fp32 (the rounding is an "
                     "extra pass)",
                     name, emulated, name, name);
}

std::string describe_cpu_threads() {
  return fmt::format("threads: OpenBLAS {}, oneDNN {}", openblas_get_num_threads(), onednn::max_threads());
}

bool limit_cpu_threads(int openmp, int openblas) {
  bool changed = false;
  if (openmp > 0 && openmp < omp_get_max_threads()) {
    omp_set_num_threads(openmp);
    changed = true;
  }
  if (openblas > 0 && openblas < openblas_get_num_threads()) {
    openblas_set_num_threads(openblas);
    changed = true;
  }
  return changed;
}

// Without the library call the
// conversion compiles to on a generic x86-64 target (5x slower): round to nearest even at fp16's 11
// significant bits for normal values, to a multiple of 2^-24 for fp16's subnormals; 65520 and up overflow
// to infinity; NaN kept.
float round_to_fp16(float x) {
  const float a = std::fabs(x);
  if (!(a < 65520.0f)) return a == a ? std::copysign(std::numeric_limits<float>::infinity(), x) : x;
  if (a < 0x1p-14f) return std::copysign(std::nearbyint(a * 0x1p24f) * 0x1p-24f, x);
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0xFFFu + ((bits >> 13) & 1u);
  bits &= 0xFFFFE000u;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

namespace {

thread_local Precision tl_precision = Precision::F32;

}  // namespace

namespace detail {

Precision thread_precision() { return tl_precision; }

// A copy of the rows x cols matrix at `src` (row stride ld) with every value rounded to `p`, packed (stride
// cols), in one of two per-thread buffers.
const float* rounded(const float* src, int64_t rows, int64_t cols, int64_t ld, Precision p, int which) {
  thread_local std::vector<float> buffers[2];
  auto& buf = buffers[which];
  buf.resize(static_cast<size_t>(rows * cols));
  float* out = buf.data();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * ld;
    float* o = out + r * cols;
    if (p == Precision::BF16) {
      for (int64_t c = 0; c < cols; ++c) o[c] = dpt::round_to_bf16(in[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) o[c] = round_to_fp16(in[c]);
    }
  }
  return out;
}

}  // namespace detail

void CpuKernels::set_precision(Precision p) { tl_precision = p; }
Precision CpuKernels::precision() const { return tl_precision; }

}  // namespace dpt::models
