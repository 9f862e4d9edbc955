// models/kernels/cpu/cpu_kernels.cpp: the CPU kernel set.
#include "models/kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/bfloat16.h"
#include "models/kernels/cpu/onednn_conv.h"
#include "models/kernels/elementwise.h"

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

std::string describe_cpu_arithmetic(Precision p) {
  const char* name = p == Precision::BF16 ? "bf16" : p == Precision::F16 ? "fp16" : "fp32";
  if (p == Precision::F32)
    return fmt::format("fp32 on the CPU: convolutions in {}, matrix products in OpenBLAS ({} kernels)",
                       onednn::enabled() ? onednn::describe() : "im2col + OpenBLAS (DPT_CPU_CONV=im2col)", blas_core());
  const std::string emulated = fmt::format("operands rounded to {}, float32 arithmetic", name);
  if (p == Precision::BF16 && onednn::enabled() && onednn::supports(p))
    return fmt::format("bf16 on the CPU: convolutions in oneDNN's bf16 kernels (float32 accumulation); matrix "
                       "products emulated ({}: Debian's OpenBLAS has no bf16 GEMM)", emulated);
  return fmt::format("{} on the CPU is emulated: matrix products and convolutions with {} (no {} kernels for this "
                     "CPU in Debian's OpenBLAS or oneDNN): the numerics of {}, slower than fp32 (the rounding is an "
                     "extra pass)",
                     name, emulated, name, name);
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

}  // namespace

void CpuKernels::set_precision(Precision p) { tl_precision = p; }
Precision CpuKernels::precision() const { return tl_precision; }

void CpuKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                      int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
  if (M == 0 || N == 0) return;
  if (tl_precision != Precision::F32 && K > 0) {
    // op(A) is M x K, stored as (trans_a ? K x M : M x K); likewise B. Round them, then multiply in float32.
    A = rounded(A, trans_a ? K : M, trans_a ? M : K, lda, tl_precision, 0);
    lda = trans_a ? M : K;
    B = rounded(B, trans_b ? N : K, trans_b ? K : N, ldb, tl_precision, 1);
    ldb = trans_b ? K : N;
  }
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
            "gemm dimensions exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

void CpuKernels::bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    if (relu) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = elementwise::bias_act(xr[c], bias[c], true);
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] = elementwise::bias_act(xr[c], bias[c], false);
    }
  }
}

void CpuKernels::bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) db[c] += dyr[c];
  }
}

void CpuKernels::relu_backward(const float* y, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = elementwise::relu_backward(y[i], dy[i]);
}

void CpuKernels::softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                              double* stats) {
  double loss = 0.0;
  int64_t hits = 0;
  const float inv_rows = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    const int32_t label = labels[r];
    DPT_CHECK(label >= 0 && label < cols, "label {} outside [0, {})", label, cols);
    int64_t argmax = 0;
    float zmax = z[0];
    for (int64_t c = 1; c < cols; ++c) {
      if (z[c] > zmax) {
        zmax = z[c];
        argmax = c;
      }
    }
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    loss += log_sum - static_cast<double>(z[label] - zmax);
    hits += argmax == label;
    if (dlogits) {
      float* d = dlogits + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - zmax) - log_sum);
        d[c] = static_cast<float>(p - (c == label ? 1.0 : 0.0)) * inv_rows;
      }
    }
  }
  stats[0] += loss;
  stats[1] += static_cast<double>(hits);
}

void CpuKernels::sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) {
  for (size_t i = 0; i < n; ++i) elementwise::sgd(param[i], grad[i], buf ? buf + i : nullptr, p);
}

void CpuKernels::adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) {
  const elementwise::AdamWStep s = elementwise::adamw_step(p);
  for (size_t i = 0; i < n; ++i) elementwise::adamw(param[i], grad[i], m[i], v[i], s);
}

void CpuKernels::scale(float* x, size_t n, float alpha) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

double CpuKernels::sum_squares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void CpuKernels::clip_by_norm(float* x, size_t n, const double* ss, double max_norm) {
  const double coef = elementwise::clip_coefficient(*ss, max_norm);
  if (coef < 1.0) scale(x, n, static_cast<float>(coef));
}

}  // namespace dpt::models

