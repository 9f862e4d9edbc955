// models/kernels/cpu/pool.cpp: max pooling (with its argmax) and global average pooling on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "models/kernels/elementwise.h"

namespace dpt::models {

namespace {

// Max pooling of one plane `in` [h, w] into y and argmax [p, q], a row of outputs at a time: for each window position
// (r, then s) every output of the row whose window holds that position inside the plane takes its value if
// elementwise::maxpool_takes says so. Each output sees maxpool_window's scan, in its order and with its rule (no
// value yet: -infinity, index -1), without its bounds checks per position, and the row's outputs are independent
// chains that the compiler vectorises. Window by window, each compare waited on the one before (ResNet's 3x3 stride
// 2 stem pool took 22 ms a step at batch 256, 32 px). K and T are the window's width and stride when known at
// compile time (0: ps.kernel, ps.stride; a constant stride lets the compiler vectorise the strided loads).
template <int K, int T>
void maxpool_plane(const float* __restrict in, float* __restrict y, int32_t* __restrict argmax, const PoolShape& ps) {
  const int64_t k = K > 0 ? K : ps.kernel, stride = T > 0 ? T : ps.stride;
  for (int64_t p = 0; p < ps.p; ++p) {
    const int64_t h0 = p * stride - ps.pad;
    const int64_t r0 = std::max<int64_t>(0, -h0), r1 = std::min<int64_t>(k, ps.h - h0);
    float* __restrict yr = y + p * ps.q;
    int32_t* __restrict ar = argmax + p * ps.q;
    for (int64_t q = 0; q < ps.q; ++q) yr[q] = -INFINITY, ar[q] = -1;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t s = 0; s < k; ++s) {
        // Outputs [qa, qb) read column q * stride - pad + s, inside [0, w).
        const int64_t lo = ps.pad - s, hi = ps.w - 1 + ps.pad - s;
        const int64_t qa = lo > 0 ? (lo + stride - 1) / stride : 0;
        const int64_t qb = hi < 0 ? 0 : std::min(ps.q, hi / stride + 1);
        const int64_t base = (h0 + r) * ps.w - ps.pad + s;
        for (int64_t q = qa; q < qb; ++q) {
          // elementwise::maxpool_takes written out as a mask and bit operations: calling it vectorised too but ran
          // 16 ms a step against 10.6 (ResNet-18's stem pool, batch 256, 32 px); unit_models checks both agree.
          const int64_t at = base + q * stride;
          const float v = in[at];
          const int take_i = static_cast<int>(ar[q] < 0) | static_cast<int>(v > yr[q]) | static_cast<int>(v != v);
          const uint32_t take = 0u - static_cast<uint32_t>(take_i);
          yr[q] = std::bit_cast<float>((std::bit_cast<uint32_t>(v) & take) | (std::bit_cast<uint32_t>(yr[q]) & ~take));
          ar[q] = static_cast<int32_t>((static_cast<uint32_t>(at) & take) | (static_cast<uint32_t>(ar[q]) & ~take));
        }
      }
  }
}

}  // namespace

// Plane by plane (maxpool_plane): the same values and indices as maxpool_window's scan output by output, which
// unit_models checks on random planes with ties and NaNs.
void CpuKernels::maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) {
  const int64_t out = ps.p * ps.q;
  for (int64_t plane = 0; plane < ps.n * ps.c; ++plane) {
    const float* in = x + plane * ps.h * ps.w;
    if (ps.kernel == 3 && ps.stride == 2)  // ResNet's stem
      maxpool_plane<3, 2>(in, y + plane * out, argmax + plane * out, ps);
    else if (ps.kernel == 2 && ps.stride == 2)
      maxpool_plane<2, 2>(in, y + plane * out, argmax + plane * out, ps);
    else
      maxpool_plane<0, 0>(in, y + plane * out, argmax + plane * out, ps);
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
