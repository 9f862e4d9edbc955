// models/kernels/library_plans.cpp: see library_plans.h.
#include "models/kernels/library_plans.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dpt::models {

LtMatmulPlan lt_matmul_plan(const MatmulShape& s, bool keep_aux) {
  LtMatmulPlan p;
  p.trans_a = s.trans_b;
  p.trans_b = s.trans_a;
  p.m = s.N;
  p.n = s.M;
  p.k = s.K;
  // Our B is stored (trans_b ? N x K : K x N) row-major, i.e. (trans_b ? K x N : N x K) column-major; our A likewise.
  p.a = s.trans_b ? LtLayout{s.K, s.N, s.ldb} : LtLayout{s.N, s.K, s.ldb};
  p.b = s.trans_a ? LtLayout{s.M, s.K, s.lda} : LtLayout{s.K, s.M, s.lda};
  p.d = LtLayout{s.N, s.M, s.ldd};
  p.d_f32 = s.d_f32;
  p.beta = s.accumulate ? 1.0f : 0.0f;
  switch (s.epilogue) {
    case MatmulEpilogue::None: break;
    case MatmulEpilogue::Bias:
      p.epilogue = LtEpilogue::Bias;
      p.bias_len = p.m;
      break;
    case MatmulEpilogue::BiasGelu:
      p.epilogue = keep_aux ? LtEpilogue::GeluAuxBias : LtEpilogue::GeluBias;
      p.bias_len = p.m;
      p.aux_ld = keep_aux ? p.m : 0;
      break;
    case MatmulEpilogue::BiasGrad:
      p.epilogue = LtEpilogue::BGradB;  // our bias gradient sums op(A) over K: cuBLASLt's B over its k
      p.bias_len = p.n;
      break;
    case MatmulEpilogue::DGelu:
      p.epilogue = LtEpilogue::DGelu;  // aux [M, N] row-major, packed: column-major m x n with ld m
      p.aux_ld = p.m;
      break;
  }
  return p;
}

LtMatmulPlan lt_plain_plan(const LtMatmulPlan& p) {
  LtMatmulPlan plain = p;
  plain.epilogue = LtEpilogue::Default;
  plain.bias_len = 0;
  plain.aux_ld = 0;
  return plain;
}

LtMatmulPlan lt_autocast_plan(const LtMatmulPlan& p) {
  LtMatmulPlan a = lt_plain_plan(p);
  a.d_f32 = false;
  a.beta = 0.0f;
  a.d.ld = a.d.rows;  // packed scratch: our row-major [M, N], row stride N (cuBLASLt's ld m)
  a.any_reduction = true;
  return a;
}

LtColumnSums lt_column_sums(const LtMatmulPlan& p) {
  // cuBLASLt's B is n x k column-major when transposed (our A as stored, K x M row-major: element (i, k) at k ld + i),
  // else k x n (element (k, i) at i ld + k).
  return p.trans_b ? LtColumnSums{p.n, p.k, 1, p.b.ld} : LtColumnSums{p.n, p.k, p.b.ld, 1};
}

std::string lt_epilogue_unfusable(const LtMatmulPlan& p) {
  const std::pair<const char*, int64_t> dims[] = {{"m", p.m},       {"n", p.n},       {"k", p.k},
                                                  {"lda", p.a.ld}, {"ldb", p.b.ld}, {"ldd", p.d.ld}};
  for (const auto& [name, v] : dims)
    if (v % 8 != 0) return fmt::format("{} {} is not a multiple of 8", name, v);
  if (p.aux_ld % 8 != 0) return fmt::format("aux_ld {} is not a multiple of 8", p.aux_ld);
  return {};
}

std::string describe(const LtMatmulPlan& p) {
  static constexpr const char* kEpilogue[] = {"default", "bias", "gelu_bias", "gelu_aux_bias", "bgradb", "dgelu"};
  const auto layout = [](const LtLayout& l) { return fmt::format("{}x{}/{}", l.rows, l.cols, l.ld); };
  return fmt::format("m {} n {} k {} A {} {} B {} {} D {} {} beta {} epilogue {}{}", p.m, p.n, p.k,
                     p.trans_a ? "T" : "N", layout(p.a), p.trans_b ? "T" : "N", layout(p.b), layout(p.d),
                     p.d_f32 ? "f32" : "bf16", p.beta, kEpilogue[static_cast<int>(p.epilogue)],
                     p.any_reduction ? " any-reduction" : "");
}

SdpaPlan sdpa_plan(const AttentionShape& s) {
  const int64_t c = s.n_head * s.head_size, w = s.qkv_width(), ckv = s.kv_heads() * s.head_size;
  SdpaPlan p;
  // Position t of sequence b is row b * t + t of qkv [b * t, W] (W = (n_head + 2 kv_heads) head_size); query head h is
  // its columns h * head_size.., key/value head g columns C + g * head_size.. and C + C_kv + g * head_size.. (cuDNN
  // reads grouped-query attention from k's and v's head count).
  const std::array<int64_t, 4> dim{s.b, s.n_head, s.t, s.head_size}, kv_dim{s.b, s.kv_heads(), s.t, s.head_size};
  const std::array<int64_t, 4> in_qkv{s.t * w, s.head_size, w, 1};
  p.q = {dim, in_qkv, 0};
  p.k = {kv_dim, in_qkv, c};
  p.v = {kv_dim, in_qkv, c + ckv};
  p.o = {dim, {s.t * c, s.head_size, c, 1}, 0};
  p.stats = {{s.b, s.n_head, s.t, 1}, {s.n_head * s.t, s.t, 1, 1}, 0};
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  return p;
}

SdpaExtents sdpa_extents(const SdpaPlan& p) {
  const auto end = [](const SdpaTensor& x) {
    int64_t last = x.offset;
    for (size_t i = 0; i < 4; ++i) last += (x.dim[i] - 1) * x.stride[i];
    return last + 1;
  };
  return {.qkv = std::max({end(p.q), end(p.k), end(p.v)}), .out = end(p.o), .stats = end(p.stats)};
}

bool tune_adopts(double chosen_ms, double best_ms, double margin) {
  return chosen_ms >= 0 && best_ms >= 0 && best_ms <= chosen_ms * (1.0 - margin);
}

void SweepTally::add(int index, double ms) {
  if (ms < 0) {
    ++refused;
    return;
  }
  ++tried;
  if (best < 0 || ms < best_ms) {
    best_ms = ms;
    best = index;
  }
}

std::string sdpa_unsupported(const AttentionShape& s) {
  if (s.head_size % 8 != 0 || s.head_size > 128)
    return fmt::format("cuDNN's fused attention takes a head size that is a multiple of 8 and at most 128; this "
                       "model's is {} (a GPT's n_embd / n_head, a Llama's head_dim)",
                       s.head_size);
  return "";
}

}  // namespace dpt::models
