// tests/unit/gpu/test_gpt_kernels.cpp: the CUDA kernel set's transformer (GPT) operations against the CPU kernel
// set: strided batched GEMM (fp32 and bf16; contiguous, interleaved and repeated matrices, the attention's heads
// being interleaved within rows), token and position embeddings, LayerNorm, GELU and the causal softmax; then a
// whole GPT on the CPU and on cuda:0 through one forward and backward. Random inputs from fixed seeds and odd sizes
// (C not a multiple of 32, T = 1, fewer rows than columns for the softmax), with rows of very large, very small
// and constant values. Outputs a kernel overwrites start as NaN on the device, so an element it skips fails;
// outputs it accumulates into start random, so an overwrite fails; inputs it must not read (the masked part of a
// causal softmax) are NaN. Each test states its tolerance and why; "exact" means the same float operations in the
// same order on both sides, compared bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "gpu_testing.h"
#include "models/gpt/gpt.h"
#include "models/kernels/elementwise.h"
#include "models/kernels/factory.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

namespace {

Tensor random_tokens(int64_t rows, int64_t vocab, std::mt19937& rng) {
  Tensor t = Tensor::empty({rows}, DType::I32);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  for (int64_t r = 0; r < rows; ++r) t.data<int32_t>()[r] = dist(rng);
  return t;
}

// ---- strided batched GEMM operands -----------------------------------------------------------------------------

// How `batch` matrices of rows x cols share one buffer: matrix m's row r starts at m * stride + r * ld. Row strides
// are 3 longer than the rows (padding a kernel must neither need nor touch).
enum class Layout {
  contiguous,   // one matrix after the other
  interleaved,  // side by side within each row: the attention's heads (stride = cols, ld = batch * cols + pad)
  repeated,     // every matrix the same (stride 0); for the inputs only
};
struct Batched {
  int64_t rows, cols, ld, stride, size;
  int64_t at(int64_t m, int64_t r, int64_t c) const { return m * stride + r * ld + c; }
};
Batched batched(Layout l, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kPad = 3;
  Batched b{rows, cols, cols + kPad, 0, 0};
  if (l == Layout::contiguous) b.stride = rows * b.ld;
  if (l == Layout::interleaved) {
    b.ld = batch * cols + kPad;
    b.stride = cols;
  }
  b.size = (batch - 1) * b.stride + rows * b.ld;
  return b;
}

// The magnitude each element's rounding error scales with, s = |alpha| sum_k |op(A)_ik op(B)_kj| + |beta C_ij|, and
// the M x N results of every matrix, packed ([batch, M, N]), read out of C's layout.
std::vector<double> batched_error_scale(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, float alpha,
                                        const Tensor& A, const Batched& la, const Tensor& B, const Batched& lb,
                                        float beta, const Tensor& C, const Batched& lc) {
  std::vector<double> scale(static_cast<size_t>(batch * M * N));
  for (int64_t m = 0; m < batch; ++m)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < K; ++p) {
          const float a = A.data<float>()[ta ? la.at(m, p, i) : la.at(m, i, p)];
          const float b = B.data<float>()[tb ? lb.at(m, j, p) : lb.at(m, p, j)];
          s += std::abs(static_cast<double>(a) * b);
        }
        s *= std::abs(alpha);
        if (beta != 0.0f) s += std::abs(beta * static_cast<double>(C.data<float>()[lc.at(m, i, j)]));
        scale[static_cast<size_t>((m * M + i) * N + j)] = s;
      }
  return scale;
}
std::vector<float> batched_results(const Tensor& C, const Batched& lc, int64_t batch) {
  std::vector<float> out;
  for (int64_t m = 0; m < batch; ++m)
    for (int64_t i = 0; i < lc.rows; ++i)
      for (int64_t j = 0; j < lc.cols; ++j) out.push_back(C.data<float>()[lc.at(m, i, j)]);
  return out;
}

}  // namespace

// ---- gemm_strided_batched ------------------------------------------------------------------------------------