// ---- convolutional networks -------------------------------------------------------------------------------

namespace dpt::models {
namespace {

// The im2col buffer of the calling thread, grown on demand and kept (a step reuses it for every layer).
float* workspace(size_t count) {
  thread_local std::vector<float> ws;
  if (ws.size() < count) ws.resize(count);
  return ws.data();
}

// The convolution through oneDNN: in its own kernels for F32 and (where the CPU has them) BF16; other low
// precisions are emulated on its F32 kernels with both operands rounded first (the numerics of the im2col
// path, at oneDNN's speed). False when oneDNN is turned off or has no kernel for the shape: im2col then.
using OneDnnConv = bool (*)(const float*, const float*, float*, const ConvShape&, Precision);
bool onednn_conv(OneDnnConv conv, const float* a, int64_t a_count, const float* b, int64_t b_count, float* out,
                 const ConvShape& cs) {
  if (!onednn::enabled()) return false;
  if (tl_precision == Precision::F32 || onednn::supports(tl_precision)) return conv(a, b, out, cs, tl_precision);
  return conv(rounded(a, 1, a_count, a_count, tl_precision, 0), rounded(b, 1, b_count, b_count, tl_precision, 1), out,
              cs, Precision::F32);
}
int64_t x_count(const ConvShape& cs) { return cs.n * cs.c * cs.h * cs.w; }
int64_t w_count(const ConvShape& cs) { return cs.k * cs.c * cs.r * cs.s; }
int64_t y_count(const ConvShape& cs) { return cs.n * cs.k * cs.p * cs.q; }

bool is_pointwise(const ConvShape& cs) { return cs.r == 1 && cs.s == 1 && cs.stride == 1 && cs.pad == 0; }

// The output columns q whose input column q*stride - pad + s lies inside [0, w): [lo, hi).
struct ValidCols {
  int64_t lo, hi;
};
ValidCols valid_cols(const ConvShape& cs, int64_t s) {
  const int64_t off = s - cs.pad;  // input column of output column 0
  int64_t lo = off >= 0 ? 0 : (-off + cs.stride - 1) / cs.stride;
  int64_t hi = cs.w - off <= 0 ? 0 : (cs.w - off + cs.stride - 1) / cs.stride;
  hi = std::min(hi, cs.q);
  lo = std::min(lo, hi);
  return {lo, hi};
}

// col[(c, r, s), (p, q)] = x[c, p*stride - pad + r, q*stride - pad + s] (0 outside the image): one image.
// The valid column range of each (s) is computed once, so the inner loops are branch-free copies.
void im2col(const float* x, const ConvShape& cs, float* col) {
  const int64_t pq = cs.p * cs.q;
  for (int64_t c = 0; c < cs.c; ++c)
    for (int64_t r = 0; r < cs.r; ++r)
      for (int64_t s = 0; s < cs.s; ++s) {
        float* out = col + ((c * cs.r + r) * cs.s + s) * pq;
        const float* plane = x + c * cs.h * cs.w;
        const auto [lo, hi] = valid_cols(cs, s);
        const int64_t off = s - cs.pad;
        for (int64_t p = 0; p < cs.p; ++p) {
          const int64_t h = p * cs.stride - cs.pad + r;
          float* row = out + p * cs.q;
          if (h < 0 || h >= cs.h) {
            std::fill(row, row + cs.q, 0.0f);
            continue;
          }
          const float* in = plane + h * cs.w + off;
          std::fill(row, row + lo, 0.0f);
          if (cs.stride == 1) {
            std::copy(in + lo, in + hi, row + lo);
          } else {
            for (int64_t q = lo; q < hi; ++q) row[q] = in[q * cs.stride];
          }
          std::fill(row + hi, row + cs.q, 0.0f);
        }
      }
}

// The adjoint of im2col: dx[c, h, w] += col[(c, r, s), (p, q)] for every (r, s, p, q) that read x[c, h, w].
void col2im(const float* col, const ConvShape& cs, float* dx) {
  const int64_t pq = cs.p * cs.q;
  for (int64_t c = 0; c < cs.c; ++c)
    for (int64_t r = 0; r < cs.r; ++r)
      for (int64_t s = 0; s < cs.s; ++s) {
        const float* in = col + ((c * cs.r + r) * cs.s + s) * pq;
        float* plane = dx + c * cs.h * cs.w;
        const auto [lo, hi] = valid_cols(cs, s);
        const int64_t off = s - cs.pad;
        for (int64_t p = 0; p < cs.p; ++p) {
          const int64_t h = p * cs.stride - cs.pad + r;
          if (h < 0 || h >= cs.h) continue;
          float* out = plane + h * cs.w + off;
          const float* row = in + p * cs.q;
          if (cs.stride == 1) {
            for (int64_t q = lo; q < hi; ++q) out[q] += row[q];
          } else {
            for (int64_t q = lo; q < hi; ++q) out[q * cs.stride] += row[q];
          }
        }
      }
}

// The [crs, pq] matrix the GEMMs read for image n: its im2col in `col`, or the image itself when the
// convolution is pointwise (col == nullptr).
const float* columns_of(const float* x, int64_t n, const ConvShape& cs, float* col) {
  const float* xn = x + n * cs.c * cs.h * cs.w;
  if (!col) return xn;
  im2col(xn, cs, col);
  return col;
}

}  // namespace

void CpuKernels::conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) {
  check_conv_shape(cs);
  if (onednn_conv(&onednn::conv2d_forward, x, x_count(cs), w, w_count(cs), y, cs)) return;
  const int64_t crs = cs.c * cs.r * cs.s, pq = cs.p * cs.q;
  float* col = is_pointwise(cs) ? nullptr : workspace(static_cast<size_t>(crs * pq));
  for (int64_t n = 0; n < cs.n; ++n)  // y[n] [k, pq] = w [k, crs] x col [crs, pq]
    gemm(false, false, cs.k, pq, crs, 1.0f, w, crs, columns_of(x, n, cs, col), pq, 0.0f, y + n * cs.k * pq, pq);
}

