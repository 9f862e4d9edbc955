// models/kernels/cuda/embedding.cpp: GPT's embedding and token windows on the GPU: checks and the sort's scratch,
// then the launchers of embedding.cu.
#include "models/kernels/cuda/cuda_kernels.h"

#include <limits>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

// A token outside [0, vocab) cannot throw here (the tokens are on the device): its row of y becomes NaN.
void CudaKernels::embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                                    int64_t T, int64_t C, int64_t vocab) {
  DPT_CHECK(rows >= 0 && T >= 1 && C >= 0 && vocab >= 0, "embedding of {} rows, T {}, C {}, vocab {}", rows, T, C,
            vocab);
  DPT_CUDA_CHECK(cuda_launch::embedding_forward(tokens, wte, wpe, y, rows, T, C, vocab, stream()));
}

// Deterministic (no atomics) and bit for bit the CPU set's sums. A token outside [0, vocab) adds nothing to
// dwte (forward has already made its loss NaN).
void CudaKernels::embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                                     int64_t T, int64_t C, int64_t vocab) {
  DPT_CHECK(rows >= 0 && T >= 1 && C >= 0, "embedding backward of {} rows, T {}, C {}", rows, T, C);
  DPT_CHECK(rows <= std::numeric_limits<int>::max(), "embedding backward over {} rows: the sort counts in int", rows);
  if (rows == 0 || C == 0) return;
  size_t bytes = 0;
  DPT_CUDA_CHECK(cuda_launch::embedding_backward_scratch_bytes(rows, bytes));
  if (emb_scratch_.bytes() < bytes) emb_scratch_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
  DPT_CUDA_CHECK(cuda_launch::embedding_backward(tokens, dy, dwte, dwpe, rows, T, C, vocab, emb_scratch_.raw(),
                                                 emb_scratch_.bytes(), stream()));
}

void CudaKernels::split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) {
  DPT_CHECK(n >= 0 && T >= 1, "token windows: {} of {} + 1", n, T);
  DPT_CUDA_CHECK(cuda_launch::split_token_windows(windows, input, next, n, T, stream()));
}

}  // namespace dpt::models