// The CPU set runs the Kernels base: one gemm per matrix (operands rounded first in bf16); the CUDA set one cuBLAS
// strided batched call (in bf16 on packed 16-bit copies of every operand matrix). Tolerances as the gemm tests':
// fp32, each element within 1e-5 of s (K <= 65 float products: at most ~K 2^-24 = 4e-6 of s) and ||gpu - cpu|| /
// ||cpu|| < 1e-5; bf16, 1e-4 of s and 1e-4 relative L2 (the products of two bf16 values are exact in float32, so
// only the summation order differs; the factor 10 is the tensor cores' accumulation), and where K >= 33 the result
// must be ~0.6 u away from the float32 product (> u / 8, u = 2^-8): the operands were rounded. Elements of C outside
// every matrix (the padding and, interleaved, nothing else) must keep their bits; with beta = 0 the matrices start
// as NaN, which must not be read.
TEST_CASE("cuda gemm_strided_batched matches the CPU loop over gemm, fp32 and bf16, contiguous interleaved and "
          "repeated matrices",
          "[gpu][kernels][gpt]") {
  const Precision p = GENERATE(Precision::F32, Precision::BF16);
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const auto [M, N, K, batch] = GENERATE(table<int64_t, int64_t, int64_t, int64_t>(
      {{1, 1, 1, 1}, {5, 7, 3, 4}, {7, 7, 12, 3}, {33, 17, 65, 2}, {1, 130, 33, 5}, {64, 64, 48, 12}}));
  // 0: all contiguous; 1: all interleaved (the attention's q k^T, att v, ...); 2: A repeated, B interleaved.
  const int layouts = GENERATE(0, 1, 2);
  const float beta = GENERATE(0.0f, 0.3f);
  CAPTURE(precision_name(p), ta, tb, M, N, K, batch, layouts, beta);
  const Layout la_kind = layouts == 0 ? Layout::contiguous : layouts == 1 ? Layout::interleaved : Layout::repeated;
  const Layout lb_kind = layouts == 0 ? Layout::contiguous : Layout::interleaved;
  const Layout lc_kind = layouts == 1 ? Layout::interleaved : Layout::contiguous;
  const Batched la = batched(la_kind, batch, ta ? K : M, ta ? M : K);
  const Batched lb = batched(lb_kind, batch, tb ? N : K, tb ? K : N);
  const Batched lc = batched(lc_kind, batch, M, N);
  std::mt19937 rng(101);
  const Tensor A = random_floats({la.size}, rng), B = random_floats({lb.size}, rng);
  Tensor C = random_floats({lc.size}, rng);
  if (beta == 0.0f)
    for (int64_t m = 0; m < batch; ++m)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C.data<float>()[lc.at(m, i, j)] = kNaN;
  const float alpha = 0.7f;

  Tensor want32 = copy_to(C, Device::cpu());
  cpu_kernels().gemm_strided_batched(ta, tb, M, N, K, alpha, A.data<float>(), la.ld, la.stride, B.data<float>(),
                                     lb.ld, lb.stride, beta, want32.data<float>(), lc.ld, lc.stride, batch);
  Tensor want = copy_to(C, Device::cpu());
  Tensor got;
  {
    const ScopedPrecision scope(p);
    cpu_kernels().gemm_strided_batched(ta, tb, M, N, K, alpha, A.data<float>(), la.ld, la.stride, B.data<float>(),
                                       lb.ld, lb.stride, beta, want.data<float>(), lc.ld, lc.stride, batch);
    const Tensor dA = to_device(A), dB = to_device(B);
    Tensor dC = to_device(C);
    gpu_kernels().gemm_strided_batched(ta, tb, M, N, K, alpha, dA.data<float>(), la.ld, la.stride, dB.data<float>(),
                                       lb.ld, lb.stride, beta, dC.data<float>(), lc.ld, lc.stride, batch);
    got = to_host(dC);
  }

  // Outside every matrix of C: untouched.
  std::vector<bool> covered(static_cast<size_t>(lc.size), false);
  for (int64_t m = 0; m < batch; ++m)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) covered[static_cast<size_t>(lc.at(m, i, j))] = true;
  size_t outside_changed = 0;
  for (int64_t e = 0; e < lc.size; ++e)
    if (!covered[static_cast<size_t>(e)])
      outside_changed += std::memcmp(got.data<float>() + e, C.data<float>() + e, sizeof(float)) != 0;
  REQUIRE(outside_changed == 0);

  const std::vector<float> g = batched_results(got, lc, batch), w = batched_results(want, lc, batch),
                           w32 = batched_results(want32, lc, batch);
  const std::vector<double> scale = batched_error_scale(ta, tb, M, N, K, batch, alpha, A, la, B, lb, beta, C, lc);
  const double tol = p == Precision::F32 ? 1e-5 : 1e-4;
  const Diff d = compare(g.data(), w.data(), g.size(), 0.0, tol, scale.data());
  INFO("C: " << d);
  REQUIRE(d.nonfinite == 0);
  REQUIRE(d.bad == 0);
  if (M * N > 1) REQUIRE(d.rel_l2 < tol);
  if (p != Precision::F32 && M * N > 1 && K >= 33) {
    const Diff d32 = compare(g.data(), w32.data(), g.size());
    INFO("against the float32 product: " << d32);
    REQUIRE(d32.rel_l2 > unit_roundoff(p) / 8);
  }
}

TEST_CASE("cuda gemm_strided_batched with batch 0, M = 0 or N = 0 is a no-op", "[gpu][kernels][gpt]") {
  const Tensor A = to_device(filled({4}, 1.0f)), B = to_device(filled({4}, 1.0f));
  Tensor C = to_device(filled({4}, 5.0f));
  Kernels& k = gpu_kernels();
  k.gemm_strided_batched(false, false, 2, 2, 1, 1.0f, A.data<float>(), 1, 2, B.data<float>(), 2, 2, 0.0f,
                         C.data<float>(), 2, 4, 0);
  k.gemm_strided_batched(false, false, 0, 2, 2, 1.0f, A.data<float>(), 2, 0, B.data<float>(), 2, 0, 0.0f,
                         C.data<float>(), 2, 0, 3);
  k.gemm_strided_batched(false, false, 2, 0, 2, 1.0f, A.data<float>(), 2, 0, B.data<float>(), 1, 0, 0.0f,
                         C.data<float>(), 1, 0, 3);
  const Diff d = compare(to_host(C), filled({4}, 5.0f));
  INFO("C: " << d);
  REQUIRE(d.bad == 0);
}

// ---- embeddings ----------------------------------------------------------------------------------------------

// Exact: one float addition per element on both sides. Rows need not be a multiple of T (r mod T).
TEST_CASE("cuda embedding_forward is the CPU's bit for bit", "[gpu][kernels][gpt]") {
  const auto [rows, T, C, vocab] = GENERATE(table<int64_t, int64_t, int64_t, int64_t>(
      {{1, 1, 1, 1}, {15, 5, 7, 11}, {32, 16, 96, 50}, {4, 1, 33, 3}, {66, 33, 65, 1000}, {7, 3, 5, 2}}));
  CAPTURE(rows, T, C, vocab);
  std::mt19937 rng(102);
  const Tensor tokens = random_tokens(rows, vocab, rng);
  const Tensor wte = random_floats({vocab, C}, rng), wpe = random_floats({T, C}, rng);
  Tensor want = Tensor::empty({rows, C});
  cpu_kernels().embedding_forward(tokens.data<int32_t>(), wte.data<float>(), wpe.data<float>(), want.data<float>(),
                                  rows, T, C, vocab);
  const Tensor dtok = to_device(tokens), dwte = to_device(wte), dwpe = to_device(wpe);
  Tensor y = nan_on_device({rows, C});
  gpu_kernels().embedding_forward(dtok.data<int32_t>(), dwte.data<float>(), dwpe.data<float>(), y.data<float>(), rows,
                                  T, C, vocab);
  REQUIRE(bits_differ("embedding y", to_host(y), want) == "");
}

