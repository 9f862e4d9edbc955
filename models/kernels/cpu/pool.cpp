// models/kernels/cpu/pool.cpp: max pooling (with its argmax) and global average pooling on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>

#include "models/kernels/elementwise.h"

namespace dpt::models {

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

}  // namespace dpt::models
