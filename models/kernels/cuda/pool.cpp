// models/kernels/cuda/pool.cpp: max and average pooling on the GPU: shape checks, then the launchers of pool.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include <limits>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

namespace {

void check_pool_shape(const PoolShape& ps) {
  PoolShape expect = ps;
  DPT_CHECK(ps.n >= 0 && ps.c >= 0 && ps.kernel > 0 && ps.stride > 0 && ps.pad >= 0 && pool_output_size(expect) &&
                expect.p == ps.p && expect.q == ps.q,
            "pool shape n {} c {} h {} w {} kernel {} stride {} pad {} -> {}x{}", ps.n, ps.c, ps.h, ps.w, ps.kernel,
            ps.stride, ps.pad, ps.p, ps.q);
  DPT_CHECK(ps.h * ps.w <= std::numeric_limits<int32_t>::max(), "max pooling over {}x{}: the argmax is an int32",
            ps.h, ps.w);
}

}  // namespace

void CudaKernels::maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) {
  check_pool_shape(ps);
  DPT_CUDA_CHECK(cuda_launch::maxpool2d_forward(x, y, argmax, ps, stream()));
}

void CudaKernels::maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) {
  check_pool_shape(ps);
  DPT_CUDA_CHECK(cuda_launch::maxpool2d_backward(dy, argmax, dx, ps, stream()));
}

void CudaKernels::avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) {
  DPT_CHECK(rows >= 0 && hw >= 1, "average pooling of {} rows of {}", rows, hw);
  DPT_CUDA_CHECK(cuda_launch::avgpool_forward(x, y, rows, hw, stream()));
}

void CudaKernels::avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) {
  DPT_CHECK(rows >= 0 && hw >= 1, "average pooling of {} rows of {}", rows, hw);
  DPT_CUDA_CHECK(cuda_launch::avgpool_backward(dy, dx, rows, hw, stream()));
}

}  // namespace dpt::models