// The CPU throws; the GPU cannot, so it writes NaN over the whole row of each bad token (-1 and vocab here) and the
// other rows exactly as the CPU does.
TEST_CASE("cuda embedding_forward: a token outside the vocabulary makes its row NaN (the CPU throws)",
          "[gpu][kernels][gpt]") {
  const int64_t rows = 12, T = 4, C = 37, vocab = 9;
  std::mt19937 rng(103);
  Tensor tokens = random_tokens(rows, vocab, rng);
  const Tensor wte = random_floats({vocab, C}, rng), wpe = random_floats({T, C}, rng);
  Tensor want = Tensor::empty({rows, C});
  cpu_kernels().embedding_forward(tokens.data<int32_t>(), wte.data<float>(), wpe.data<float>(), want.data<float>(),
                                  rows, T, C, vocab);
  tokens.data<int32_t>()[3] = static_cast<int32_t>(vocab);
  tokens.data<int32_t>()[8] = -1;
  Tensor scratch = Tensor::empty({rows, C});
  REQUIRE_THROWS_AS(cpu_kernels().embedding_forward(tokens.data<int32_t>(), wte.data<float>(), wpe.data<float>(),
                                                    scratch.data<float>(), rows, T, C, vocab),
                    ConfigError);
  const Tensor dtok = to_device(tokens), dwte = to_device(wte), dwpe = to_device(wpe);
  Tensor y = to_device(filled({rows, C}, 0.0f));
  gpu_kernels().embedding_forward(dtok.data<int32_t>(), dwte.data<float>(), dwpe.data<float>(), y.data<float>(), rows,
                                  T, C, vocab);
  const Tensor got = to_host(y);
  size_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float g = got.data<float>()[r * C + c], w = want.data<float>()[r * C + c];
      if (r == 3 || r == 8)
        bad += !std::isnan(g);
      else
        bad += std::memcmp(&g, &w, sizeof(float)) != 0;
    }
  REQUIRE(bad == 0);
}

// Exact: both add each element's terms onto its old value in row order (the GPU sorts the rows by token, stably,
// then adds each token's rows in order; dwpe sums b = 0, 1, ... per (t, c)). Few tokens (vocab 1 to 3) make long
// runs of one token, in which any other order would show in the last bits; the outputs start random (they
// accumulate). Two GPU runs from the same start give the same bits (no atomics).
TEST_CASE("cuda embedding_backward accumulates the CPU's sums bit for bit, repeated tokens included",
          "[gpu][kernels][gpt]") {
  const auto [rows, T, C, vocab] = GENERATE(table<int64_t, int64_t, int64_t, int64_t>(
      {{1, 1, 1, 1}, {15, 5, 7, 2}, {32, 16, 96, 50}, {4, 1, 33, 3}, {512, 64, 40, 1000}, {600, 200, 5, 3},
       {7, 3, 5, 2}}));
  CAPTURE(rows, T, C, vocab);
  std::mt19937 rng(104);
  const Tensor tokens = random_tokens(rows, vocab, rng);
  const Tensor dy = random_floats({rows, C}, rng);
  const Tensor dwte0 = random_floats({vocab, C}, rng), dwpe0 = random_floats({T, C}, rng);
  Tensor want_te = copy_to(dwte0, Device::cpu()), want_pe = copy_to(dwpe0, Device::cpu());
  cpu_kernels().embedding_backward(tokens.data<int32_t>(), dy.data<float>(), want_te.data<float>(),
                                   want_pe.data<float>(), rows, T, C, vocab);
  const Tensor dtok = to_device(tokens), ddy = to_device(dy);
  Tensor got_te[2], got_pe[2];
  for (int run = 0; run < 2; ++run) {
    Tensor te = to_device(dwte0), pe = to_device(dwpe0);
    gpu_kernels().embedding_backward(dtok.data<int32_t>(), ddy.data<float>(), te.data<float>(), pe.data<float>(), rows,
                                     T, C, vocab);
    got_te[run] = to_host(te);
    got_pe[run] = to_host(pe);
  }
  REQUIRE(bits_differ("dwte", got_te[0], want_te) == "");
  REQUIRE(bits_differ("dwpe", got_pe[0], want_pe) == "");
  REQUIRE(bits_differ("dwte, rerun", got_te[1], got_te[0]) == "");
  REQUIRE(bits_differ("dwpe, rerun", got_pe[1], got_pe[0]) == "");
}

