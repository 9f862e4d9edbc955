// models/kernels/cuda/softmax.cpp: softmax cross-entropy and the causal softmax of attention on the GPU: checks and
// scratch, then the launchers of softmax.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

void CudaKernels::count_targets(const int32_t* labels, int64_t n, double* out) {
  DPT_CHECK(n >= 0, "count_targets of {} labels", n);
  DPT_CUDA_CHECK(cuda_launch::count_targets(labels, n, out, stream()));
}

void CudaKernels::softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                               double* stats) {
  DPT_CHECK(cols > 0, "softmax over {} classes", cols);
  // Scratch for the per-row results, grown when a larger batch comes; reused while the stream runs in order.
  if (rows_scratch_.numel() < static_cast<size_t>(2 * rows))
    rows_scratch_ = Tensor::empty({2 * rows}, DType::F32, device());
  float* row_loss = rows_scratch_.data<float>();
  DPT_CUDA_CHECK(cuda_launch::softmax_xent(logits, labels, dlogits, rows, cols, row_loss, row_loss + rows, stats,
                                           stream()));
}

void CudaKernels::classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                                  float dscale, double* stats) {
  DPT_CHECK(rows >= 0 && vocab >= 1 && ld >= vocab, "classifier of {} rows of {} (row stride {})", rows, vocab, ld);
  if (rows_scratch_.numel() < static_cast<size_t>(2 * rows))
    rows_scratch_ = Tensor::empty({2 * rows}, DType::F32, device());
  float* row_loss = rows_scratch_.data<float>();
  DPT_CUDA_CHECK(cuda_launch::classifier_bf16(logits, labels, rows, vocab, ld, dscale, row_loss, row_loss + rows,
                                              stats, stream()));
}

void CudaKernels::causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) {
  DPT_CHECK(rows >= 1 && rows <= cols, "causal softmax of {} x {} matrices: need 1 <= rows <= cols", rows, cols);
  DPT_CHECK(count >= 0, "causal softmax of {} matrices", count);
  check_row_shape(count * rows, cols, "causal softmax");
  DPT_CUDA_CHECK(cuda_launch::causal_softmax_forward(s, count, rows, cols, scale, stream()));
}

void CudaKernels::causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) {
  DPT_CHECK(count >= 0 && T >= 1, "causal softmax backward of {} matrices of {} x {}", count, T, T);
  check_row_shape(count * T, T, "causal softmax backward");
  DPT_CUDA_CHECK(cuda_launch::causal_softmax_backward(p, dp, count, T, scale, stream()));
}

}  // namespace dpt::models