void CpuKernels::conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) {
  check_conv_shape(cs);
  if (onednn_conv(&onednn::conv2d_backward_data, dy, y_count(cs), w, w_count(cs), dx, cs)) return;
  const int64_t crs = cs.c * cs.r * cs.s, pq = cs.p * cs.q, chw = cs.c * cs.h * cs.w;
  if (is_pointwise(cs)) {
    // dx[n] [c, hw] = w^T [c, k] x dy[n] [k, hw]
    for (int64_t n = 0; n < cs.n; ++n)
      gemm(true, false, cs.c, pq, cs.k, 1.0f, w, crs, dy + n * cs.k * pq, pq, 0.0f, dx + n * chw, pq);
    return;
  }
  float* col = workspace(static_cast<size_t>(crs * pq));
  for (int64_t n = 0; n < cs.n; ++n) {
    gemm(true, false, crs, pq, cs.k, 1.0f, w, crs, dy + n * cs.k * pq, pq, 0.0f, col, pq);
    float* dxn = dx + n * chw;
    std::fill(dxn, dxn + chw, 0.0f);
    col2im(col, cs, dxn);
  }
}

void CpuKernels::conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) {
  check_conv_shape(cs);
  if (onednn_conv(&onednn::conv2d_backward_weight, dy, y_count(cs), x, x_count(cs), dw, cs)) return;
  const int64_t crs = cs.c * cs.r * cs.s, pq = cs.p * cs.q;
  float* col = is_pointwise(cs) ? nullptr : workspace(static_cast<size_t>(crs * pq));
  for (int64_t n = 0; n < cs.n; ++n)  // dw [k, crs] += dy[n] [k, pq] x col^T [pq, crs]
    gemm(false, true, cs.k, crs, pq, 1.0f, dy + n * cs.k * pq, pq, columns_of(x, n, cs, col), pq, 1.0f, dw, crs);
}