// A token outside [0, vocab) (whose row forward made NaN) adds nothing to dwte, but its row still goes to dwpe. Multiples of
// 1/16: every sum is exact, so the expected values come from a plain loop.
TEST_CASE("cuda embedding_backward skips a negative token and one past the vocabulary in dwte, not in dwpe",
          "[gpu][kernels][gpt]") {
  const int64_t rows = 10, T = 5, C = 6, vocab = 3;
  std::mt19937 rng(105);
  Tensor tokens = random_tokens(rows, vocab, rng);
  tokens.data<int32_t>()[4] = -1;
  tokens.data<int32_t>()[7] = static_cast<int32_t>(vocab);
  const Tensor dy = sixteenths({rows, C}, rng), dwte0 = sixteenths({vocab, C}, rng), dwpe0 = sixteenths({T, C}, rng);
  Tensor want_te = copy_to(dwte0, Device::cpu()), want_pe = copy_to(dwpe0, Device::cpu());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const int32_t tok = tokens.data<int32_t>()[r];
      if (tok >= 0 && tok < vocab) want_te.data<float>()[tok * C + c] += dy.data<float>()[r * C + c];
      want_pe.data<float>()[(r % T) * C + c] += dy.data<float>()[r * C + c];
    }
  const Tensor dtok = to_device(tokens), ddy = to_device(dy);
  Tensor te = to_device(dwte0), pe = to_device(dwpe0);
  gpu_kernels().embedding_backward(dtok.data<int32_t>(), ddy.data<float>(), te.data<float>(), pe.data<float>(), rows, T,
                                   C, vocab);
  REQUIRE(bits_differ("dwte", to_host(te), want_te) == "");
  REQUIRE(bits_differ("dwpe", to_host(pe), want_pe) == "");
}

// ---- LayerNorm -----------------------------------------------------------------------------------------------

namespace {

// LayerNorm inputs: uniform in [-2, 2], except (when there are enough rows) row 0 at 1e4 + [-1, 1] (a large mean
// over a small spread: E[x^2] - E[x]^2 in float would lose everything), row 1 at 1e-6 [-1, 1] (variance far below
// eps) and row 2 constant (variance 0).
Tensor layernorm_input(int64_t rows, int64_t C, std::mt19937& rng) {
  Tensor x = random_floats({rows, C}, rng, -2.0f, 2.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* p = x.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    if (rows > 0) p[c] = 1e4f + u(rng);
    if (rows > 1) p[C + c] = 1e-6f * u(rng);
    if (rows > 2) p[2 * C + c] = 3.0f;
  }
  return x;
}

// max |x| over each row.
std::vector<double> row_max_abs(const Tensor& x, int64_t rows, int64_t C) {
  std::vector<double> m(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) m[static_cast<size_t>(r)] = std::max(m[static_cast<size_t>(r)],
                                                                         std::abs(double{x.data<float>()[r * C + c]}));
  return m;
}

}  // namespace

// Both sum in double (the GPU per lane, then over the warp; the CPU in row order) and round once to float, so mean
// and rstd almost always have the same bits; the tolerances allow a last-bit difference (2^-23 relative) and little
// more: mean within 3e-7 of the row's max |x|, rstd within 3e-7 relative. y = (x - mean) rstd gamma + beta: the GPU
// may fuse the last multiply-add, and a last-bit difference in mean moves y by gamma rstd ulp(mean); so y within
// 2e-6 of s = |gamma| rstd (|x| + |mean|) + |beta| (a few float roundings are ~3e-7 of s).
TEST_CASE("cuda layernorm_forward matches the CPU: y, mean and rstd, large-mean tiny and constant rows",
          "[gpu][kernels][gpt]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 0, 1, 3, 8, 1000);
  const int64_t C = GENERATE(as<int64_t>{}, 1, 7, 32, 33, 96, 770);
  CAPTURE(rows, C);
  const float eps = 1e-5f;
  std::mt19937 rng(106);
  const Tensor x = layernorm_input(rows, C, rng);
  const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), beta = random_floats({C}, rng);
  Tensor want_y = Tensor::empty({rows, C}), want_mean = Tensor::empty({rows}), want_rstd = Tensor::empty({rows});
  cpu_kernels().layernorm_forward(x.data<float>(), gamma.data<float>(), beta.data<float>(), want_y.data<float>(),
                                  want_mean.data<float>(), want_rstd.data<float>(), rows, C, eps);
  const Tensor dx = to_device(x), dgamma = to_device(gamma), dbeta = to_device(beta);
  Tensor y = nan_on_device({rows, C}), mean = nan_on_device({rows}), rstd = nan_on_device({rows});
  gpu_kernels().layernorm_forward(dx.data<float>(), dgamma.data<float>(), dbeta.data<float>(), y.data<float>(),
                                  mean.data<float>(), rstd.data<float>(), rows, C, eps);
  const Tensor got_y = to_host(y), got_mean = to_host(mean), got_rstd = to_host(rstd);

  const std::vector<double> xmax = row_max_abs(x, rows, C);
  const Diff dm = compare(got_mean.data<float>(), want_mean.data<float>(), got_mean.numel(), 0.0, 3e-7, xmax.data());
  INFO("mean: " << dm);
  REQUIRE(dm.bad == 0);
  const Diff ds = compare(got_rstd, want_rstd, 0.0, 3e-7);
  INFO("rstd: " << ds);
  REQUIRE(ds.bad == 0);
  std::vector<double> scale(static_cast<size_t>(rows * C));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c)
      scale[static_cast<size_t>(r * C + c)] =
          std::abs(gamma.data<float>()[c]) * want_rstd.data<float>()[r] *
              (std::abs(x.data<float>()[r * C + c]) + std::abs(want_mean.data<float>()[r])) +
          std::abs(beta.data<float>()[c]);
  const Diff dy = compare(got_y.data<float>(), want_y.data<float>(), got_y.numel(), 0.0, 2e-6, scale.data());
  INFO("y: " << dy);
  REQUIRE(dy.bad == 0);
}

