// models/kernels/cuda/launch.h: the launchers of the CUDA kernels in kernels.cu. Each takes an explicit
// stream, launches, and returns cudaGetLastError() for the caller (cuda_kernels.cpp) to check: the .cu side
// stays free of the project's C++ headers (fmt, spdlog), which nvcc need not parse.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "models/kernels/elementwise.h"

namespace dpt::models::cuda_launch {

cudaError_t bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu,
                     cudaStream_t s);
cudaError_t bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t relu_backward(const float* y, const float* dy, float* dx, size_t n, cudaStream_t s);
// Per-row loss and hit into row_loss/row_hit (scratch of `rows` floats each), dlogits when non-null; then a
// fixed-order reduction adds the batch's sums into stats[0..1] (deterministic: no atomics).
cudaError_t softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                         float* row_loss, float* row_hit, double* stats, cudaStream_t s);
cudaError_t sgd_update(float* param, const float* grad, float* buf, size_t n, SgdParams p, cudaStream_t s);
cudaError_t adamw_update(float* param, const float* grad, float* m, float* v, size_t n, elementwise::AdamWStep st,
                         cudaStream_t s);
cudaError_t scale(float* x, size_t n, float alpha, cudaStream_t s);
// Sum of squares: per-block partial sums (partials: kSumSquaresBlocks doubles), then one block adds them in
// a fixed order into *out.
inline constexpr int kSumSquaresBlocks = 256;
cudaError_t sum_squares(const float* x, size_t n, double* partials, double* out, cudaStream_t s);

}  // namespace dpt::models::cuda_launch
