// models/kernels/cpu/softmax.cpp: softmax cross-entropy (the classification loss and its gradient) and the causal
// softmax of attention, forward and backward, on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "models/kernels/elementwise.h"

namespace dpt::models {

void CpuKernels::count_targets(const int32_t* labels, int64_t n, double* out) {
  DPT_CHECK(n >= 0, "count_targets of {} labels", n);
  out[0] += static_cast<double>(std::count_if(labels, labels + n, [](int32_t l) { return l != kIgnoreLabel; }));
}

void CpuKernels::softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                              double* stats) {
  double loss = 0.0;
  int64_t hits = 0;
  const float inv_rows = rows > 0 ? 1.0f / static_cast<float>(rows) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    const int32_t label = labels[r];
    if (label == kIgnoreLabel) {  // no loss, no hit, no gradient
      if (dlogits) std::fill_n(dlogits + r * cols, cols, 0.0f);
      continue;
    }
    DPT_CHECK(label >= 0 && label < cols, "label {} outside [0, {})", label, cols);
    int64_t argmax = 0;
    float zmax = z[0];
    for (int64_t c = 1; c < cols; ++c) {
      if (z[c] > zmax) {
        zmax = z[c];
        argmax = c;
      }
    }
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    loss += log_sum - static_cast<double>(z[label] - zmax);
    hits += argmax == label;
    if (dlogits) {
      float* d = dlogits + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - zmax) - log_sum);
        d[c] = static_cast<float>(p - (c == label ? 1.0 : 0.0)) * inv_rows;
      }
    }
  }
  stats[0] += loss;
  stats[1] += static_cast<double>(hits);
}

void CpuKernels::classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                                 float dscale, double* stats) {
  DPT_CHECK(rows >= 0 && vocab >= 1 && ld >= vocab, "classifier of {} rows of {} (row stride {})", rows, vocab, ld);
  std::vector<float> z(static_cast<size_t>(vocab));
  double loss = 0.0;
  int64_t hits = 0;
  for (int64_t r = 0; r < rows; ++r) {
    BFloat16* row = logits + r * ld;
    const int32_t label = labels[r];
    if (label == kIgnoreLabel) {  // no loss, no hit, a zero gradient
      if (dscale != 0.0f) std::fill_n(row, ld, BFloat16{0});
      continue;
    }
    DPT_CHECK(label >= 0 && label < vocab, "label {} outside [0, {})", label, vocab);
    int64_t argmax = 0;
    for (int64_t c = 0; c < vocab; ++c) {
      z[c] = to_float(row[c]);
      if (z[c] > z[argmax]) argmax = c;  // the first maximum, as the GPU's
    }
    const float zmax = z[argmax];
    // The sum in double: a float running sum over a large vocabulary drops the terms below half its last place
    // (128250 columns: the loss 1.35e-5 low relatively), where the GPU's tree of float sums does not.
    double sum = 0.0;
    for (int64_t c = 0; c < vocab; ++c) sum += static_cast<double>(std::exp(z[c] - zmax));
    const float log_sum = static_cast<float>(std::log(sum));
    loss += std::log(sum) - static_cast<double>(z[label] - zmax);
    hits += argmax == label;
    if (dscale == 0.0f) continue;
    for (int64_t c = 0; c < vocab; ++c)
      row[c] = to_bfloat16(elementwise::xent_grad(z[c], zmax, log_sum, c == label, dscale));
    for (int64_t c = vocab; c < ld; ++c) row[c] = BFloat16{0};
  }
  stats[0] += loss;
  stats[1] += static_cast<double>(hits);
}

void CpuKernels::causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) {
  DPT_CHECK(rows >= 1 && rows <= cols, "causal softmax of {} x {} matrices: need 1 <= rows <= cols", rows, cols);
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      float* row = s + (m * rows + i) * cols;
      const int64_t last = i + cols - rows;  // the last column row i sees
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, scale * row[j]);
      double sum = 0.0;
      for (int64_t j = 0; j <= last; ++j) {
        row[j] = std::exp(scale * row[j] - mx);
        sum += row[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
      for (int64_t j = last + 1; j < cols; ++j) row[j] = 0.0f;
    }
}

void CpuKernels::causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) {
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < T; ++i) {
      const float* pr = p + (m * T + i) * T;
      float* dr = dp + (m * T + i) * T;
      double dot = 0.0;
      for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * dr[j];
      const float d = static_cast<float>(dot);
      for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - d);
      for (int64_t j = i + 1; j < T; ++j) dr[j] = 0.0f;
    }
}

}  // namespace dpt::models