// From the same saved mean and rstd (the CPU's). dx = rstd (dy gamma - mean_d - xhat mean_dx), both sets summing
// mean_d and mean_dx in double: within 2e-6 of s = rstd (|dy gamma| + |mean_d| + |xhat mean_dx|) (the GPU may fuse
// multiply-adds; a few roundings are ~3e-7 of s). dgamma and dbeta accumulate float sums over the rows, the CPU in
// row order, the GPU in per-thread strided runs then a fixed tree: within 2e-6 of |initial| + sum_r |term| (the two
// orders differ by ~1.5e-7 of that at 1000 rows, see the bias_grad test). With dy and the initial dbeta multiples of
// 1/16, dbeta is exact in any order and must match bit for bit: every row of every column counted once, also
// where the rows are cut into the most runs (40000 rows). dx may alias dy: that call must give the same dx.
TEST_CASE("cuda layernorm_backward matches the CPU: dx, and dgamma dbeta accumulated", "[gpu][kernels][gpt]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 1, 7, 257, 1000, 40000);
  const int64_t C = GENERATE(as<int64_t>{}, 1, 7, 33, 96);
  CAPTURE(rows, C);
  std::mt19937 rng(107);
  const Tensor x = layernorm_input(rows, C, rng);
  const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), beta = random_floats({C}, rng);
  Tensor y = Tensor::empty({rows, C}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  cpu_kernels().layernorm_forward(x.data<float>(), gamma.data<float>(), beta.data<float>(), y.data<float>(),
                                  mean.data<float>(), rstd.data<float>(), rows, C, 1e-5f);
  const Tensor dy = sixteenths({rows, C}, rng);
  const Tensor dgamma0 = random_floats({C}, rng), dbeta0 = sixteenths({C}, rng);

  Tensor want_dx = Tensor::empty({rows, C});
  Tensor want_dg = copy_to(dgamma0, Device::cpu()), want_db = copy_to(dbeta0, Device::cpu());
  cpu_kernels().layernorm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(), mean.data<float>(),
                                   rstd.data<float>(), want_dx.data<float>(), want_dg.data<float>(),
                                   want_db.data<float>(), rows, C);

  const Tensor d_dy = to_device(dy), d_x = to_device(x), d_gamma = to_device(gamma), d_mean = to_device(mean),
               d_rstd = to_device(rstd);
  Tensor d_dx = nan_on_device({rows, C}), d_dg = to_device(dgamma0), d_db = to_device(dbeta0);
  gpu_kernels().layernorm_backward(d_dy.data<float>(), d_x.data<float>(), d_gamma.data<float>(), d_mean.data<float>(),
                                   d_rstd.data<float>(), d_dx.data<float>(), d_dg.data<float>(), d_db.data<float>(),
                                   rows, C);
  const Tensor got_dx = to_host(d_dx), got_dg = to_host(d_dg), got_db = to_host(d_db);

  // The error scales, in double from the CPU's saved statistics.
  std::vector<double> sdx(static_cast<size_t>(rows * C)), sdg(static_cast<size_t>(C)), sdb(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    sdg[static_cast<size_t>(c)] = std::abs(dgamma0.data<float>()[c]);
    sdb[static_cast<size_t>(c)] = std::abs(dbeta0.data<float>()[c]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mean.data<float>()[r], s = rstd.data<float>()[r];
    double sum_d = 0.0, sum_dx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x.data<float>()[r * C + c] - m) * s, g = dy.data<float>()[r * C + c];
      sum_d += g * gamma.data<float>()[c];
      sum_dx += g * gamma.data<float>()[c] * xhat;
      sdg[static_cast<size_t>(c)] += std::abs(g * xhat);
      sdb[static_cast<size_t>(c)] += std::abs(g);
    }
    const double mean_d = sum_d / static_cast<double>(C), mean_dx = sum_dx / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x.data<float>()[r * C + c] - m) * s;
      sdx[static_cast<size_t>(r * C + c)] =
          s * (std::abs(dy.data<float>()[r * C + c] * gamma.data<float>()[c]) + std::abs(mean_d) +
               std::abs(xhat * mean_dx));
    }
  }
  const Diff ddx = compare(got_dx.data<float>(), want_dx.data<float>(), got_dx.numel(), 0.0, 2e-6, sdx.data());
  INFO("dx: " << ddx);
  REQUIRE(ddx.bad == 0);
  const Diff ddg = compare(got_dg.data<float>(), want_dg.data<float>(), got_dg.numel(), 0.0, 2e-6, sdg.data());
  INFO("dgamma: " << ddg);
  REQUIRE(ddg.bad == 0);
  const Diff ddb = compare(got_db.data<float>(), want_db.data<float>(), got_db.numel(), 0.0, 2e-6, sdb.data());
  INFO("dbeta: " << ddb);
  REQUIRE(ddb.bad == 0);
  REQUIRE(bits_differ("dbeta", got_db, want_db) == "");  // exact: multiples of 1/16

  // dx written over dy itself.
  Tensor in_place = to_device(dy), dg = to_device(dgamma0), db = to_device(dbeta0);
  gpu_kernels().layernorm_backward(in_place.data<float>(), d_x.data<float>(), d_gamma.data<float>(),
                                   d_mean.data<float>(), d_rstd.data<float>(), in_place.data<float>(), dg.data<float>(),
                                   db.data<float>(), rows, C);
  REQUIRE(bits_differ("dx in place over dy", to_host(in_place), got_dx) == "");
  REQUIRE(bits_differ("dgamma, dx in place", to_host(dg), got_dg) == "");
  REQUIRE(bits_differ("dbeta, dx in place", to_host(db), got_db) == "");
}

// ---- GELU ----------------------------------------------------------------------------------------------------

