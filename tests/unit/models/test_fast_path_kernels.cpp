// tests/unit/models/test_fast_path_kernels.cpp: the CPU kernel set's transformer fast path (bf16 matmul with its
// epilogues, causal attention with logsumexp statistics, the fused classifier, the fused AdamW) against references
// written here in double from the definitions, on random bf16 inputs. The CPU set is in turn the reference of the
// CUDA set's cuBLASLt / cuDNN / kernel versions (tests/unit/gpu/test_fast_path.cpp), so these pin down the
// arithmetic both follow. Tolerances: a bf16 output may differ from the exact value by its rounding (2^-8
// relative) plus the float32 accumulation's error (a few 2^-24 of the sum of the terms' magnitudes).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "models/kernels/elementwise.h"
#include "models/kernels/factory.h"
#include "models/kernels/row_runs.h"
#include "models/kernels/smem_limits.h"

using namespace dpt;
using namespace dpt::models;

namespace {

Kernels& cpu() { return kernels_for(Device::cpu()); }

std::vector<BFloat16> random_bf16(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = to_bfloat16(u(rng));
  return v;
}

double f(BFloat16 b) { return static_cast<double>(to_float(b)); }

// |got - want| <= 2^-8 |want| + 1e-5 scale + 1e-6: a bf16 rounding plus float32 accumulation.
bool bf16_close(double got, double want, double scale) {
  return std::abs(got - want) <= std::ldexp(1.0, -8) * std::abs(want) + 1e-5 * scale + 1e-6;
}

}  // namespace

TEST_CASE("matmul_bf16 on the CPU: the product and every epilogue against double", "[fastpath]") {
  std::mt19937 rng(11);
  const int64_t M = 9, N = 13, K = 21;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto ep : {MatmulEpilogue::None, MatmulEpilogue::Bias, MatmulEpilogue::BiasGelu, MatmulEpilogue::BiasGrad,
                      MatmulEpilogue::DGelu})
        for (bool f32 : {false, true}) {
          const bool wants_f32 = ep == MatmulEpilogue::BiasGrad;
          const bool wants_bf16 = ep == MatmulEpilogue::Bias || ep == MatmulEpilogue::BiasGelu;
          const bool dgelu = ep == MatmulEpilogue::DGelu;
          if ((wants_f32 && !f32) || ((wants_bf16 || dgelu) && f32)) continue;
          CAPTURE(ta, tb, static_cast<int>(ep), f32);
          const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldd = N + 3;
          const auto a = random_bf16(static_cast<size_t>((ta ? K : M) * lda), rng);
          const auto b = random_bf16(static_cast<size_t>((tb ? N : K) * ldb), rng);
          const auto bias = random_bf16(static_cast<size_t>(N), rng);
          std::vector<float> d32(static_cast<size_t>(M * ldd)), bgrad(static_cast<size_t>(M));
          std::uniform_real_distribution<float> u(-1, 1);
          for (float& x : d32) x = u(rng);
          for (float& x : bgrad) x = u(rng);
          const std::vector<float> d32_before = d32, bgrad_before = bgrad;
          std::vector<BFloat16> d16(static_cast<size_t>(M * ldd), BFloat16{0x7FC0}), aux(static_cast<size_t>(M * N));
          if (dgelu) aux = random_bf16(static_cast<size_t>(M * N), rng, -3.0f, 3.0f);  // the pre-activation read
          MatmulShape s{.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldd = ldd,
                        .d_f32 = f32, .accumulate = f32, .epilogue = ep};
          MatmulOperands o{.a = a.data(), .b = b.data(), .d = f32 ? static_cast<void*>(d32.data()) : d16.data(),
                           .bias = wants_bf16 ? bias.data() : nullptr,
                           .aux = ep == MatmulEpilogue::BiasGelu || dgelu ? aux.data() : nullptr,
                           .bias_grad = wants_f32 ? bgrad.data() : nullptr};
          cpu().matmul_bf16(s, o);
          const auto A = [&](int64_t i, int64_t k) { return f(ta ? a[k * lda + i] : a[i * lda + k]); };
          const auto B = [&](int64_t k, int64_t j) { return f(tb ? b[j * ldb + k] : b[k * ldb + j]); };
          size_t bad = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0, scale = 0;
              for (int64_t k = 0; k < K; ++k) {
                acc += A(i, k) * B(k, j);
                scale += std::abs(A(i, k) * B(k, j));
              }
              if (f32) {
                const double want = d32_before[i * ldd + j] + acc;
                bad += std::abs(d32[i * ldd + j] - want) > 1e-5 * (scale + 1.0);
                continue;
              }
              double want = acc;
              if (wants_bf16) want += f(bias[j]);
              if (ep == MatmulEpilogue::BiasGelu) {
                bad += !bf16_close(f(aux[i * N + j]), want, scale);
                want = elementwise::gelu(static_cast<float>(want));
              }
              if (dgelu) {  // the product through GELU's gradient at the pre-activation, rounded once
                const double g = elementwise::gelu_grad(to_float(aux[i * N + j]));
                want *= g;
                scale *= std::abs(g);
              }
              bad += !bf16_close(f(d16[i * ldd + j]), want, scale);
            }
          CHECK(bad == 0);
          // D's padding columns are never written.
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = N; j < ldd; ++j) {
              if (f32)
                CHECK(d32[i * ldd + j] == d32_before[i * ldd + j]);
              else
                CHECK(d16[i * ldd + j].bits == 0x7FC0);
            }
          if (wants_f32)
            for (int64_t i = 0; i < M; ++i) {
              double sum = 0;
              for (int64_t k = 0; k < K; ++k) sum += A(i, k);
              CHECK(bgrad[i] == Approx(bgrad_before[i] + sum).margin(1e-5));
            }
        }
}

