// models/kernels/cpu/elementwise.cpp: the element-wise operations of the CPU set: bias + activation and the bias
// gradient, ReLU, the residual add, scaling, GELU (through oneDNN where it has a primitive).
#include "models/kernels/cpu/cpu_kernels.h"

#include "models/kernels/cpu/onednn_conv.h"
#include "models/kernels/elementwise.h"

namespace dpt::models {

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

void CpuKernels::scale(float* x, size_t n, float alpha) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

void CpuKernels::gelu_forward(const float* x, float* y, size_t n) {
  if (onednn::gelu_forward(x, y, n)) return;
  for (size_t i = 0; i < n; ++i) y[i] = elementwise::gelu(x[i]);
}

void CpuKernels::gelu_backward(const float* x, const float* dy, float* dx, size_t n) {
  if (onednn::gelu_backward(x, dy, dx, n)) return;
  for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * elementwise::gelu_grad(x[i]);
}

void CpuKernels::add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = to_bfloat16(to_float(a[i]) + to_float(b[i]));
}

void CpuKernels::gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = to_bfloat16(to_float(dy[i]) * elementwise::gelu_grad(to_float(pre[i])));
}

}  // namespace dpt::models