// The same formula (elementwise::gelu, gelu_grad) on both sides, but CUDA's tanhf (2 ulp) is not glibc's and nvcc
// fuses multiply-adds. Forward, within 1e-6 + 1e-6 |cpu|: 0.5 x (1 + tanh u) carries ~3 ulp of tanh, absolute
// (at most ~5e-7 for |x| <= 5, where 1 + tanh u cancels). Backward, within 1e-5 + 1e-5 |cpu| (|dy| <= 1):
// sech^2 = 1 - tanh^2 cancels near |tanh| = 1, an absolute error of ~2.4e-7, multiplied by 0.5 x sqrt(2/pi)
// (1 + 0.134 x^2) <= 9 for |x| <= 5. Special values: 0, +-1e-3, +-10 and +-30 (tanh rounds to +-1: exact). In place
// (y = x, dx = dy) gives the same bits as out of place.
TEST_CASE("cuda gelu_forward and gelu_backward match the CPU, also in place", "[gpu][kernels][gpt]") {
  const size_t n = GENERATE(as<size_t>{}, 0, 1, 7, 100003);
  CAPTURE(n);
  std::mt19937 rng(108);
  const auto len = static_cast<int64_t>(n);
  Tensor x = random_floats({len}, rng, -5.0f, 5.0f);
  const float special[] = {0.0f, 1e-3f, -1e-3f, 10.0f, -10.0f, 30.0f, -30.0f};
  for (size_t i = 0; i < std::min(n, std::size(special)); ++i) x.data<float>()[i] = special[i];
  const Tensor dy = random_floats({len}, rng);
  Tensor want_y = Tensor::empty({len}), want_dx = Tensor::empty({len});
  cpu_kernels().gelu_forward(x.data<float>(), want_y.data<float>(), n);
  cpu_kernels().gelu_backward(x.data<float>(), dy.data<float>(), want_dx.data<float>(), n);

  const Tensor d_x = to_device(x), d_dy = to_device(dy);
  Tensor y = nan_on_device({len}), dx = nan_on_device({len});
  gpu_kernels().gelu_forward(d_x.data<float>(), y.data<float>(), n);
  gpu_kernels().gelu_backward(d_x.data<float>(), d_dy.data<float>(), dx.data<float>(), n);
  const Tensor got_y = to_host(y), got_dx = to_host(dx);
  const Diff df = compare(got_y, want_y, 1e-6, 1e-6);
  INFO("forward: " << df);
  REQUIRE(df.bad == 0);
  const Diff db = compare(got_dx, want_dx, 1e-5, 1e-5);
  INFO("backward: " << db);
  REQUIRE(db.bad == 0);

  Tensor x_in_place = to_device(x), dy_in_place = to_device(dy);
  gpu_kernels().gelu_backward(d_x.data<float>(), dy_in_place.data<float>(), dy_in_place.data<float>(), n);
  gpu_kernels().gelu_forward(x_in_place.data<float>(), x_in_place.data<float>(), n);
  REQUIRE(bits_differ("gelu y in place", to_host(x_in_place), got_y) == "");
  REQUIRE(bits_differ("gelu dx in place", to_host(dy_in_place), got_dx) == "");
}

// ---- causal softmax ------------------------------------------------------------------------------------------

namespace {

// Scores for count matrices of rows x cols: uniform in [-8, 8], but in the first matrix row 0 spans +-1e4 (every
// exponent but the maximum's underflows) and the last row +-1e-30 (a uniform distribution). The masked part
// (j > i + cols - rows) is NaN: neither set may read it.
Tensor softmax_scores(int64_t count, int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor s = random_floats({count, rows, cols}, rng, -8.0f, 8.0f);
  float* p = s.data<float>();
  for (int64_t j = 0; j < cols; ++j) {
    p[j] *= 1250.0f;
    if (rows > 1) p[(rows - 1) * cols + j] *= 1.25e-31f;
  }
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = i + cols - rows + 1; j < cols; ++j) p[(m * rows + i) * cols + j] = kNaN;
  return s;
}

// Masked elements (j > i + cols - rows) that are not exactly +0.
size_t masked_not_zero(const Tensor& t, int64_t count, int64_t rows, int64_t cols) {
  size_t bad = 0;
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = i + cols - rows + 1; j < cols; ++j) {
        const float v = t.data<float>()[(m * rows + i) * cols + j];
        bad += v != 0.0f || std::signbit(v);
      }
  return bad;
}

}  // namespace

// The exponents scale s - max round identically on both sides (no fused multiply-add on the GPU); exp is CUDA's
// (2 ulp) against glibc's; the row sum is float over the warp against double: p within 4e-6 relative (the
// roundings add up to ~1e-6 at 200 columns), plus 1e-30 absolute for exponentials deep in the subnormal range.
// The masked part is exactly 0.
TEST_CASE("cuda causal_softmax_forward matches the CPU, square and with fewer rows than columns",
          "[gpu][kernels][gpt]") {
  const int64_t count = GENERATE(as<int64_t>{}, 1, 3);
  const auto [rows, cols] = GENERATE(table<int64_t, int64_t>(
      {{1, 1}, {1, 5}, {5, 5}, {7, 7}, {2, 9}, {33, 33}, {40, 100}, {64, 64}, {3, 200}}));
  const float scale = GENERATE(1.0f, 0.125f);
  CAPTURE(count, rows, cols, scale);
  std::mt19937 rng(109);
  const Tensor scores = softmax_scores(count, rows, cols, rng);
  Tensor want = copy_to(scores, Device::cpu());
  cpu_kernels().causal_softmax_forward(want.data<float>(), count, rows, cols, scale);
  Tensor s = to_device(scores);
  gpu_kernels().causal_softmax_forward(s.data<float>(), count, rows, cols, scale);
  const Tensor got = to_host(s);
  REQUIRE(masked_not_zero(want, count, rows, cols) == 0);
  REQUIRE(masked_not_zero(got, count, rows, cols) == 0);
  const Diff d = compare(got, want, 1e-30, 4e-6);
  INFO("softmax y: " << d);
  REQUIRE(d.bad == 0);
}