TEST_CASE("matmul_bf16 refuses epilogues without their operands", "[fastpath]") {
  std::vector<BFloat16> a(4), b(4), d(4);
  std::vector<float> d32(4);
  MatmulShape s{.M = 2, .N = 2, .K = 2, .lda = 2, .ldb = 2, .ldd = 2};
  MatmulOperands o{.a = a.data(), .b = b.data(), .d = d.data()};
  s.accumulate = true;  // into bf16
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("accumulates into float32 D only"));
  s.accumulate = false;
  s.epilogue = MatmulEpilogue::Bias;  // no bias
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("bias epilogues"));
  s.epilogue = MatmulEpilogue::BiasGrad;  // bf16 D
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("bias gradient"));
  s.epilogue = MatmulEpilogue::DGelu;  // no pre-activation to read
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("GELU-gradient epilogue"));
  s.epilogue = MatmulEpilogue::None;  // an aux nobody reads
  std::vector<BFloat16> aux(4);
  o.aux = aux.data();
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("aux is BiasGelu's or DGelu's"));
  o.aux = nullptr;
  s.epilogue = MatmulEpilogue::None;
  s.ldd = 1;  // shorter than a row of D
  CHECK_THROWS_WITH(cpu().matmul_bf16(s, o), Catch::Contains("row strides"));
}

namespace {

// Causal attention in double from its definition, on the widened bf16 qkv [b, t, H + 2 G, hs] (G key/value heads, query
// head h reading key/value head h / (H / G); G = H: [b, t, 3, H, hs]): out, the logsumexp per
// query, and (from dout) dqkv through the probabilities: dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = scale dS K,
// dK = scale dS^T Q, where D_i = dO_i . O_i is taken from `out16`, the kernel's bf16 output (FlashAttention's and
// cuDNN's backward read the forward's rounded O; the exact rowsum(P dP) differs from it by O's rounding).
struct AttnRef {
  std::vector<double> out, lse, dqkv;
};

AttnRef attention_reference(const std::vector<BFloat16>& qkv, const std::vector<BFloat16>& dout,
                            const std::vector<BFloat16>& out16, const AttentionShape& s) {
  const int64_t C = s.n_head * s.head_size, hs = s.head_size, T = s.t;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttnRef r;
  r.out.assign(static_cast<size_t>(s.b * T * C), 0.0);
  r.lse.assign(static_cast<size_t>(s.b * s.n_head * T), 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  const int64_t G = s.kv_heads(), W = s.qkv_width();
  // Element d of head h (a query head for part 0, its key/value head for parts 1 and 2) at position t.
  const auto at = [&](int64_t b, int64_t t, int part, int64_t h, int64_t d) {
    const int64_t head = part == 0 ? h : (part == 1 ? s.n_head : s.n_head + G) + h / (s.n_head / G);
    return (b * T + t) * W + head * hs + d;
  };
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.n_head; ++h) {
      std::vector<double> P(static_cast<size_t>(T * T), 0.0), dP(static_cast<size_t>(T * T), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        std::vector<double> sc(static_cast<size_t>(i + 1));
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) dot += f(qkv[at(b, i, 0, h, d)]) * f(qkv[at(b, j, 1, h, d)]);
          sc[j] = scale * dot;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(sc[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * s.n_head + h) * T + i] = lse;
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = std::exp(sc[j] - lse);
        for (int64_t d = 0; d < hs; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += P[i * T + j] * f(qkv[at(b, j, 2, h, d)]);
          r.out[(b * T + i) * C + h * hs + d] = o;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        const auto go = [&](int64_t d) { return f(dout[(b * T + i) * C + h * hs + d]); };
        double rowsum = 0;
        for (int64_t d = 0; d < hs; ++d) rowsum += go(d) * f(out16[(b * T + i) * C + h * hs + d]);
        for (int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < hs; ++d) dp += go(d) * f(qkv[at(b, j, 2, h, d)]);
          dP[i * T + j] = dp;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[i * T + j], ds = p * (dP[i * T + j] - rowsum) * scale;
          for (int64_t d = 0; d < hs; ++d) {
            r.dqkv[at(b, i, 0, h, d)] += ds * f(qkv[at(b, j, 1, h, d)]);
            r.dqkv[at(b, j, 1, h, d)] += ds * f(qkv[at(b, i, 0, h, d)]);
            r.dqkv[at(b, j, 2, h, d)] += p * go(d);
          }
        }
      }
    }
  return r;
}

}  // namespace

TEST_CASE("attention on the CPU: out, logsumexp and dqkv against double", "[fastpath]") {
  std::mt19937 rng(5);
  // Multi-head, and grouped-query (4 query heads over 2 key/value heads; 3 over 1: multi-query).
  for (const AttentionShape s : {AttentionShape{2, 9, 3, 8}, AttentionShape{1, 1, 2, 16}, AttentionShape{1, 17, 1, 32},
                                 AttentionShape{2, 9, 4, 8, 2}, AttentionShape{1, 7, 3, 16, 1}}) {
    CAPTURE(s.b, s.t, s.n_head, s.head_size, s.n_kv_head);
    const int64_t C = s.n_head * s.head_size;
    const auto qkv = random_bf16(static_cast<size_t>(s.b * s.t * s.qkv_width()), rng, -2.0f, 2.0f);
    const auto dout = random_bf16(static_cast<size_t>(s.b * s.t * C), rng);
    std::vector<BFloat16> out(static_cast<size_t>(s.b * s.t * C), BFloat16{0x7FC0}),
        dqkv(qkv.size(), BFloat16{0x7FC0});
    std::vector<float> stats(static_cast<size_t>(s.b * s.n_head * s.t), NAN);
    cpu().attention_forward(qkv.data(), out.data(), stats.data(), s);
    cpu().attention_backward(qkv.data(), out.data(), dout.data(), stats.data(), dqkv.data(), s);
    const AttnRef r = attention_reference(qkv, dout, out, s);
    size_t bad_out = 0, bad_lse = 0, bad_d = 0;
    for (size_t i = 0; i < out.size(); ++i) bad_out += !bf16_close(f(out[i]), r.out[i], 2.0 * s.t);
    for (size_t i = 0; i < stats.size(); ++i) bad_lse += !(std::abs(stats[i] - r.lse[i]) <= 1e-5 * (1 + std::abs(r.lse[i])));
    // dqkv: one bf16 rounding of float32 sums over the sequence (of terms up to ~4 in size; a key/value head's over
    // its group's query heads too).
    const double terms = 4.0 * s.t * s.head_size * static_cast<double>(s.n_head / s.kv_heads());
    double max_err = 0;
    for (size_t i = 0; i < dqkv.size(); ++i) {
      const double err = std::abs(f(dqkv[i]) - r.dqkv[i]);
      max_err = std::max(max_err, err);
      bad_d += !(err <= std::ldexp(1.0, -8) * std::abs(r.dqkv[i]) + 1e-5 * terms);
    }
    CAPTURE(max_err);
    CHECK(bad_out == 0);
    CHECK(bad_lse == 0);
    CHECK(bad_d == 0);
  }
}

