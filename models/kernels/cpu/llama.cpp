// models/kernels/cpu/llama.cpp: the Llama family's layers on the CPU (the reference the CUDA set is tested against):
// RMSNorm (row sums in double), SwiGLU and rotary embeddings, their per-element arithmetic elementwise.h's; one template
// each over float32 or bf16 activations (bf16 read widened, written rounded once).
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/cpu/activation_io.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "models/kernels/elementwise.h"

namespace dpt::models {

namespace {

using cpu_act::ld;
using cpu_act::st;

template <class T>
void rmsnorm_forward_rows(const T* x, const float* gamma, T* y, float* rstd, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(ld(in, c)) * ld(in, c);
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
    double sum = 0.0;  // sum of dy * gamma * xhat
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = ld(in, c) * s;
      sum += static_cast<double>(ld(g, c)) * gamma[c] * xhat;
      dgamma[c] += ld(g, c) * xhat;
    }
    const float mean = static_cast<float>(sum / static_cast<double>(C));
    T* out = dx + r * C;
    const T* res = residual ? residual + r * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const float v = s * (ld(g, c) * gamma[c] - ld(in, c) * s * mean);
      st(out, c, res ? v + ld(res, c) : v);
    }
  }
}

template <class T>
void swiglu_forward_n(const T* gate, const T* up, T* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto k = static_cast<int64_t>(i);
    st(y, k, elementwise::swiglu(ld(gate, k), ld(up, k)));
  }
}

template <class T>
void swiglu_backward_n(const T* gate, const T* up, const T* dy, T* dgate, T* dup, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto k = static_cast<int64_t>(i);
    float dg, du;
    elementwise::swiglu_grad(ld(gate, k), ld(up, k), ld(dy, k), dg, du);
    st(dgate, k, dg);
    st(dup, k, du);
  }
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
