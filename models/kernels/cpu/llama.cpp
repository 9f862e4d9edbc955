// models/kernels/cpu/llama.cpp: the Llama family's layers on the CPU (the reference the CUDA set is tested against):
// RMSNorm (row sums in double, row_sums.h), SwiGLU (its sigmoid through oneDNN) and rotary embeddings, their
// per-element arithmetic elementwise.h's; one template each over float32 or bf16 activations (bf16 read widened,
// written rounded once).
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/cpu/activation_io.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "models/kernels/cpu/onednn_conv.h"
#include "models/kernels/cpu/row_sums.h"
#include "models/kernels/elementwise.h"

namespace dpt::models {

namespace {

using cpu_act::ld;
using cpu_act::st;
using cpu_sums::sum8;

template <class T>
void rmsnorm_forward_rows(const T* x, const float* gamma, T* y, float* rstd, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * C;
    const double ss = sum8(C, [in](int64_t c) { return static_cast<double>(ld(in, c)) * ld(in, c); });
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    T* out = y + r * C;
    for (int64_t c = 0; c < C; ++c) st(out, c, ld(in, c) * s * gamma[c]);
    rstd[r] = s;
  }
}

// residual (null: none): added to dx in float32 before its one rounding; it may alias dx.
template <class T>
void rmsnorm_backward_rows(const T* dy, const T* x, const float* gamma, const float* rstd, T* dx, float* dgamma,
                           int64_t rows, int64_t C, const T* residual) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = dy + r * C;
    const T* in = x + r * C;
    const float s = rstd[r];
    for (int64_t c = 0; c < C; ++c) dgamma[c] += ld(g, c) * (ld(in, c) * s);
    // the sum of dy * gamma * xhat
    const double sum = sum8(C, [&](int64_t c) { return static_cast<double>(ld(g, c)) * gamma[c] * (ld(in, c) * s); });
    const float mean = static_cast<float>(sum / static_cast<double>(C));
    T* out = dx + r * C;
    const T* res = residual ? residual + r * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const float v = s * (ld(g, c) * gamma[c] - ld(in, c) * s * mean);
      st(out, c, res ? v + ld(res, c) : v);
    }
  }
}

// SwiGLU in chunks of kSwigluChunk elements: each chunk's sigmoid(gate) through oneDNN's vectorised eltwise_logistic
// (libm's expf otherwise), then elementwise.h's formulas from it in plain loops that vectorise; bf16 inputs widened
// into float scratch and the results rounded once, so the bf16 kernels give the float32 kernels' results rounded.
// Each chunk reads all its inputs before it writes, so the outputs may alias gate or up.
constexpr size_t kSwigluChunk = 16384;

struct SwigluScratch {
  std::vector<float> gate, up, dy, sig;
  void reserve(size_t n, bool widen) {
    sig.resize(n);
    if (widen)
      for (auto* v : {&gate, &up, &dy}) v->resize(n);
  }
};

SwigluScratch& swiglu_scratch() {
  thread_local SwigluScratch s;
  return s;
}

// The chunk's inputs as float: the arrays themselves for float32, widened copies for bf16.
template <class T>
const float* as_float(const T* p, size_t k, std::vector<float>& widened) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    for (size_t i = 0; i < k; ++i) widened[i] = ld(p, static_cast<int64_t>(i));
    return widened.data();
  }
}

// sig = sigmoid(g) over k elements.
void sigmoid_chunk(const float* g, float* sig, size_t k) {
  if (onednn::sigmoid_forward(g, sig, k)) return;
  for (size_t i = 0; i < k; ++i) sig[i] = elementwise::sigmoid(g[i]);
}