// p from the CPU's forward; dp random in [-1, 1], NaN in the masked part (not to be read). dot = sum_j p dp is a
// float sum over the warp on the GPU, double on the CPU; then scale p (dp - dot): each element within 4e-6 of
// s = |scale p| (|dp| + sum_k |p_k dp_k|) (dot's rounding is at most ~5e-7 of the sum at T = 100). T = 1 gives
// exactly 0. The masked part is exactly 0.
TEST_CASE("cuda causal_softmax_backward matches the CPU", "[gpu][kernels][gpt]") {
  const int64_t count = GENERATE(as<int64_t>{}, 1, 3);
  const int64_t T = GENERATE(as<int64_t>{}, 1, 2, 5, 33, 64, 100);
  const float scale = GENERATE(1.0f, 0.125f);
  CAPTURE(count, T, scale);
  std::mt19937 rng(110);
  Tensor p = softmax_scores(count, T, T, rng);
  cpu_kernels().causal_softmax_forward(p.data<float>(), count, T, T, scale);
  Tensor dp = random_floats({count, T, T}, rng);
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j) dp.data<float>()[(m * T + i) * T + j] = kNaN;
  Tensor want = copy_to(dp, Device::cpu());
  cpu_kernels().causal_softmax_backward(p.data<float>(), want.data<float>(), count, T, scale);
  const Tensor d_p = to_device(p);
  Tensor d_dp = to_device(dp);
  gpu_kernels().causal_softmax_backward(d_p.data<float>(), d_dp.data<float>(), count, T, scale);
  const Tensor got = to_host(d_dp);
  REQUIRE(masked_not_zero(want, count, T, T) == 0);
  REQUIRE(masked_not_zero(got, count, T, T) == 0);

  std::vector<double> es(static_cast<size_t>(count * T * T), 0.0);
  for (int64_t row = 0; row < count * T; ++row) {
    const int64_t i = row % T;
    const float* pr = p.data<float>() + row * T;
    const float* dr = dp.data<float>() + row * T;
    double dot_abs = 0.0;
    for (int64_t j = 0; j <= i; ++j) dot_abs += std::abs(double{pr[j]} * dr[j]);
    for (int64_t j = 0; j <= i; ++j)
      es[static_cast<size_t>(row * T + j)] = std::abs(double{scale} * pr[j]) * (std::abs(double{dr[j]}) + dot_abs);
  }
  const Diff d = compare(got.data<float>(), want.data<float>(), got.numel(), 0.0, 4e-6, es.data());
  INFO("softmax dx: " << d);
  REQUIRE(d.bad == 0);
  if (T == 1)
    for (int64_t m = 0; m < count; ++m) REQUIRE(got.data<float>()[m] == 0.0f);
}

// ---- determinism ---------------------------------------------------------------------------------------------

// LayerNorm's parameter gradients are reduced in a fixed order (runs of rows, then the runs in order), the row
// kernels within one warp in a fixed tree: a rerun gives the same bits.
TEST_CASE("cuda layernorm and causal softmax are bitwise deterministic", "[gpu][kernels][gpt]") {
  const int64_t rows = 3000, C = 100;
  std::mt19937 rng(111);
  const Tensor x = to_device(random_floats({rows, C}, rng)), dy = to_device(random_floats({rows, C}, rng));
  const Tensor gamma = to_device(random_floats({C}, rng)), beta = to_device(random_floats({C}, rng));
  const Tensor dg0 = random_floats({C}, rng);
  Kernels& k = gpu_kernels();
  Tensor y[2], dx[2], dg[2], db[2], mean[2], rstd[2], s[2];
  const Tensor scores = random_floats({4, 64, 64}, rng, -8.0f, 8.0f);
  for (int run = 0; run < 2; ++run) {
    y[run] = nan_on_device({rows, C});
    dx[run] = nan_on_device({rows, C});
    mean[run] = nan_on_device({rows});
    rstd[run] = nan_on_device({rows});
    dg[run] = to_device(dg0);
    db[run] = to_device(dg0);
    k.layernorm_forward(x.data<float>(), gamma.data<float>(), beta.data<float>(), y[run].data<float>(),
                        mean[run].data<float>(), rstd[run].data<float>(), rows, C, 1e-5f);
    k.layernorm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(), mean[run].data<float>(),
                         rstd[run].data<float>(), dx[run].data<float>(), dg[run].data<float>(), db[run].data<float>(),
                         rows, C);
    s[run] = to_device(scores);
    k.causal_softmax_forward(s[run].data<float>(), 4, 64, 64, 0.125f);
  }
  const char* names[] = {"y", "dx", "dgamma", "dbeta", "mean", "rstd", "softmax"};
  int which = 0;
  for (const Tensor* t : {y, dx, dg, db, mean, rstd, s})
    REQUIRE(bits_differ(fmt::format("{}, rerun", names[which++]), to_host(t[0]), to_host(t[1])) == "");
}

// ---- the whole model -----------------------------------------------------------------------------------------