TEST_CASE("attention is causal: later keys and values change nothing before them", "[fastpath]") {
  std::mt19937 rng(9);
  const AttentionShape s{1, 6, 2, 8};
  const int64_t C = s.n_head * s.head_size;
  auto qkv = random_bf16(static_cast<size_t>(s.t * 3 * C), rng);
  std::vector<BFloat16> out1(static_cast<size_t>(s.t * C)), out2(out1.size());
  std::vector<float> st1(static_cast<size_t>(s.n_head * s.t)), st2(st1.size());
  cpu().attention_forward(qkv.data(), out1.data(), st1.data(), s);
  for (int64_t c = 0; c < 3 * C; ++c) qkv[5 * 3 * C + c] = to_bfloat16(7.0f);  // position 5 only
  cpu().attention_forward(qkv.data(), out2.data(), st2.data(), s);
  CHECK(std::memcmp(out1.data(), out2.data(), 5 * C * sizeof(BFloat16)) == 0);
  CHECK(std::memcmp(out1.data() + 5 * C, out2.data() + 5 * C, C * sizeof(BFloat16)) != 0);
}

TEST_CASE("classifier_bf16 on the CPU: loss, hits and the bf16 gradient against double", "[fastpath]") {
  // Llama 3's 128256 columns too: a float running sum there loses the terms below half its last place (x < max - 7.6
  // once the sum nears 10^4), the loss 1.6e-5 low relatively on the H200's run, where the GPU's tree sum was right.
  const auto [rows, vocab, ld] = GENERATE(std::tuple<int64_t, int64_t, int64_t>{7, 300, 384},
                                          std::tuple<int64_t, int64_t, int64_t>{4, 128250, 128256});
  CAPTURE(vocab);
  std::mt19937 rng(3);
  const float range = vocab > 1000 ? 6.0f : 4.0f;  // the test's [-6, 6] on the GPU
  auto logits = random_bf16(static_cast<size_t>(rows * ld), rng, -range, range);
  std::vector<int32_t> labels(rows);
  std::uniform_int_distribution<int32_t> lab(0, vocab - 1);
  for (auto& l : labels) l = lab(rng);
  labels[0] = 0;
  labels[1] = static_cast<int32_t>(vocab - 1);
  // Row 2's label is its argmax: a hit.
  int64_t arg = 0;
  for (int64_t c = 1; c < vocab; ++c)
    if (f(logits[2 * ld + c]) > f(logits[2 * ld + arg])) arg = c;
  labels[2] = static_cast<int32_t>(arg);
  const auto before = logits;
  const float dscale = 1.0f / rows;
  double stats[2] = {0.5, 1.0};
  cpu().classifier_bf16(logits.data(), labels.data(), rows, vocab, ld, dscale, stats);
  double loss = 0;
  int hits = 0;
  size_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const BFloat16* z = before.data() + r * ld;
    double mx = -INFINITY, sum = 0;
    int64_t am = 0;
    for (int64_t c = 0; c < vocab; ++c) {
      if (f(z[c]) > mx) {
        mx = f(z[c]);
        am = c;
      }
    }
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(f(z[c]) - mx);
    const double lse = mx + std::log(sum);
    loss += lse - f(z[labels[r]]);
    hits += am == labels[r];
    for (int64_t c = 0; c < vocab; ++c) {
      const double want = dscale * (std::exp(f(z[c]) - lse) - (c == labels[r] ? 1.0 : 0.0));
      bad += !(std::abs(f(logits[r * ld + c]) - want) <= std::ldexp(1.0, -8) * std::abs(want) + 1e-7);
    }
    for (int64_t c = vocab; c < ld; ++c) bad += logits[r * ld + c].bits != 0;  // padding: zero gradient
  }
  CHECK(bad == 0);
  CHECK(stats[0] == Approx(0.5 + loss).epsilon(1e-6));
  CHECK(stats[1] == 1.0 + hits);
  CHECK(hits >= 1);
  // dscale 0: the statistics only, the logits untouched.
  auto again = before;
  double st[2] = {0, 0};
  cpu().classifier_bf16(again.data(), labels.data(), rows, vocab, ld, 0.0f, st);
  CHECK(std::memcmp(again.data(), before.data(), before.size() * sizeof(BFloat16)) == 0);
  CHECK(st[0] == Approx(loss).epsilon(1e-6));
  labels[3] = static_cast<int32_t>(vocab);  // a padding column is never a label
  CHECK_THROWS_WITH(cpu().classifier_bf16(again.data(), labels.data(), rows, vocab, ld, 0.0f, st),
                    Catch::Contains("outside [0, " + std::to_string(vocab) + ")"));
}

