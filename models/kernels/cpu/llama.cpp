// models/kernels/cpu/llama.cpp: the Llama family's layers on the CPU (the reference the CUDA set is tested against):
// RMSNorm (row sums in double), SwiGLU and rotary embeddings, their per-element arithmetic elementwise.h's.
#include "models/kernels/cpu/cpu_kernels.h"

#include <cmath>

#include "core/check.h"
#include "models/kernels/elementwise.h"

namespace dpt::models {

void CpuKernels::rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                                 float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(in[c]) * in[c];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    float* out = y + r * C;
    for (int64_t c = 0; c < C; ++c) out[c] = in[c] * s * gamma[c];
    rstd[r] = s;
  }
}

void CpuKernels::rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                                  float* dgamma, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = dy + r * C;
    const float* in = x + r * C;
    const float s = rstd[r];
    double sum = 0.0;  // sum of dy * gamma * xhat
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = in[c] * s;
      sum += static_cast<double>(g[c]) * gamma[c] * xhat;
      dgamma[c] += g[c] * xhat;
    }
    const float mean = static_cast<float>(sum / static_cast<double>(C));
    float* out = dx + r * C;
    for (int64_t c = 0; c < C; ++c) out[c] = s * (g[c] * gamma[c] - in[c] * s * mean);
  }
}

void CpuKernels::swiglu_forward(const float* gate, const float* up, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = elementwise::swiglu(gate[i], up[i]);
}

void CpuKernels::swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                                 size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float dg, du;
    elementwise::swiglu_grad(gate[i], up[i], dy[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}

void CpuKernels::rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                      int64_t heads, int64_t head_dim, int64_t stride, bool inverse) {
  DPT_CHECK(head_dim % 2 == 0 && T > 0, "rope: head_dim {} (must be even), T {}", head_dim, T);
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = pos0 + r % T;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i)
        elementwise::rope_pair(v[i], v[i + half], cos[p * half + i], inverse ? -sin[p * half + i] : sin[p * half + i]);
    }
  }
}

}  // namespace dpt::models