void CpuKernels::bn_stats(const float* x, const BnShape& bs, double* sums) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    double s = 0, ss = 0;
    for (int64_t n = 0; n < bs.n; ++n) {
      const float* p = x + (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) {
        const double v = p[i];
        s += v;
        ss += v * v;
      }
    }
    sums[ch] = s;
    sums[bs.c + ch] = ss;
  }
  sums[2 * bs.c] = static_cast<double>(bs.n * bs.hw);
}

void CpuKernels::bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                  const BnShape& bs, float eps, float momentum, float* running_mean,
                                  float* running_var, float* save_mean, float* save_invstd, float* y) {
  const double count = sums[2 * bs.c];
  DPT_CHECK(count > 0, "batch norm over an empty batch");
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const elementwise::BnMoments m = elementwise::bn_moments(sums[ch], sums[bs.c + ch], count, eps);
    save_mean[ch] = m.mean;
    save_invstd[ch] = m.invstd;
    running_mean[ch] = elementwise::lerp_running(running_mean[ch], m.mean, momentum);
    running_var[ch] = elementwise::lerp_running(running_var[ch], m.unbiased_var, momentum);
    const float a = gamma[ch] * m.invstd, b = beta[ch] - m.mean * a;
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) y[off + i] = x[off + i] * a + b;
    }
  }
}

void CpuKernels::bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                 const float* running_var, const BnShape& bs, float eps, float* y) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const float invstd = 1.0f / std::sqrt(running_var[ch] + eps);
    const float a = gamma[ch] * invstd, b = beta[ch] - running_mean[ch] * a;
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) y[off + i] = x[off + i] * a + b;
    }
  }
}

void CpuKernels::bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                                    const BnShape& bs, double* sums, float* dgamma, float* dbeta) {
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    double sdy = 0, sdyx = 0;
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) {
        const double g = dy[off + i];
        sdy += g;
        sdyx += g * (x[off + i] - mean) * invstd;
      }
    }
    sums[ch] = sdy;
    sums[bs.c + ch] = sdyx;
    dbeta[ch] += static_cast<float>(sdy);
    dgamma[ch] += static_cast<float>(sdyx);
  }
  sums[2 * bs.c] = static_cast<double>(bs.n * bs.hw);
}

void CpuKernels::bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                  const float* save_invstd, const double* sums, const BnShape& bs, float* dx) {
  const double count = sums[2 * bs.c];
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const elementwise::BnBackward k =
        elementwise::bn_backward_coefficients(gamma[ch], save_mean[ch], save_invstd[ch], sums[ch], sums[bs.c + ch], count);
    for (int64_t n = 0; n < bs.n; ++n) {
      const int64_t off = (n * bs.c + ch) * bs.hw;
      for (int64_t i = 0; i < bs.hw; ++i) dx[off + i] = elementwise::bn_backward(dy[off + i], x[off + i], k);
    }
  }
}

void CpuKernels::relu(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void CpuKernels::add(const float* a, const float* b, float* y, size_t n, bool relu) {
  if (relu) {
    for (size_t i = 0; i < n; ++i) {
      const float v = a[i] + b[i];
      y[i] = v > 0.0f ? v : 0.0f;
    }
  } else {
    for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
}

void CpuKernels::maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) {
  for (int64_t plane = 0; plane < ps.n * ps.c; ++plane) {
    const float* in = x + plane * ps.h * ps.w;
    for (int64_t p = 0; p < ps.p; ++p)
      for (int64_t q = 0; q < ps.q; ++q) {
        const int64_t o = (plane * ps.p + p) * ps.q + q;
        y[o] = elementwise::maxpool_window(in, ps, p, q, argmax[o]);
      }
  }
}

void CpuKernels::maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) {
  std::fill(dx, dx + ps.n * ps.c * ps.h * ps.w, 0.0f);
  for (int64_t plane = 0; plane < ps.n * ps.c; ++plane) {
    float* out = dx + plane * ps.h * ps.w;
    const int64_t o = plane * ps.p * ps.q;
    for (int64_t i = 0; i < ps.p * ps.q; ++i) out[argmax[o + i]] += dy[o + i];
  }
}

void CpuKernels::avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) {
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t i = 0; i < rows; ++i) {
    float s = 0.0f;
    for (int64_t j = 0; j < hw; ++j) s += x[i * hw + j];
    y[i] = s * inv;
  }
}

