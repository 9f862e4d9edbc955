// models/kernels/cpu/attention.cpp: causal self-attention on bf16 q, k, v with float32 softmax statistics, the
// reference of the CUDA set's cuDNN flash attention: forward keeps only each query's logsumexp (no [t, t]
// probabilities), backward recomputes the probabilities from it (FlashAttention-2's backward: D_i = dO_i . O_i,
// dS = P (dP - D)). Plain loops in float32, one sequence and head at a time; grouped-query heads read their key/value
// head, whose gradients sum over its group in float32 before one rounding.
#include "models/kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dpt::models {

namespace {

// Where head h of position t of sequence b starts within qkv (part 0 q, 1 k, 2 v: h a query head for q, a key/value
// head for k and v) and within out.
struct AttnIndex {
  const AttentionShape& s;
  int64_t c() const { return s.n_head * s.head_size; }
  int64_t qkv(int64_t b, int64_t t, int part, int64_t h) const {
    const int64_t first = part == 0 ? 0 : part == 1 ? s.n_head : s.n_head + s.kv_heads();
    return (b * s.t + t) * s.qkv_width() + (first + h) * s.head_size;
  }
  int64_t kv_of(int64_t h) const { return h / (s.n_head / s.kv_heads()); }
  int64_t out(int64_t b, int64_t t, int64_t h) const { return (b * s.t + t) * c() + h * s.head_size; }
  int64_t stat(int64_t b, int64_t h, int64_t t) const { return (b * s.n_head + h) * s.t + t; }
};

float dot(const BFloat16* x, const BFloat16* y, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += to_float(x[d]) * to_float(y[d]);
  return acc;
}

}  // namespace

void CpuKernels::attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) {
  check_attention(s);
  const AttnIndex ix{s};
  const int64_t hs = s.head_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> score(static_cast<size_t>(s.t)), acc(static_cast<size_t>(hs));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.n_head; ++h)
      for (int64_t i = 0; i < s.t; ++i) {
        const BFloat16* q = qkv + ix.qkv(b, i, 0, h);
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          score[j] = scale * dot(q, qkv + ix.qkv(b, j, 1, ix.kv_of(h)), hs);
          mx = std::max(mx, score[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(score[j] - mx);
        const float lse = mx + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float p = std::exp(score[j] - lse);
          const BFloat16* v = qkv + ix.qkv(b, j, 2, ix.kv_of(h));
          for (int64_t d = 0; d < hs; ++d) acc[d] += p * to_float(v[d]);
        }
        for (int64_t d = 0; d < hs; ++d) out[ix.out(b, i, h) + d] = to_bfloat16(acc[d]);
        stats[ix.stat(b, h, i)] = lse;
      }
}

void CpuKernels::attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout, const float* stats,
                                    BFloat16* dqkv, const AttentionShape& s) {
  check_attention(s);
  const AttnIndex ix{s};
  const int64_t hs = s.head_size, n = s.t * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t group = s.n_head / s.kv_heads();
  std::vector<float> dq(static_cast<size_t>(n)), dk(static_cast<size_t>(n)), dv(static_cast<size_t>(n));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t g = ix.kv_of(h);
      std::fill(dq.begin(), dq.end(), 0.0f);
      if (h % group == 0) {  // the first query head of key/value head g's group
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dv.begin(), dv.end(), 0.0f);
      }
      for (int64_t i = 0; i < s.t; ++i) {
        const BFloat16* q = qkv + ix.qkv(b, i, 0, h);
        const BFloat16* go = dout + ix.out(b, i, h);
        const float lse = stats[ix.stat(b, h, i)];
        const float di = dot(go, out + ix.out(b, i, h), hs);
        for (int64_t j = 0; j <= i; ++j) {
          const BFloat16* k = qkv + ix.qkv(b, j, 1, g);
          const BFloat16* v = qkv + ix.qkv(b, j, 2, g);
          const float p = std::exp(scale * dot(q, k, hs) - lse);
          const float ds = p * (dot(go, v, hs) - di) * scale;  // d(loss)/d(q . k)
          for (int64_t d = 0; d < hs; ++d) {
            dq[i * hs + d] += ds * to_float(k[d]);
            dk[j * hs + d] += ds * to_float(q[d]);
            dv[j * hs + d] += p * to_float(go[d]);
          }
        }
      }
      for (int64_t t = 0; t < s.t; ++t)
        for (int64_t d = 0; d < hs; ++d) dqkv[ix.qkv(b, t, 0, h) + d] = to_bfloat16(dq[t * hs + d]);
      if (h % group == group - 1)  // the group's last query head: key/value head g's sums are whole
        for (int64_t t = 0; t < s.t; ++t)
          for (int64_t d = 0; d < hs; ++d) {
            dqkv[ix.qkv(b, t, 1, g) + d] = to_bfloat16(dk[t * hs + d]);
            dqkv[ix.qkv(b, t, 2, g) + d] = to_bfloat16(dv[t * hs + d]);
          }
    }
}

}  // namespace dpt::models
