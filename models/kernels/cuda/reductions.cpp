// models/kernels/cuda/reductions.cpp: the sum of squares (to the host, or to the device without a sync) and
// global-norm clipping on the GPU (kernels: reductions.cu).
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

double CudaKernels::sum_squares(const float* x, size_t n) {
  double* partials = partials_.data<double>();
  double* out = partials + cuda_launch::kSumSquaresBlocks;
  DPT_CUDA_CHECK(cuda_launch::sum_squares(x, n, partials, out, stream()));
  double host = 0;
  DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  stream_->synchronize();
  return host;
}

void CudaKernels::sum_squares_to(const float* x, size_t n, double* out) {
  DPT_CUDA_CHECK(cuda_launch::sum_squares(x, n, partials_.data<double>(), out, stream()));
}

void CudaKernels::clip_by_norm(float* x, size_t n, const double* ss, double max_norm) {
  DPT_CUDA_CHECK(cuda_launch::clip_by_norm(x, n, ss, max_norm, stream()));
}

}  // namespace dpt::models