void CpuKernels::avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) {
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t i = 0; i < rows; ++i) {
    const float g = dy[i] * inv;
    for (int64_t j = 0; j < hw; ++j) dx[i * hw + j] = g;
  }
}

// ---- transformers (GPT) ---------------------------------------------------------------------------------------

void CpuKernels::embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                                   int64_t T, int64_t C, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t tok = tokens[r];
    if (tok < 0 || tok >= vocab)
      DPT_THROW(ConfigError, "token {} at position {} is outside the vocabulary [0, {})", tok, r, vocab);
    const float* e = wte + static_cast<int64_t>(tok) * C;
    const float* p = wpe + (r % T) * C;
    float* o = y + r * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void CpuKernels::split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < T; ++i) {
      input[r * T + i] = static_cast<int32_t>(windows[r * (T + 1) + i]);
      next[r * T + i] = static_cast<int32_t>(windows[r * (T + 1) + i + 1]);
    }
}

void CpuKernels::embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                                    int64_t T, int64_t C, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    if (tokens[r] < 0 || tokens[r] >= vocab)
      DPT_THROW(InternalError, "embedding backward: token {} at row {} outside the vocabulary of {}", tokens[r], r, vocab);
    const float* g = dy + r * C;
    float* e = dwte + static_cast<int64_t>(tokens[r]) * C;
    float* p = dwpe + (r % T) * C;
    for (int64_t c = 0; c < C; ++c) {
      e[c] += g[c];
      p[c] += g[c];
    }
  }
}

void CpuKernels::layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                   float* rstd, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * C;
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += in[c];
    const float m = static_cast<float>(sum / static_cast<double>(C));
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = in[c] - m;
      var += d * d;
    }
    const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + eps));
    float* out = y + r * C;
    for (int64_t c = 0; c < C; ++c) out[c] = (in[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void CpuKernels::layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                                    int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = dy + r * C;
    const float* in = x + r * C;
    const float m = mean[r], s = rstd[r];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma
    double sum_d = 0.0, sum_dx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (in[c] - m) * s;
      const float d = g[c] * gamma[c];
      sum_d += d;
      sum_dx += static_cast<double>(d) * xhat;
      dgamma[c] += g[c] * xhat;
      dbeta[c] += g[c];
    }
    const float mean_d = static_cast<float>(sum_d / static_cast<double>(C));
    const float mean_dx = static_cast<float>(sum_dx / static_cast<double>(C));
    float* out = dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (in[c] - m) * s;
      out[c] = s * (g[c] * gamma[c] - mean_d - xhat * mean_dx);
    }
  }
}

void CpuKernels::gelu_forward(const float* x, float* y, size_t n) {
  if (onednn::gelu_forward(x, y, n)) return;
  for (size_t i = 0; i < n; ++i) y[i] = elementwise::gelu(x[i]);
}

void CpuKernels::gelu_backward(const float* x, const float* dy, float* dx, size_t n) {
  if (onednn::gelu_backward(x, dy, dx, n)) return;
  for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * elementwise::gelu_grad(x[i]);
}

void CpuKernels::causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) {
  DPT_CHECK(rows >= 1 && rows <= cols, "causal softmax of {} x {} matrices: need 1 <= rows <= cols", rows, cols);
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      float* row = s + (m * rows + i) * cols;
      const int64_t last = i + cols - rows;  // the last column row i sees
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, scale * row[j]);
      double sum = 0.0;
      for (int64_t j = 0; j <= last; ++j) {
        row[j] = std::exp(scale * row[j] - mx);
        sum += row[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
      for (int64_t j = last + 1; j < cols; ++j) row[j] = 0.0f;
    }
}

void CpuKernels::causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) {
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < T; ++i) {
      const float* pr = p + (m * T + i) * T;
      float* dr = dp + (m * T + i) * T;
      double dot = 0.0;
      for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * dr[j];
      const float d = static_cast<float>(dot);
      for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - d);
      for (int64_t j = i + 1; j < T; ++j) dr[j] = 0.0f;
    }
}

}  // namespace dpt::models