// A masked target (kIgnoreLabel): the row adds no loss and no hit and gets a zero gradient; every other row is what
// it is alone (each row's loss and gradient depend on that row only: the same bits). Both loss kernels.
// The CUDA classifier's pass 1 walked as its blocks walk a row (cuda/softmax.cu). Vectors: 1024 threads, thread t
// pushing vectors t, t + 1024, ... from the last down into an OnlineSoftmax8 (the row's last vector with its padding
// set to -inf), then each warp's 32 states merged by xor butterflies (lane l with lane l ^ off, off 16 down to 1),
// then the 32 warps' likewise. One column at a time: 256 threads pushing columns t, t + 256, ... into an
// OnlineSoftmax, merged in a fixed tree.
elementwise::OnlineSoftmax classifier_pass1(const std::vector<float>& z, int64_t vocab, bool vectors) {
  if (!vectors) {
    constexpr int kThreads = 256;
    std::vector<elementwise::OnlineSoftmax> part(kThreads, elementwise::online_softmax_start(vocab));
    for (int t = 0; t < kThreads; ++t)
      for (int64_t c = t; c < vocab; c += kThreads) part[t].push(z[c], c);
    for (int w = kThreads / 2; w > 0; w /= 2)
      for (int t = 0; t < w; ++t) part[t].merge(part[t + w]);
    return part[0];
  }
  constexpr int kThreads = 1024;
  const int nvec = static_cast<int>((vocab + 7) / 8);
  std::vector<elementwise::OnlineSoftmax> state(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    elementwise::OnlineSoftmax8 acc;
    acc.arg = static_cast<int>(vocab);
    if (t < nvec)
      for (int v = t + (nvec - 1 - t) / kThreads * kThreads; v >= 0; v -= kThreads) {
        float x[8];
        for (int i = 0; i < 8; ++i) x[i] = v * 8 + i < vocab ? z[v * 8 + i] : -INFINITY;
        acc.push(x, v * 8);
      }
    state[t] = acc.state();
  }
  const auto butterfly = [](std::vector<elementwise::OnlineSoftmax>& s, size_t first) {  // 32 states from first
    for (int off = 16; off > 0; off /= 2) {
      std::vector<elementwise::OnlineSoftmax> next(s.begin() + first, s.begin() + first + 32);
      for (int l = 0; l < 32; ++l) next[l].merge(s[first + (l ^ off)]);
      std::copy(next.begin(), next.end(), s.begin() + first);
    }
  };
  std::vector<elementwise::OnlineSoftmax> warps(32);
  for (int w = 0; w < 32; ++w) {
    butterfly(state, static_cast<size_t>(32 * w));
    for (int l = 1; l < 32; ++l) {  // every lane ends with the same bits
      CHECK(state[32 * w + l].m == state[32 * w].m);
      CHECK(state[32 * w + l].arg == state[32 * w].arg);
    }
    warps[w] = state[32 * w];
  }
  butterfly(warps, 0);
  return warps[0];
}

TEST_CASE("the classifier's online softmax: eight columns at a time or one, merged over a block, against double",
          "[fastpath]") {
  std::mt19937 rng(77);
  for (const int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{301}, int64_t{2048}, int64_t{50257}}) {
    CAPTURE(vocab);
    std::vector<float> z(static_cast<size_t>((vocab + 7) / 8 * 8), 1e30f);  // beyond vocab: never read as a column
    const auto bf = random_bf16(static_cast<size_t>(vocab), rng, -8.0f, 8.0f);
    for (int64_t c = 0; c < vocab; ++c) z[c] = to_float(bf[c]);
    int64_t first = 0;
    for (int64_t c = 1; c < vocab; ++c) first = z[c] > z[first] ? c : first;
    double sum = 0;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(z[c]) - z[first]);
    for (const bool vectors : {true, false}) {
      CAPTURE(vectors);
      const auto got = classifier_pass1(z, vocab, vectors);
      CHECK(got.m == z[first]);
      CHECK(got.arg == first);  // bf16 draws from [-8, 8]: a long row holds its maximum more than once
      CHECK(std::abs(got.sum - sum) <= 1e-5 * sum);
    }
  }
  // The maximum twice (the first one wins), -inf columns count 0; a NaN column makes the sum NaN (the loss shows
  // it); a row of -inf alone sums to 0 both ways, so its loss log(0) - (-inf - -inf) is NaN.
  std::vector<float> z(4096, -1.0f);
  z[9] = 3.0f;
  z[4000] = 3.0f;
  z[17] = -INFINITY;
  for (const bool vectors : {true, false}) {
    CAPTURE(vectors);
    const auto got = classifier_pass1(z, 4096, vectors);
    CHECK(got.m == 3.0f);
    CHECK(got.arg == 9);
    CHECK(std::abs(got.sum - (2.0 + 4093 * std::exp(-4.0))) <= 1e-5 * got.sum);
  }
  // -inf in the first columns a thread sees counts 0, not NaN: one column at a time, thread 0's first two columns
  // and every thread's first; by vectors, threads 0 to 256's only vector.
  std::vector<float> lead(4096, -1.0f);
  std::fill_n(lead.begin(), 8 * 256 + 8, -INFINITY);
  lead[4000] = 2.0f;
  for (const bool vectors : {true, false}) {
    CAPTURE(vectors);
    const auto got = classifier_pass1(lead, 4096, vectors);
    CHECK(got.m == 2.0f);
    CHECK(got.arg == 4000);
    CHECK(std::abs(got.sum - (1.0 + (4096 - 2056 - 1) * std::exp(-3.0))) <= 1e-5 * got.sum);
  }
  {  // By vectors, threads holding several (vocabulary 20000: 2500 vectors, threads 0 to 451 three, the others two),
     // walked from the last down. The maximum in one thread's vectors 1 and 1025 (columns 9 and 8201) and twice in
     // one vector (12): the first column, 9, whatever the order of the visits. Every thread's last vectors -inf (the
     // first it sees: its running maximum still -inf when the finite ones come) or its first ones -inf.
    const int64_t V = 20000;
    std::vector<float> many(static_cast<size_t>(V));
    const auto bf = random_bf16(static_cast<size_t>(V), rng, -8.0f, 2.0f);
    for (int64_t c = 0; c < V; ++c) many[c] = to_float(bf[c]);
    many[9] = many[8201] = many[12] = 3.0f;
    const auto exact = [&](const std::vector<float>& row) {
      double s = 0.0;
      float mx = -INFINITY;
      for (float v : row) mx = std::max(mx, v);
      for (float v : row) s += std::exp(static_cast<double>(v) - mx);
      return s;
    };
    auto got = classifier_pass1(many, V, true);
    CHECK(got.m == 3.0f);
    CHECK(got.arg == 9);
    CHECK(std::abs(got.sum - exact(many)) <= 1e-5 * got.sum);
    auto tail = many;
    std::fill(tail.begin() + 8 * 1024 * 2, tail.end(), -INFINITY);  // vectors 2048 on: threads 0-451's first visit
    got = classifier_pass1(tail, V, true);
    CHECK(got.arg == 9);
    CHECK(std::abs(got.sum - exact(tail)) <= 1e-5 * got.sum);
    auto head = many;
    std::fill(head.begin(), head.begin() + 8 * 1024 + 8, -INFINITY);  // every thread's first vector, thread 0's two
    head[9000] = 4.0f;
    got = classifier_pass1(head, V, true);
    CHECK(got.m == 4.0f);
    CHECK(got.arg == 9000);
    CHECK(std::abs(got.sum - exact(head)) <= 1e-5 * got.sum);
    // A thread's first visit all NaN (m still -inf), then finite vectors: the NaN stays.
    auto nan_first = many;
    std::fill_n(nan_first.begin() + 8 * 2048, 8, NAN);  // vector 2048: thread 0's first visit
    CHECK(std::isnan(classifier_pass1(nan_first, V, true).sum));
  }
  z[100] = NAN;
  CHECK(std::isnan(classifier_pass1(z, 4096, true).sum));
  CHECK(std::isnan(classifier_pass1(z, 4096, false).sum));
  // A thread whose columns are all NaN (thread 0's vector 0, or its columns 0, 256, 512, 768 one at a time) keeps
  // m = -inf with a NaN sum: the merge carries the NaN (it once took such a thread's sum as 0: a finite loss).
  std::vector<float> nan_vector(1024, 0.5f), nan_columns(1024, 0.5f);
  std::fill_n(nan_vector.begin(), 8, NAN);
  for (const size_t c : {0, 256, 512, 768}) nan_columns[c] = NAN;
  CHECK(std::isnan(classifier_pass1(nan_vector, 1000, true).sum));
  CHECK(std::isnan(classifier_pass1(nan_columns, 1000, false).sum));
  // An overflowed logit (+inf): exp(inf - inf) is NaN on every path, as the CPU set's loop gives it.
  std::vector<float> pinf(1024, 0.5f);
  pinf[300] = INFINITY;
  CHECK(std::isnan(classifier_pass1(pinf, 1000, true).sum));
  CHECK(std::isnan(classifier_pass1(pinf, 1000, false).sum));
  const std::vector<float> all_inf(16, -INFINITY);
  CHECK(classifier_pass1(all_inf, 16, true).sum == 0.0f);
  CHECK(classifier_pass1(all_inf, 16, false).sum == 0.0f);
}

