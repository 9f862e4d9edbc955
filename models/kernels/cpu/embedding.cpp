// models/kernels/cpu/embedding.cpp: GPT's token and position embedding, forward and backward, and the split of
// token windows into input and next tokens, on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/elementwise.h"

#include <algorithm>



namespace dpt::models {

void CpuKernels::embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                                   int64_t T, int64_t C, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t tok = tokens[r];
    if (tok < 0 || tok >= vocab)
      DPT_THROW(ConfigError, "token {} at position {} is outside the vocabulary [0, {})", tok, r, vocab);
    const float* e = wte + static_cast<int64_t>(tok) * C;
    float* o = y + r * C;
    if (!wpe) {
      std::copy_n(e, C, o);
      continue;
    }
    const float* p = wpe + (r % T) * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void CpuKernels::split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < T; ++i) {
      input[r * T + i] = elementwise::window_token(windows[r * (T + 1) + i]);
      next[r * T + i] = elementwise::window_target(windows[r * (T + 1) + i + 1]);
    }
}

void CpuKernels::embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                                    int64_t T, int64_t C, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    if (tokens[r] < 0 || tokens[r] >= vocab)
      DPT_THROW(InternalError, "embedding backward: token {} at row {} outside the vocabulary of {}", tokens[r], r, vocab);
    const float* g = dy + r * C;
    float* e = dwte + static_cast<int64_t>(tokens[r]) * C;
    if (!dwpe) {
      for (int64_t c = 0; c < C; ++c) e[c] += g[c];
      continue;
    }
    float* p = dwpe + (r % T) * C;
    for (int64_t c = 0; c < C; ++c) {
      e[c] += g[c];
      p[c] += g[c];
    }
  }
}

}  // namespace dpt::models