// Runs fn(i0, k, g, u, sig, scratch) over n elements chunk by chunk: g and u the chunk's inputs as float,
// sig = sigmoid(g).
template <class T, class F>
void over_swiglu_chunks(const T* gate, const T* up, size_t n, F&& fn) {
  SwigluScratch& s = swiglu_scratch();
  s.reserve(std::min(n, kSwigluChunk), !std::is_same_v<T, float>);
  for (size_t i0 = 0; i0 < n; i0 += kSwigluChunk) {
    const size_t k = std::min(kSwigluChunk, n - i0);
    const float* g = as_float(gate + i0, k, s.gate);
    const float* u = as_float(up + i0, k, s.up);
    sigmoid_chunk(g, s.sig.data(), k);
    fn(i0, k, g, u, s.sig.data(), s);
  }
}

template <class T>
void swiglu_forward_n(const T* gate, const T* up, T* y, size_t n) {
  over_swiglu_chunks(gate, up, n, [y](size_t i0, size_t k, const float* g, const float* u, const float* sig,
                                      SwigluScratch&) {
    T* out = y + i0;
    for (size_t i = 0; i < k; ++i)
      st(out, static_cast<int64_t>(i), elementwise::swiglu_from_sigmoid(g[i], sig[i], u[i]));
  });
}

template <class T>
void swiglu_backward_n(const T* gate, const T* up, const T* dy, T* dgate, T* dup, size_t n) {
  over_swiglu_chunks(gate, up, n, [=](size_t i0, size_t k, const float* g, const float* u, const float* sig,
                                      SwigluScratch& s) {
    const float* d = as_float(dy + i0, k, s.dy);
    T* og = dgate + i0;
    T* ou = dup + i0;
    for (size_t i = 0; i < k; ++i) {
      float dg, du;
      elementwise::swiglu_grad_from_sigmoid(g[i], sig[i], u[i], d[i], dg, du);
      st(og, static_cast<int64_t>(i), dg);
      st(ou, static_cast<int64_t>(i), du);
    }
  });
}

template <class T>
void rope_rows(T* x, const float* cos, const float* sin, int64_t rows, int64_t T_, int64_t pos0, int64_t heads,
               int64_t head_dim, int64_t stride, bool inverse) {
  DPT_CHECK(head_dim % 2 == 0 && T_ > 0, "rope: head_dim {} (must be even), T {}", head_dim, T_);
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = pos0 + r % T_;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float a = ld(v, i), b = ld(v, i + half);
        elementwise::rope_pair(a, b, cos[p * half + i], inverse ? -sin[p * half + i] : sin[p * half + i]);
        st(v, i, a);
        st(v, i + half, b);
      }
    }
  }
}

}  // namespace

void CpuKernels::rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                                 float eps) {
  rmsnorm_forward_rows(x, gamma, y, rstd, rows, C, eps);
}

void CpuKernels::rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                                  float* dgamma, int64_t rows, int64_t C) {
  rmsnorm_backward_rows(dy, x, gamma, rstd, dx, dgamma, rows, C, static_cast<const float*>(nullptr));
}

void CpuKernels::swiglu_forward(const float* gate, const float* up, float* y, size_t n) {
  swiglu_forward_n(gate, up, y, n);
}

void CpuKernels::swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                                 size_t n) {
  swiglu_backward_n(gate, up, dy, dgate, dup, n);
}

void CpuKernels::rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                      int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  rope_rows(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse);
}

void CpuKernels::rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows,
                                      int64_t C, float eps) {
  rmsnorm_forward_rows(x, gamma, y, rstd, rows, C, eps);
}

void CpuKernels::rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                                       BFloat16* dx, float* dgamma, int64_t rows, int64_t C,
                                       const BFloat16* residual, bool accumulate) {
  if (!accumulate) std::fill_n(dgamma, C, 0.0f);  // overwritten: the sums from 0, as after zero_grad
  rmsnorm_backward_rows(dy, x, gamma, rstd, dx, dgamma, rows, C, residual);
}

void CpuKernels::swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) {
  swiglu_forward_n(gate, up, y, n);
}

void CpuKernels::swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate,
                                      BFloat16* dup, size_t n) {
  swiglu_backward_n(gate, up, dy, dgate, dup, n);
}

void CpuKernels::rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                           int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  rope_rows(x, cos, sin, rows, T, pos0, heads, head_dim, stride, inverse);
}

}  // namespace dpt::models