TEST_CASE("softmax_xent and classifier_bf16 skip kIgnoreLabel targets", "[fastpath]") {
  std::mt19937 rng(8);
  const int64_t rows = 6, vocab = 37, ld = 40;
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> z(static_cast<size_t>(rows * vocab));
  for (auto& x : z) x = u(rng);
  const std::vector<int32_t> labels{3, kIgnoreLabel, 36, kIgnoreLabel, 0, 11};
  // softmax_xent (float32 logits): against each valid row run alone, its gradient's 1/rows restored.
  std::vector<float> d(z.size(), NAN);
  double stats[2] = {0.0, 0.0};
  cpu().softmax_xent(z.data(), labels.data(), d.data(), rows, vocab, stats);
  double loss = 0.0, hits = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    const float* row_d = d.data() + r * vocab;
    if (labels[r] == kIgnoreLabel) {
      CHECK(std::all_of(row_d, row_d + vocab, [](float g) { return g == 0.0f; }));
      continue;
    }
    std::vector<float> one(static_cast<size_t>(vocab));
    double st[2] = {0, 0};
    cpu().softmax_xent(z.data() + r * vocab, &labels[r], one.data(), 1, vocab, st);
    loss += st[0];
    hits += st[1];
    for (int64_t c = 0; c < vocab; ++c) CHECK(row_d[c] == one[c] * (1.0f / static_cast<float>(rows)));
  }
  CHECK(stats[0] == loss);  // the same doubles added in the same order (the kernel's sum, then 0 + it)
  CHECK(stats[1] == hits);
  // classifier_bf16: the same rows as bf16, gradient in place, padding zeroed; against each valid row alone.
  std::vector<BFloat16> zb(static_cast<size_t>(rows * ld));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ld; ++c) zb[r * ld + c] = to_bfloat16(c < vocab ? z[r * vocab + c] : 9.0f);
  const auto before = zb;
  const float dscale = 0.125f;
  double sb[2] = {0, 0};
  cpu().classifier_bf16(zb.data(), labels.data(), rows, vocab, ld, dscale, sb);
  double loss_b = 0, hits_b = 0;
  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    if (labels[r] == kIgnoreLabel) {
      CHECK(std::all_of(zb.begin() + r * ld, zb.begin() + (r + 1) * ld, [](BFloat16 g) { return g.bits == 0; }));
      continue;
    }
    std::vector<BFloat16> one(before.begin() + r * ld, before.begin() + (r + 1) * ld);
    double st[2] = {0, 0};
    cpu().classifier_bf16(one.data(), &labels[r], 1, vocab, ld, dscale, st);
    loss_b += st[0];
    hits_b += st[1];
    CHECK(std::memcmp(one.data(), zb.data() + r * ld, static_cast<size_t>(ld) * sizeof(BFloat16)) == 0);
  }
  CHECK(sb[0] == loss_b);
  CHECK(sb[1] == hits_b);
  CHECK(loss_b > 0.0);
  // count_targets: the rows the mean divides by (4 of 6), added to what is there.
  double counted = 1.0;
  cpu().count_targets(labels.data(), rows, &counted);
  CHECK(counted == 5.0);
  // Only -1 is skipped: any other negative label is still refused.
  const std::vector<int32_t> bad{3, -2, 36, 1, 0, 11};
  CHECK_THROWS_WITH(cpu().softmax_xent(z.data(), bad.data(), nullptr, rows, vocab, stats),
                    Catch::Contains("label -2 outside [0, 37)"));
  CHECK_THROWS_WITH(cpu().classifier_bf16(zb.data(), bad.data(), rows, vocab, ld, 0.0f, sb),
                    Catch::Contains("label -2 outside [0, 37)"));
}

