// models/kernels/elementwise.h: the per-element arithmetic of the optimizer updates, written once and
// compiled into both kernel sets: the CPU loops (g++) and the CUDA kernels (nvcc, as __host__ __device__).
// So the two sets differ only in how they walk the elements, and the CPU tests check this arithmetic.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "models/kernels/kernel_params.h"

#if defined(__CUDACC__)
#define DPT_HD __host__ __device__ __forceinline__
#else
#define DPT_HD inline
#endif

namespace dpt::models::elementwise {

// PyTorch's SGD: g += wd * p; buf = momentum * buf + g (buf = g on the first step);
// p -= lr * (nesterov ? g + momentum * buf : buf). `buf` is untouched without momentum.
DPT_HD void sgd(float& param, float grad, float* buf, const SgdParams& p) {
  float g = grad + p.weight_decay * param;
  if (p.momentum != 0.0f) {
    const float b = p.first_step ? g : p.momentum * *buf + g;
    *buf = b;
    g = p.nesterov ? g + p.momentum * b : b;
  }
  param -= p.lr * g;
}

// The per-step constants of AdamW's update (bias corrections), computed once on the host.
struct AdamWStep {
  float beta1, beta2, eps;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // 1 - lr * weight_decay (decoupled weight decay)
};

inline AdamWStep adamw_step(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  return {p.beta1, p.beta2, p.eps, static_cast<float>(p.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
          1.0f - p.lr * p.weight_decay};
}

// The fused AdamW's two sets of constants: with p's weight decay, and without (the elements outside its ranges).
struct AdamWSteps {
  AdamWStep with_decay, without_decay;
};
inline AdamWSteps adamw_steps(const AdamWParams& p) {
  AdamWParams no_decay = p;
  no_decay.weight_decay = 0.0f;
  return {adamw_step(p), adamw_step(no_decay)};
}

DPT_HD void adamw(float& param, float g, float& m, float& v, const AdamWStep& s) {
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
  param = param * s.decay - s.step_size * m / denom;
}

DPT_HD float bias_act(float x, float bias, bool relu) {
  const float y = x + bias;
  return relu ? (y > 0.0f ? y : 0.0f) : y;
}

DPT_HD float relu_backward(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// ---- batch normalisation: the per-channel and per-element formulas of both kernel sets -----------------------

struct BnMoments {
  float mean, invstd, unbiased_var;
};

// From a channel's sum and sum of squares over `count` values (count >= 1): mean, 1/sqrt(biased var + eps) and
// the unbiased variance that the running statistics follow (PyTorch's rule; count 1 leaves it the biased one).
DPT_HD BnMoments bn_moments(double sum, double sumsq, double count, float eps) {
  const double mean = sum / count;
  double var = sumsq / count - mean * mean;
  if (var < 0.0) var = 0.0;  // rounding of E[x^2] - E[x]^2
  BnMoments m;
  m.mean = static_cast<float>(mean);
  m.invstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  m.unbiased_var = static_cast<float>(count > 1.0 ? var * count / (count - 1.0) : var);
  return m;
}

DPT_HD float lerp_running(float running, float batch, float momentum) {
  return (1.0f - momentum) * running + momentum * batch;
}

// dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), xhat = (x - mean) * invstd, folded into
// dx = dy * a + x * b + c per channel.
struct BnBackward {
  float a, b, c;
};

DPT_HD BnBackward bn_backward_coefficients(float gamma, float mean, float invstd, double sum_dy, double sum_dy_xhat,
                                           double count) {
  const double g = static_cast<double>(gamma) * invstd;
  const double mean_dy = sum_dy / count, mean_dy_xhat = sum_dy_xhat / count;
  BnBackward k;
  k.a = static_cast<float>(g);
  k.b = static_cast<float>(-g * mean_dy_xhat * invstd);
  k.c = static_cast<float>(-g * mean_dy + g * mean_dy_xhat * invstd * mean);
  return k;
}

DPT_HD float bn_backward(float dy, float x, const BnBackward& k) { return dy * k.a + x * k.b + k.c; }

// ---- relu and max pooling: the rules both kernel sets follow ------------------------------------------------

DPT_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }

// Whether value v, met while scanning a pooling window r then s, becomes the window's maximum, given the best
// so far and its index (`at` < 0: none yet): the first maximum wins (strict >), a NaN replaces it (PyTorch's
// rule: NaN propagates); padding is never offered.
DPT_HD bool maxpool_takes(float v, float best, int32_t at) { return at < 0 || v > best || v != v; }

// Max pooling's output (p, q) of one plane `in` [h, w]: the maximum over the window, scanned r then s, and its
// h * w index in `at` (-1 when the window holds no input position).
DPT_HD float maxpool_window(const float* in, const PoolShape& ps, int64_t p, int64_t q, int32_t& at) {
  float best = -INFINITY;
  at = -1;
  for (int64_t r = 0; r < ps.kernel; ++r) {
    const int64_t h = p * ps.stride - ps.pad + r;
    if (h < 0 || h >= ps.h) continue;
    for (int64_t s = 0; s < ps.kernel; ++s) {
      const int64_t w = q * ps.stride - ps.pad + s;
      if (w < 0 || w >= ps.w) continue;
      const float v = in[h * ps.w + w];
      if (maxpool_takes(v, best, at)) {
        best = v;
        at = static_cast<int32_t>(h * ps.w + w);
      }
    }
  }
  return best;
}

// GELU, tanh approximation (GPT-2; nn.GELU(approximate="tanh")): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// and its derivative.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
DPT_HD float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
DPT_HD float gelu_grad(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// ---- the Llama family (issue 35) ---------------------------------------------------------------------------------
// SiLU (nn.SiLU, x sigmoid(x)) and SwiGLU's product silu(gate) * up, with the gradients of both inputs.
DPT_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
DPT_HD float silu(float x) { return x * sigmoid(x); }
// The _from_sigmoid forms take s = sigmoid(gate) computed elsewhere (the CPU set's, vectorised by oneDNN).
DPT_HD float swiglu_from_sigmoid(float gate, float s, float up) { return gate * s * up; }
DPT_HD float swiglu(float gate, float up) { return swiglu_from_sigmoid(gate, sigmoid(gate), up); }
DPT_HD void swiglu_grad_from_sigmoid(float gate, float s, float up, float dy, float& dgate, float& dup) {
  dgate = dy * up * s * (1.0f + gate * (1.0f - s));
  dup = dy * gate * s;
}
DPT_HD void swiglu_grad(float gate, float up, float dy, float& dgate, float& dup) {
  swiglu_grad_from_sigmoid(gate, sigmoid(gate), up, dy, dgate, dup);
}
// One rotary pair (HF's rotate_half: x[i] and x[i + head_dim / 2]) turned by the angle whose cosine and sine are c
// and s (s negated: the inverse, backward's rotation).
DPT_HD void rope_pair(float& x1, float& x2, float c, float s) {
  const float a = x1, b = x2;
  x1 = a * c - b * s;
  x2 = b * c + a * s;
}

// Global-norm clipping's factor, as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), applied when below 1.
DPT_HD double clip_coefficient(double sum_squares, double max_norm) { return max_norm / (sqrt(sum_squares) + 1e-6); }

// ---- the transformer fast path ---------------------------------------------------------------------------------

// The fused AdamW's weight decay: whether element i lies in one of the ranges [edges[2j], edges[2j + 1]) (sorted,
// n_edges even): an odd number of edges at or below i. decay_edge_after: the index of the first edge above i, by a
// binary search (log2(n_edges) loads); in_decay_range: its parity; decay_flags4: elements i0 .. i0 + 3 (the CUDA
// kernel's four at a time) with one search where no edge falls among them.
DPT_HD size_t decay_edge_after(const uint64_t* edges, size_t n_edges, uint64_t i) {
  size_t lo = 0, hi = n_edges;  // the first edge above i is in [lo, hi]
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (edges[mid] <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
DPT_HD bool in_decay_range(const uint64_t* edges, size_t n_edges, uint64_t i) {
  return (decay_edge_after(edges, n_edges, i) & 1u) != 0;
}
DPT_HD void decay_flags4(const uint64_t* edges, size_t n_edges, uint64_t i0, bool* decay) {
  const size_t after = decay_edge_after(edges, n_edges, i0);
  const bool uniform = after == n_edges || edges[after] > i0 + 3;
  for (int e = 0; e < 4; ++e) decay[e] = uniform ? (after & 1u) != 0 : in_decay_range(edges, n_edges, i0 + e);
}

// The fused AdamW's gradient factor from the gradients' sum of squares: clip_by_norm's float factor when it is
// below 1, else 1 (the gradient untouched: g * 1.0f is g).
DPT_HD float clip_factor(const double* sum_squares, double max_norm) {
  if (sum_squares == nullptr) return 1.0f;
  const double coef = clip_coefficient(*sum_squares, max_norm);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

// A token window's element v: token t as t, or, where the loss must not train on predicting it (a prompt's token
// in fine-tuning data), as -(t + 1). As the model's input it is t either way; as a target, t or kIgnoreLabel.
DPT_HD int32_t window_token(float v) { return v < 0.0f ? static_cast<int32_t>(-v) - 1 : static_cast<int32_t>(v); }
DPT_HD int32_t window_target(float v) { return v < 0.0f ? kIgnoreLabel : static_cast<int32_t>(v); }
DPT_HD float masked_window_token(int32_t t) { return -static_cast<float>(t) - 1.0f; }

// The classifier's gradient for one logit z of a row with maximum zmax and log_sum = log(sum exp(z - zmax)):
// dscale * (softmax(z) - [z's column is the label]).
DPT_HD float xent_grad(float z, float zmax, float log_sum, bool is_label, float dscale) {
  return dscale * (expf(z - zmax - log_sum) - (is_label ? 1.0f : 0.0f));
}

// The fused classifier's pass 1 for one thread of its one-column-at-a-time kernel, and the state every thread's and
// warp's pass 1 is merged as (also the vector kernel's, OnlineSoftmax8, below): a running maximum m, the sum of
// exp(x - m) over the columns seen, and the first column holding the maximum. Columns are pushed in increasing
// order, so a strict > keeps the first. A -inf column adds exactly 0 (also before any finite one: exp(-inf - -inf)
// would be NaN); a NaN column makes the sum NaN. Trivial (no initialisers), so CUDA can keep an array of them in
// shared memory; online_softmax_start makes an empty one.
struct OnlineSoftmax {
  float m, sum;
  int64_t arg;

  DPT_HD void push(float x, int64_t c) {
    if (x > m) {
      // expf(-inf) = 0 for the first column; expf(x - x) is 1, and NaN for x = +inf, as the CPU gives it.
      sum = sum * expf(m - x) + expf(x - x);
      m = x;
      arg = c;
    } else if (x != -INFINITY) {
      sum += expf(x - m);
    }
  }
  // Another thread's columns merged in; on equal maxima the lower column wins. A side with no column above -inf
  // keeps its sum as it is: 0, or NaN from a NaN column, which must reach the loss (expf(-inf - -inf) would be NaN
  // for a sum of 0, and 0 in place of the sum would drop a NaN).
  DPT_HD void merge(const OnlineSoftmax& o) {
    const float mx = fmaxf(m, o.m);
    const float s1 = m == -INFINITY ? sum : sum * expf(m - mx);
    const float s2 = o.m == -INFINITY ? o.sum : o.sum * expf(o.m - mx);
    if (o.m > m || (o.m == m && o.arg < arg)) arg = o.arg;
    m = mx;
    sum = s1 + s2;
  }
};

// An OnlineSoftmax before any column; `none` is the argmax it reports (the vocabulary size: no column).
DPT_HD OnlineSoftmax online_softmax_start(int64_t none) { return {-INFINITY, 0.0f, none}; }

// 2^t: on a GPU the special-function unit's ex2.approx.ftz (relative error about 2^-22; results below 2^-126
// flushed to 0; 2^-inf = 0, NaN stays NaN), one instruction where expf takes about eight; std::exp2 on the CPU,
// where it serves the CPU mirror of the fused classifier's walk in unit.models.
inline constexpr float kLog2e = 1.44269504088896340736f;
DPT_HD float exp2_fast(float t) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
#else
  return std::exp2(t);
#endif
}

// The vector classifier's pass 1 for one thread (cuda/softmax.cu; its warps' states then merged as OnlineSoftmax):
// a running maximum m, the sum of exp(x - m) = 2^((x - m) kLog2e) over the columns seen and the first column holding
// the maximum, fed vectors of eight columns x[0..7] from column c0 (the row's last vector with its padding columns
// set to -inf: never a maximum, and 2^-inf adds exactly 0). The thread visits its vectors from the row's end down,
// so on a tie with its maximum so far the vector's (lower) column wins. The vector's maximum by fmaxf (which passes
// over NaN, as a strict > does); its first column looked for only when it reaches the running maximum, which after
// a row's first vectors is rare. A -inf column adds 0, a NaN column makes the sum NaN (also while m is still -inf),
// a +inf column too (2^(inf - inf)), as OnlineSoftmax::push.
struct OnlineSoftmax8 {
  float m = -INFINITY, sum = 0.0f;
  int arg;  // the vocabulary size until a column is seen

  DPT_HD void push(const float (&x)[8], int c0) {
    const float cm = fmaxf(fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3])), fmaxf(fmaxf(x[4], x[5]), fmaxf(x[6], x[7])));
    if (cm >= m && cm > -INFINITY) {  // false for NaN (all eight NaN) and for a vector of -inf
      int ci = 7;
      for (int i = 6; i >= 0; --i)
        if (x[i] == cm) ci = i;  // the first column holding it
      if (cm > m) {
        sum *= exp2_fast((m - cm) * kLog2e);  // 0 when m was -inf: 0 stays 0, a NaN stays NaN
        m = cm;
      }
      arg = c0 + ci;
    }
    if (m == -INFINITY) {  // no column above -inf yet: this vector's are -inf (adding 0) or NaN
      for (int i = 0; i < 8; ++i)
        if (x[i] != x[i]) sum = x[i];
      return;
    }
    float e[8];
    for (int i = 0; i < 8; ++i) e[i] = exp2_fast((x[i] - m) * kLog2e);
    sum += ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
  }
  DPT_HD OnlineSoftmax state() const { return {m, sum, arg}; }
};

}  // namespace dpt::models::elementwise