// A GPT (2 layers, 3 heads of 12: C = 36, not a multiple of 32; vocabulary 101; sequences of 11 of a block of 16)
// on the CPU and the same one moved to cuda:0, from the same seed, weights 4x GPT-2's so that attention is far
// from uniform and every path carries a gradient: one forward, the mean softmax cross-entropy over every position,
// one backward. Tolerances (relative L2): logits, loss and d(loss)/d(logits) 1e-5 (cuBLAS and OpenBLAS sum in other
// orders; the other kernels are within a few float roundings: expect ~1e-6); every parameter's gradient 1e-4
// (several layers deeper; expect ~1e-6). wpe's rows past T, and wte's vocabulary padding, get no gradient on either
// side; the padding's logits are -inf on both.
TEST_CASE("a GPT moved to cuda reproduces the CPU's logits, loss and every parameter gradient", "[gpu][model][gpt]") {
  GptOptions o;
  o.n_layer = 2;
  o.n_head = 3;
  o.n_embd = 36;
  o.vocab_size = 101;
  o.block_size = 16;
  constexpr int64_t kBatch = 3, kT = 11;
  constexpr float kWeightScale = 4.0f;
  auto cpu_model = make_gpt(o);
  cpu_model->init(42);
  auto gpu_model = make_gpt(o);
  gpu_model->init(42);
  for (auto* m : {cpu_model.get(), gpu_model.get()})
    for (size_t i = 0; i < m->num_params(); ++i) m->params().data<float>()[i] *= kWeightScale;
  gpu_model->to(gpu());
  REQUIRE(gpu_model->params().device() == gpu());
  REQUIRE(&gpu_model->kernels() == &kernels_for(gpu()));

  std::mt19937 rng(112);
  const Tensor tokens = random_tokens(kBatch * kT, o.vocab_size, rng).reshape({kBatch, kT});
  const Tensor labels = random_tokens(kBatch * kT, o.vocab_size, rng);
  const Tensor d_tokens = to_device(tokens), d_labels = to_device(labels);

  cpu_model->zero_grad();
  gpu_model->zero_grad();
  const Tensor& cpu_logits = cpu_model->forward(tokens);
  const Tensor& gpu_logits = gpu_model->forward(d_tokens);
  REQUIRE(gpu_logits.device() == gpu());
  REQUIRE(gpu_logits.shape() == cpu_logits.shape());
  {
    // The vocabulary's padding columns (if the model pads it) are -inf on both: compared bit for bit, the rest
    // within the tolerance.
    const Tensor got_logits = to_host(gpu_logits);
    std::vector<float> g, w;
    size_t padding_differs = 0;
    for (size_t i = 0; i < got_logits.numel(); ++i) {
      const float gv = got_logits.data<float>()[i], wv = cpu_logits.data<float>()[i];
      if (std::isfinite(wv)) {
        g.push_back(gv);
        w.push_back(wv);
      } else {
        padding_differs += std::memcmp(&gv, &wv, sizeof(float)) != 0;
      }
    }
    REQUIRE(padding_differs == 0);
    REQUIRE(g.size() == static_cast<size_t>(kBatch * kT * o.vocab_size));
    const Diff d = compare(g.data(), w.data(), g.size());
    INFO("logits: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < 1e-5);
  }

  SoftmaxCrossEntropy cpu_loss, gpu_loss;
  const LossResult want = cpu_loss.forward_backward(cpu_logits, labels, cpu_model->kernels());
  const LossResult got = gpu_loss.forward_backward(gpu_logits, d_labels, gpu_model->kernels());
  INFO(fmt::format("loss sum: gpu {}, cpu {}", got.loss_sum, want.loss_sum));
  REQUIRE(got.count == kBatch * kT);
  REQUIRE(rel_err(got.loss_sum, want.loss_sum) < 1e-5);
  {
    const Diff d = compare(to_host(gpu_loss.grad()), cpu_loss.grad());
    INFO("dlogits: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < 1e-5);
  }

  cpu_model->backward(cpu_loss.grad());
  gpu_model->backward(gpu_loss.grad());
  const Tensor got_grads = to_host(gpu_model->grads());
  const Tensor& want_grads = cpu_model->grads();
  for (const NamedParam& np : cpu_model->named_params()) {
    const Diff d = compare(got_grads.data<float>() + np.offset, want_grads.data<float>() + np.offset,
                           np.param.numel());
    INFO(np.name << ": " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < 1e-4);
  }
}

// ---- token windows ---------------------------------------------------------------------------------------------

TEST_CASE("cuda split_token_windows gives the CPU's inputs and next tokens", "[gpu][kernels][gpt]") {
  const int64_t n = 5, T = 37;
  std::mt19937 rng(120);
  Tensor windows = Tensor::empty({n, T + 1});
  std::uniform_int_distribution<int> token(0, 65535);
  // One token in four masked as a target (-(t + 1)): the input t, the target kIgnoreLabel.
  for (size_t i = 0; i < windows.numel(); ++i) {
    const int t = token(rng);
    windows.data<float>()[i] = t % 4 == 0 ? models::elementwise::masked_window_token(t) : static_cast<float>(t);
  }
  Tensor want_in = Tensor::empty({n, T}, DType::I32), want_next = Tensor::empty({n * T}, DType::I32);
  cpu_kernels().split_token_windows(windows.data<float>(), want_in.data<int32_t>(), want_next.data<int32_t>(), n, T);
  const Tensor dw = to_device(windows);
  Tensor in = Tensor::empty({n, T}, DType::I32, dw.device()), next = Tensor::empty({n * T}, DType::I32, dw.device());
  gpu_kernels().split_token_windows(dw.data<float>(), in.data<int32_t>(), next.data<int32_t>(), n, T);
  const Tensor got_in = to_host(in), got_next = to_host(next);
  for (int64_t i = 0; i < n * T; ++i) {
    REQUIRE(got_in.data<int32_t>()[i] == want_in.data<int32_t>()[i]);
    REQUIRE(got_next.data<int32_t>()[i] == want_next.data<int32_t>()[i]);
  }
}
