// models/kernels/cuda/batchnorm.cpp: batch normalisation on the GPU: shape checks and the per-shape scratch, then
// the launchers of batchnorm.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include <limits>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

namespace {

void check_bn_shape(const BnShape& bs) {
  DPT_CHECK(bs.n >= 0 && bs.c >= 0 && bs.hw >= 1, "batch norm shape n {} c {} hw {}", bs.n, bs.c, bs.hw);
  DPT_CHECK(bs.c <= std::numeric_limits<int>::max(), "batch norm over {} channels: more than a grid holds", bs.c);
}

}  // namespace

void CudaKernels::bn_stats(const float* x, const BnShape& bs, double* sums) {
  check_bn_shape(bs);
  DPT_CUDA_CHECK(cuda_launch::bn_stats(x, bs, bn_partials(bs), sums, stream()));
}

// A count of 0 in `sums` (an empty batch on every rank) gives NaN statistics here; the CPU set throws.
void CudaKernels::bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                   const BnShape& bs, float eps, float momentum, float* running_mean,
                                   float* running_var, float* save_mean, float* save_invstd, float* y) {
  check_bn_shape(bs);
  DPT_CUDA_CHECK(cuda_launch::bn_forward_train(x, gamma, beta, sums, bs, eps, momentum, running_mean, running_var,
                                               save_mean, save_invstd, y, bn_coef(bs), stream()));
}

void CudaKernels::bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                                  const float* running_var, const BnShape& bs, float eps, float* y) {
  check_bn_shape(bs);
  DPT_CUDA_CHECK(cuda_launch::bn_forward_eval(x, gamma, beta, running_mean, running_var, bs, eps, y, bn_coef(bs),
                                              stream()));
}

void CudaKernels::bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                                     const BnShape& bs, double* sums, float* dgamma, float* dbeta) {
  check_bn_shape(bs);
  DPT_CUDA_CHECK(cuda_launch::bn_backward_reduce(dy, x, save_mean, save_invstd, bs, bn_partials(bs), sums, dgamma,
                                                 dbeta, stream()));
}

void CudaKernels::bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                   const float* save_invstd, const double* sums, const BnShape& bs, float* dx) {
  check_bn_shape(bs);
  DPT_CUDA_CHECK(cuda_launch::bn_backward_data(dy, x, gamma, save_mean, save_invstd, sums, bs, dx, bn_coef(bs),
                                               stream()));
}

// Scratch grown on demand and reused (the stream runs in order). Growing frees the old buffer with cudaFree,
// which waits for the device: only ever at a new, larger shape.
double* CudaKernels::bn_partials(const BnShape& bs) {
  const size_t count = cuda_launch::bn_partials_count(bs);
  if (bn_partials_.numel() < count) bn_partials_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F64, device());
  return bn_partials_.data<double>();
}

float* CudaKernels::bn_coef(const BnShape& bs) {
  const size_t count = cuda_launch::bn_coef_count(bs);
  if (bn_coef_.numel() < count) bn_coef_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F32, device());
  return bn_coef_.data<float>();
}

}  // namespace dpt::models
