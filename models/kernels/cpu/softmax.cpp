// models/kernels/cpu/softmax.cpp: softmax cross-entropy (the classification loss and its gradient) and the causal
// softmax of attention, forward and backward, on the CPU.
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "models/kernels/cpu/onednn_conv.h"
#include "models/kernels/cpu/row_sums.h"
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
  // A block of rows at a time (about 16K elements, in cache): each row's logits less their maximum into e (the
  // gradient's rows, or scratch), one oneDNN exp over the block (vectorised, where libm's scalar exp was called per
  // logit), then each row's sum in double (row_sums.h), its loss and its gradient e / sum - onehot.
  thread_local std::vector<float> scratch, zmax;
  const int64_t block = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t r1 = std::min(rows, r0 + block);
    float* e = dlogits ? dlogits + r0 * cols : nullptr;
    if (!e) {
      scratch.resize(static_cast<size_t>((r1 - r0) * cols));
      e = scratch.data();
    }
    zmax.resize(static_cast<size_t>(r1 - r0));
    for (int64_t r = r0; r < r1; ++r) {
      const float* z = logits + r * cols;
      float* er = e + (r - r0) * cols;
      const int32_t label = labels[r];
      if (label == kIgnoreLabel) {  // no loss, no hit, no gradient
        std::fill_n(er, cols, 0.0f);
        continue;
      }
      DPT_CHECK(label >= 0 && label < cols, "label {} outside [0, {})", label, cols);
      int64_t argmax = 0;
      float mx = z[0];
      for (int64_t c = 1; c < cols; ++c) {
        if (z[c] > mx) {
          mx = z[c];
          argmax = c;
        }
      }
      hits += argmax == label;
      zmax[static_cast<size_t>(r - r0)] = mx;
      for (int64_t c = 0; c < cols; ++c) er[c] = z[c] - mx;
    }
    const auto n = static_cast<size_t>((r1 - r0) * cols);
    if (!onednn::exp_forward(e, e, n))
      for (size_t i = 0; i < n; ++i) e[i] = std::exp(e[i]);
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t label = labels[r];
      float* er = e + (r - r0) * cols;
      if (label == kIgnoreLabel) {
        if (dlogits) std::fill_n(er, cols, 0.0f);
        continue;
      }
      const double sum = cpu_sums::sum8(cols, [er](int64_t c) { return static_cast<double>(er[c]); });
      loss += std::log(sum) - static_cast<double>(logits[r * cols + label] - zmax[static_cast<size_t>(r - r0)]);
      if (!dlogits) continue;
      const double inv = 1.0 / sum;
      const double p_label = er[label] * inv;
      for (int64_t c = 0; c < cols; ++c) er[c] = static_cast<float>(er[c] * inv) * inv_rows;
      er[label] = static_cast<float>(p_label - 1.0) * inv_rows;
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
  // A block of whole rows at a time (about 16K elements, in cache): each row's scaled logits less their maximum,
  // then one oneDNN exp over the block (vectorised; libm's scalar expf was a tenth of the attention), then each
  // row's sum (in double) and scaling. Masked columns are zeroed after the exp, whatever it gave them.
  const int64_t total = count * rows;
  const int64_t block = std::max<int64_t>(1, 16384 / cols);
  for (int64_t r0 = 0; r0 < total; r0 += block) {
    const int64_t r1 = std::min(total, r0 + block);
    for (int64_t r = r0; r < r1; ++r) {
      float* row = s + r * cols;
      const int64_t last = r % rows + cols - rows;  // the last column row r sees
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, scale * row[j]);
      for (int64_t j = 0; j <= last; ++j) row[j] = scale * row[j] - mx;
      for (int64_t j = last + 1; j < cols; ++j) row[j] = 0.0f;
    }
    float* x = s + r0 * cols;
    const auto n = static_cast<size_t>((r1 - r0) * cols);
    if (!onednn::exp_forward(x, x, n))
      for (size_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
    for (int64_t r = r0; r < r1; ++r) {
      float* row = s + r * cols;
      const int64_t last = r % rows + cols - rows;
      const double sum = cpu_sums::sum8(last + 1, [row](int64_t j) { return static_cast<double>(row[j]); });
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= last; ++j) row[j] *= inv;
      for (int64_t j = last + 1; j < cols; ++j) row[j] = 0.0f;
    }
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