TEST_CASE("adamw_fused on the CPU: the bits of clip_by_norm then adamw_update run by run", "[fastpath]") {
  std::mt19937 rng(21);
  const size_t n = 1000;
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> p0(n), g(n), m0(n), v0(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = u(rng);
    g[i] = u(rng);
    m0[i] = 0.1f * u(rng);
    v0[i] = 0.01f * std::abs(u(rng));
  }
  const AdamWParams ap{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 7};
  const std::vector<uint64_t> edges{0, 300, 450, 451, 600, 1000};  // decays: [0, 300), [450, 451), [600, 1000)
  double ss = 0;
  for (float x : g) ss += static_cast<double>(x) * x;
  for (double max_norm : {1.0, 1e9}) {  // clipped (norm ~18), and not
    for (bool with_ss : {true, false}) {
      CAPTURE(max_norm, with_ss);
      // The reference: clip the gradients in place, then one adamw_update per run of equal decay.
      std::vector<float> pr = p0, gr = g, mr = m0, vr = v0;
      if (with_ss) cpu().clip_by_norm(gr.data(), n, &ss, max_norm);
      const std::vector<std::pair<size_t, size_t>> runs{{0, 300}, {300, 450}, {450, 451}, {451, 600}, {600, 1000}};
      for (size_t r = 0; r < runs.size(); ++r) {
        AdamWParams rp = ap;
        if (r % 2 == 1) rp.weight_decay = 0.0f;
        const auto [lo, hi] = runs[r];
        cpu().adamw_update(pr.data() + lo, gr.data() + lo, mr.data() + lo, vr.data() + lo, hi - lo, rp);
      }
      std::vector<float> pf = p0, mf = m0, vf = v0;
      std::vector<BFloat16> p16(n, BFloat16{0x7FC0});
      cpu().adamw_fused(pf.data(), p16.data(), g.data(), mf.data(), vf.data(), n, ap, edges.data(), edges.size(),
                        with_ss ? &ss : nullptr, max_norm);
      CHECK(std::memcmp(pf.data(), pr.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(mf.data(), mr.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(vf.data(), vr.data(), n * sizeof(float)) == 0);
      size_t bad16 = 0;
      for (size_t i = 0; i < n; ++i) bad16 += p16[i].bits != to_bfloat16(pf[i]).bits;
      CHECK(bad16 == 0);
    }
  }
  // No ranges: every element decays; no param16: none written.
  std::vector<float> pa = p0, ma = m0, va = v0, pb = p0, mb = m0, vb = v0;
  cpu().adamw_fused(pa.data(), nullptr, g.data(), ma.data(), va.data(), n, ap, nullptr, 0, nullptr, 0.0);
  cpu().adamw_update(pb.data(), g.data(), mb.data(), vb.data(), n, ap);
  CHECK(std::memcmp(pa.data(), pb.data(), n * sizeof(float)) == 0);
  CHECK_THROWS(cpu().adamw_fused(pa.data(), nullptr, g.data(), ma.data(), va.data(), n, ap, edges.data(), 3, nullptr, 0.0));
  // Edges repeated (an empty range), none at 0, and one past the end: element by element by in_decay_range.
  const std::vector<uint64_t> odd{2, 5, 5, 6, 9, 777, 990, 1200};
  const elementwise::AdamWSteps steps = elementwise::adamw_steps(ap);
  std::vector<float> pe = p0, me = m0, ve = v0;
  for (size_t i = 0; i < n; ++i) {
    const bool decay = elementwise::in_decay_range(odd.data(), odd.size(), i);
    elementwise::adamw(pe[i], g[i], me[i], ve[i], decay ? steps.with_decay : steps.without_decay);
  }
  std::vector<float> pg = p0, mg = m0, vg = v0;
  cpu().adamw_fused(pg.data(), nullptr, g.data(), mg.data(), vg.data(), n, ap, odd.data(), odd.size(), nullptr, 0.0);
  CHECK(std::memcmp(pg.data(), pe.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(mg.data(), me.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(vg.data(), ve.data(), n * sizeof(float)) == 0);
}

TEST_CASE("in_decay_range: the parity of the edges at or below an index", "[fastpath]") {
  const uint64_t e[] = {2, 5, 5, 6, 9, 10};  // [2, 5), [5, 6), [9, 10)
  std::vector<int> got;
  for (uint64_t i = 0; i < 12; ++i) got.push_back(elementwise::in_decay_range(e, 6, i));
  CHECK(got == std::vector<int>{0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0});
  CHECK(!elementwise::in_decay_range(e, 0, 3));
  // Four at a time (the CUDA kernel's): element by element the same, edges inside a four or not, none at all too.
  const uint64_t wide[] = {0, 8, 13, 40, 41, 42, 47, 100};
  for (const auto& [edges, count] : {std::pair{e, size_t{6}}, std::pair{wide, size_t{8}}, std::pair{e, size_t{0}}})
    for (uint64_t i0 = 0; i0 < 104; i0 += 4) {
      bool four[4];
      elementwise::decay_flags4(edges, count, i0, four);
      for (int k = 0; k < 4; ++k) {
        CAPTURE(count, i0, k);
        CHECK(four[k] == elementwise::in_decay_range(edges, count, i0 + static_cast<uint64_t>(k)));
      }
    }
}

TEST_CASE("the parameter gradients overwritten (fresh grads): matmul_bf16's weight and bias gradients and the norms' "
          "dgamma and dbeta, the same bits as added onto zeros, whatever the buffers held", "[fastpath]") {
  // A step's first backward after Model::zero_grad left the gradients as they were (Module::set_fresh_grads).
  std::mt19937 rng(23);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t K : {int64_t{21}, int64_t{0}}) {  // K 0: no rows, the sums 0
    CAPTURE(K);
    const int64_t M = 9, N = 13;
    const auto a = random_bf16(static_cast<size_t>(std::max<int64_t>(K, 1) * M), rng);  // dy^T: A stored K x M
    const auto b = random_bf16(static_cast<size_t>(std::max<int64_t>(K, 1) * N), rng);
    std::vector<float> d_add(static_cast<size_t>(M * N), 0.0f), bg_add(static_cast<size_t>(M), 0.0f);
    std::vector<float> d_new(static_cast<size_t>(M * N), nan), bg_new(static_cast<size_t>(M), nan);
    MatmulShape s{.trans_a = true, .M = M, .N = N, .K = K, .lda = M, .ldb = N, .ldd = N, .d_f32 = true,
                  .accumulate = true, .epilogue = MatmulEpilogue::BiasGrad};
    cpu().matmul_bf16(s, {.a = a.data(), .b = b.data(), .d = d_add.data(), .bias_grad = bg_add.data()});
    s.accumulate = false;
    cpu().matmul_bf16(s, {.a = a.data(), .b = b.data(), .d = d_new.data(), .bias_grad = bg_new.data()});
    CHECK(d_new == d_add);  // as floats: a -0 written where 0 + -0 gave +0 would still match
    CHECK(bg_new == bg_add);
  }
  for (const int64_t rows : {int64_t{37}, int64_t{0}}) {
    CAPTURE(rows);
    const int64_t C = 24;
    const size_t n = static_cast<size_t>(std::max<int64_t>(rows, 1) * C);
    const auto x = random_bf16(n, rng, -2.0f, 2.0f), dy = random_bf16(n, rng), res = random_bf16(n, rng);
    std::vector<float> gamma(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (float& g : gamma) g = u(rng);
    for (float& g : beta) g = u(rng) - 1.0f;
    std::vector<BFloat16> y(n), dx1(n), dx2(n);
    std::vector<float> mean(static_cast<size_t>(std::max<int64_t>(rows, 1))), rstd(mean.size());
    cpu().layernorm_forward_bf16(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows, C,
                                 1e-5f);
    std::vector<float> dg_add(static_cast<size_t>(C), 0.0f), db_add(dg_add), dg_new(static_cast<size_t>(C), nan);
    std::vector<float> db_new(dg_new);
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx1.data(),
                                  dg_add.data(), db_add.data(), rows, C, res.data());
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx2.data(),
                                  dg_new.data(), db_new.data(), rows, C, res.data(), /*accumulate=*/false);
    CHECK(dg_new == dg_add);
    CHECK(db_new == db_add);
    CHECK(std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(BFloat16)) == 0);
    cpu().rmsnorm_forward_bf16(x.data(), gamma.data(), y.data(), rstd.data(), rows, C, 1e-5f);
    std::vector<float> rg_add(static_cast<size_t>(C), 0.0f), rg_new(static_cast<size_t>(C), nan);
    cpu().rmsnorm_backward_bf16(dy.data(), x.data(), gamma.data(), rstd.data(), dx1.data(), rg_add.data(), rows, C,
                                nullptr);
    cpu().rmsnorm_backward_bf16(dy.data(), x.data(), gamma.data(), rstd.data(), dx2.data(), rg_new.data(), rows, C,
                                nullptr, /*accumulate=*/false);
    CHECK(rg_new == rg_add);
    // Accumulating adds onto what is there.
    std::vector<float> rg_twice = rg_add;
    cpu().rmsnorm_backward_bf16(dy.data(), x.data(), gamma.data(), rstd.data(), dx2.data(), rg_twice.data(), rows, C,
                                nullptr, /*accumulate=*/true);
    for (int64_t c = 0; c < C; ++c) CHECK(rg_twice[c] == Approx(2.0 * rg_add[c]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("row_runs and run_begin: the fused norm backwards' runs, one wave at most, every row once, in order",
          "[fastpath]") {
  // Uncapped: one run per 32 rows (the last shorter); capped at the blocks a GPU holds (396: an H200's three a
  // multiprocessor at 768 columns): GPT-2 124M's 16384 rows in 396 runs of 41 or 42.
  CHECK(row_runs(16384, 32, 0) == 512);
  CHECK(row_runs(16384, 32, 396) == 396);
  CHECK(row_runs(16384, 32, 600) == 512);
  CHECK(row_runs(1091, 32, 396) == 35);
  CHECK(row_runs(5, 32, 396) == 1);
  CHECK(row_runs(0, 32, 396) == 1);  // at least one (the launchers return before launching for no rows)
  CHECK(row_runs(int64_t{1} << 40, 32, 0) == int64_t{1} << 35);
  for (const auto& [rows, max_runs] : {std::pair<int64_t, int64_t>{16384, 396}, {16384, 0}, {1091, 396}, {300, 0},
                                       {5, 132}, {0, 396}, {12877, 396}, {1000003, 528}}) {
    CAPTURE(rows, max_runs);
    const int64_t runs = row_runs(rows, 32, max_runs);
    CHECK(run_begin(0, runs, rows) == 0);
    CHECK(run_begin(runs, runs, rows) == rows);
    int64_t shortest = rows, longest = 0;
    for (int64_t k = 0; k < runs; ++k) {
      const int64_t len = run_begin(k + 1, runs, rows) - run_begin(k, runs, rows);
      shortest = std::min(shortest, len);
      longest = std::max(longest, len);
      if (k > 0) CHECK(len <= run_begin(k, runs, rows) - run_begin(k - 1, runs, rows));  // the longer runs first
    }
    CHECK(longest - shortest <= 1);                     // shared out evenly
    if (max_runs == 0 || runs < max_runs) CHECK(longest <= 32);  // uncapped: never more than 32 rows a block
  }
  CHECK(run_begin(1, 396, 16384) == 42);  // 16384 = 396 * 41 + 148: the first 148 runs of 42 rows
  CHECK(run_begin(148, 396, 16384) == 148 * 42);
  CHECK(run_begin(149, 396, 16384) == 148 * 42 + 41);
  // No product that overflows: rows near 2^62 over many runs.
  const int64_t huge = int64_t{1} << 62;
  CHECK(run_begin(999, 1000, huge) == 999 * (huge / 1000) + std::min<int64_t>(999, huge % 1000));
  CHECK(run_begin(1000, 1000, huge) == huge);
}

TEST_CASE("SmemLimits: a kernel's shared memory limit raised once per device and larger size, never lowered",
          "[fastpath]") {
  // The fused LayerNorm backward's two column-sum arrays take 64 bytes a column: 49664 at 776 columns (the first past
  // the default 48 KB), 51200 at 800, 65536 at 1024. Before, each launch past 48 KB called cudaFuncSetAttribute.
  int k1 = 0, k2 = 0;  // two kernels' addresses
  SmemLimits limits;
  CHECK_FALSE(limits.needs_raise(0, &k1, 768 * 64));  // 49152: the default's
  CHECK(limits.needs_raise(0, &k1, 776 * 64));
  limits.raised(0, &k1, 1024 * 64);
  CHECK_FALSE(limits.needs_raise(0, &k1, 1024 * 64));  // the next launches at 1024 columns: nothing to ask
  CHECK_FALSE(limits.needs_raise(0, &k1, 800 * 64));   // a smaller size keeps the larger limit
  limits.raised(0, &k1, 800 * 64);                      // (were it lowered, 1024 columns would fail to launch)
  CHECK_FALSE(limits.needs_raise(0, &k1, 1024 * 64));
  CHECK(limits.needs_raise(0, &k1, 1024 * 64 + 16));  // larger than raised: again
  CHECK(limits.needs_raise(1, &k1, 800 * 64));        // per device: another GPU's context knows nothing of it
  CHECK(limits.needs_raise(0, &k2, 800 * 64));        // per kernel
  CHECK_FALSE(limits.needs_raise(1, &k2, SmemLimits::kDefaultBytes));
}

TEST_CASE("the bf16 LayerNorm, residual add and GELU backward: the float32 kernels on widened values, rounded once",
          "[fastpath]") {
  // Exactly: each bf16 kernel is its float32 twin's arithmetic on the widened inputs with the outputs rounded once,
  // so the float32 kernel run on widened copies and then rounded gives the same bits.
  std::mt19937 rng(77);
  const int64_t rows = 5, C = 24;
  const size_t n = static_cast<size_t>(rows * C);
  const auto x = random_bf16(n, rng, -3.0f, 3.0f), dy = random_bf16(n, rng);
  std::vector<float> xf(n), dyf(n), gamma(C), beta(C);
  for (size_t i = 0; i < n; ++i) {
    xf[i] = to_float(x[i]);
    dyf[i] = to_float(dy[i]);
  }
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto& g : gamma) g = u(rng);
  for (auto& b : beta) b = u(rng) - 1.0f;
  std::vector<BFloat16> y16(n), dx16(n);
  std::vector<float> y(n), dx(n), mean16(rows), rstd16(rows), mean(rows), rstd(rows);
  std::vector<float> dg16(C, 0.25f), db16(C, -0.5f), dg(C, 0.25f), db(C, -0.5f);
  cpu().layernorm_forward_bf16(x.data(), gamma.data(), beta.data(), y16.data(), mean16.data(), rstd16.data(), rows, C,
                               1e-5f);
  cpu().layernorm_forward(xf.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows, C, 1e-5f);
  cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean16.data(), rstd16.data(), dx16.data(),
                                dg16.data(), db16.data(), rows, C, nullptr);
  cpu().layernorm_backward(dyf.data(), xf.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                           db.data(), rows, C);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += y16[i].bits != to_bfloat16(y[i]).bits;
    bad += dx16[i].bits != to_bfloat16(dx[i]).bits;
  }
  CHECK(bad == 0);
  CHECK(mean16 == mean);
  CHECK(rstd16 == rstd);
  CHECK(dg16 == dg);
  CHECK(db16 == db);
  {  // With a residual gradient: dx + residual in float32, rounded once (not dx rounded, then added and rounded), also
     // with the residual in dx's buffer.
    const auto res = random_bf16(n, rng);
    std::vector<BFloat16> dxr(n), inplace = res;
    std::vector<float> dgr(C, 0.25f), dbr(C, -0.5f);
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean16.data(), rstd16.data(), dxr.data(),
                                  dgr.data(), dbr.data(), rows, C, res.data());
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean16.data(), rstd16.data(), inplace.data(),
                                  dgr.data(), dbr.data(), rows, C, inplace.data());
    size_t off = 0, twice = 0;
    for (size_t i = 0; i < n; ++i) {
      off += dxr[i].bits != to_bfloat16(dx[i] + to_float(res[i])).bits;
      twice += dxr[i].bits != to_bfloat16(to_float(dx16[i]) + to_float(res[i])).bits;
    }
    CHECK(off == 0);
    CHECK(twice > 0);  // the two roundings differ somewhere: the check above can tell them apart
    CHECK(std::memcmp(dxr.data(), inplace.data(), n * sizeof(BFloat16)) == 0);
    // The parameter sums as without the residual: from the same start, two backwards without it.
    std::vector<float> dg_once(C, 0.25f), db_once(C, -0.5f);
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean16.data(), rstd16.data(), dx16.data(),
                                  dg_once.data(), db_once.data(), rows, C, nullptr);
    cpu().layernorm_backward_bf16(dy.data(), x.data(), gamma.data(), mean16.data(), rstd16.data(), dx16.data(),
                                  dg_once.data(), db_once.data(), rows, C, nullptr);
    CHECK(dgr == dg_once);
    CHECK(dbr == db_once);
  }
  // The residual add and GELU's backward from the pre-activation.
  std::vector<BFloat16> sum(n), dgelu(n);
  cpu().add_bf16(x.data(), dy.data(), sum.data(), n);
  cpu().gelu_backward_bf16(x.data(), dy.data(), dgelu.data(), n);
  std::vector<float> sumf(n), dgeluf(n);
  cpu().add(xf.data(), dyf.data(), sumf.data(), n, false);
  for (size_t i = 0; i < n; ++i) dgeluf[i] = dyf[i] * elementwise::gelu_grad(xf[i]);
  bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += sum[i].bits != to_bfloat16(sumf[i]).bits;
    bad += dgelu[i].bits != to_bfloat16(dgeluf[i]).bits;
  }
  CHECK(bad == 0);
  // In place, as the residual stream uses it.
  auto acc = x;
  cpu().add_bf16(acc.data(), dy.data(), acc.data(), n);
  CHECK(std::memcmp(acc.data(), sum.data(), n * sizeof(BFloat16)) == 0);
}
