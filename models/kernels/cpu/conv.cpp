// models/kernels/cpu/conv.cpp: the CPU convolutions: through oneDNN (onednn_conv.cpp) where it has a kernel for the
// shape and precision, else im2col + the OpenBLAS GEMM (a pointwise convolution is a GEMM on the image itself).
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <vector>

#include "models/kernels/cpu/onednn_conv.h"

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
  const Precision p = detail::thread_precision();
  if (p == Precision::F32 || onednn::supports(p)) return conv(a, b, out, cs, p);
  return conv(detail::rounded(a, 1, a_count, a_count, p, 0), detail::rounded(b, 1, b_count, b_count, p, 1), out,
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

// A convolution with one output position whose window covers the whole input (p = q = 1, h + pad <= r and
// w + pad <= s; ResNet's last stage on 32-pixel images: 3x3 pad 1 on 1x1, 3x3 stride 2 pad 1 on 2x2): input
// position (h, w) meets tap (h + pad, w + pad) and no other, and the other taps meet only padding. So it is one GEMM
// over the batch, y [n, k] = x [n, chw] x weff^T, with weff [k, chw] the taps that meet the input; oneDNN's kernels
// multiplied the padding too (a 3x3 on 1x1 is 8/9 zeros; its backward-weights ran at 0.05-0.1 TFLOP/s: 44 ms of a
// ResNet-18 step at batch 256, 32 px, on this project's 2-core EPYC).
bool is_single_window(const ConvShape& cs) {
  return cs.p == 1 && cs.q == 1 && cs.h + cs.pad <= cs.r && cs.w + cs.pad <= cs.s;
}

// The thread's buffers for weff and its gradient, grown on demand and kept.
float* window_buffer(int slot, size_t count) {
  thread_local std::vector<float> buffers[2];
  auto& b = buffers[slot];
  if (b.size() < count) b.resize(count);
  return b.data();
}

// weff [k, chw]: the taps of w [k, c, r, s] that meet the input.
const float* window_weights(const float* w, const ConvShape& cs) {
  const int64_t hw = cs.h * cs.w;
  float* weff = window_buffer(0, static_cast<size_t>(cs.k * cs.c * hw));
  for (int64_t kc = 0; kc < cs.k * cs.c; ++kc)
    for (int64_t h = 0; h < cs.h; ++h)
      for (int64_t x = 0; x < cs.w; ++x) weff[kc * hw + h * cs.w + x] = w[(kc * cs.r + h + cs.pad) * cs.s + x + cs.pad];
  return weff;
}

}  // namespace

void CpuKernels::conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) {
  check_conv_shape(cs);
  if (is_single_window(cs)) {  // y [n, k] = x [n, chw] x weff^T
    const int64_t chw = cs.c * cs.h * cs.w;
    gemm(false, true, cs.n, cs.k, chw, 1.0f, x, chw, window_weights(w, cs), chw, 0.0f, y, cs.k);
    return;
  }
  if (onednn_conv(&onednn::conv2d_forward, x, x_count(cs), w, w_count(cs), y, cs)) return;
  const int64_t crs = cs.c * cs.r * cs.s, pq = cs.p * cs.q;
  float* col = is_pointwise(cs) ? nullptr : workspace(static_cast<size_t>(crs * pq));
  for (int64_t n = 0; n < cs.n; ++n)  // y[n] [k, pq] = w [k, crs] x col [crs, pq]
    gemm(false, false, cs.k, pq, crs, 1.0f, w, crs, columns_of(x, n, cs, col), pq, 0.0f, y + n * cs.k * pq, pq);
}

void CpuKernels::conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) {
  check_conv_shape(cs);
  if (is_single_window(cs)) {  // dx [n, chw] = dy [n, k] x weff
    const int64_t chw = cs.c * cs.h * cs.w;
    gemm(false, false, cs.n, chw, cs.k, 1.0f, dy, cs.k, window_weights(w, cs), chw, 0.0f, dx, chw);
    return;
  }
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
  if (is_single_window(cs)) {  // dweff [k, chw] = dy^T [k, n] x x [n, chw], added into its taps of dw
    const int64_t chw = cs.c * cs.h * cs.w, hw = cs.h * cs.w;
    float* g = window_buffer(1, static_cast<size_t>(cs.k * chw));
    gemm(true, false, cs.k, chw, cs.n, 1.0f, dy, cs.k, x, chw, 0.0f, g, chw);
    for (int64_t kc = 0; kc < cs.k * cs.c; ++kc)
      for (int64_t h = 0; h < cs.h; ++h)
        for (int64_t xw = 0; xw < cs.w; ++xw)
          dw[(kc * cs.r + h + cs.pad) * cs.s + xw + cs.pad] += g[kc * hw + h * cs.w + xw];
    return;
  }
  if (onednn_conv(&onednn::conv2d_backward_weight, dy, y_count(cs), x, x_count(cs), dw, cs)) return;
  const int64_t crs = cs.c * cs.r * cs.s, pq = cs.p * cs.q;
  float* col = is_pointwise(cs) ? nullptr : workspace(static_cast<size_t>(crs * pq));
  for (int64_t n = 0; n < cs.n; ++n)  // dw [k, crs] += dy[n] [k, pq] x col^T [pq, crs]
    gemm(false, true, cs.k, crs, pq, 1.0f, dy + n * cs.k * pq, pq, columns_of(x, n, cs, col), pq, 1.0f, dw, crs);
}

}  // namespace dpt::models
