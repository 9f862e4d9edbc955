// tests/unit/gpu/test_cuda_kernels.cpp: the CUDA kernel set against the CPU kernel set, operation by operation
// (gemm also in bf16 and fp16, and set_precision), on random inputs from fixed seeds and odd sizes (0 and 1 where the
// operation allows them). Outputs that a
// kernel writes (rather than accumulates into) start as NaN on the device, so an element it skips fails.
// Each test states its tolerance and why; "exact" means the same float operations in the same order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_testing.h"
#include "models/kernels/kernels.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

namespace {

Tensor doubles(std::vector<double> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// Softmax inputs whose row maxima are unique (the largest logit is 0.5 above the rest), so the argmax and the
// hit count cannot depend on rounding. Labels are the argmax in odd rows, a random class in even ones.
struct XentInputs {
  Tensor logits, labels;
};
XentInputs xent_inputs(int64_t rows, int64_t cols, std::mt19937& rng) {
  XentInputs in{random_floats({rows, cols}, rng, -4.0f, 4.0f), Tensor::empty({rows}, DType::I32)};
  std::uniform_int_distribution<int32_t> cls(0, static_cast<int32_t>(cols - 1));
  for (int64_t r = 0; r < rows; ++r) {
    float* z = in.logits.data<float>() + r * cols;
    const int32_t top = cls(rng);
    float zmax = z[0];
    for (int64_t c = 1; c < cols; ++c) zmax = std::max(zmax, z[c]);
    z[top] = zmax + 0.5f;
    in.labels.data<int32_t>()[r] = r % 2 == 1 ? top : cls(rng);
  }
  return in;
}

// The magnitude the rounding error of each element of a GEMM scales with: |alpha| sum_k |op(A)_ik op(B)_kj| +
// |beta C_ij|, with C as before the call (and not read when beta is 0). Row-major [M, N], compact.
std::vector<double> gemm_error_scale(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
                                     int64_t lda, const Tensor& B, int64_t ldb, float beta, const Tensor& C,
                                     int64_t ldc) {
  std::vector<double> scale(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < K; ++p) {
        const float a = ta ? A.data<float>()[p * lda + i] : A.data<float>()[i * lda + p];
        const float b = tb ? B.data<float>()[j * ldb + p] : B.data<float>()[p * ldb + j];
        s += std::abs(static_cast<double>(a) * b);
      }
      s *= std::abs(alpha);
      if (beta != 0.0f) s += std::abs(beta * static_cast<double>(C.data<float>()[i * ldc + j]));
      scale[static_cast<size_t>(i * N + j)] = s;
    }
  return scale;
}

}  // namespace

// ---- gemm ----------------------------------------------------------------------------------------------------

// Tolerance: each element within 1e-5 of the magnitude its rounding error scales with,
// s = |alpha| sum_k |op(A)_ik op(B)_kj| + |beta C_ij| (K = 130 float products accumulate at most ~K * 2^-24 = 8e-6
// of s, and in practice ~sqrt(K) * 2^-24); and, over the matrix, ||gpu - cpu|| / ||cpu|| < 1e-5. The relative
// norm is skipped for a 1x1 result, where one cancelling sum makes ||cpu|| arbitrarily small. cuBLAS runs
// in its default mode, FP32 without TF32 (a TF32 product would be ~1e-3 off: this bound catches it), so it rounds
// like any FP32 BLAS, in another order.
TEST_CASE("cuda gemm matches the CPU gemm for all transposes and odd shapes, alpha and beta not 0 or 1",
          "[gpu][kernels]") {
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const int64_t M = GENERATE(as<int64_t>{}, 1, 7, 33, 130);
  const int64_t N = GENERATE(as<int64_t>{}, 1, 7, 33, 130);
  const int64_t K = GENERATE(as<int64_t>{}, 1, 7, 33, 130);
  CAPTURE(ta, tb, M, N, K);
  std::mt19937 rng(1);
  // Row-major: op(A) is [M, K], so A is stored [M, K] (lda = K) or, transposed, [K, M] (lda = M); B likewise.
  const Tensor A = ta ? random_floats({K, M}, rng) : random_floats({M, K}, rng);
  const Tensor B = tb ? random_floats({N, K}, rng) : random_floats({K, N}, rng);
  const Tensor C = random_floats({M, N}, rng);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  const float alpha = 0.7f, beta = 0.3f;

  Tensor want = copy_to(C, Device::cpu());
  cpu_kernels().gemm(ta, tb, M, N, K, alpha, A.data<float>(), lda, B.data<float>(), ldb, beta, want.data<float>(), ldc);
  const Tensor dA = to_device(A), dB = to_device(B);
  Tensor dC = to_device(C);
  gpu_kernels().gemm(ta, tb, M, N, K, alpha, dA.data<float>(), lda, dB.data<float>(), ldb, beta, dC.data<float>(), ldc);
  const Tensor got = to_host(dC);

  const std::vector<double> scale = gemm_error_scale(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const Diff d = compare(got.data<float>(), want.data<float>(), got.numel(), 0.0, 1e-5, scale.data());
  INFO("C: " << d);
  REQUIRE(d.nonfinite == 0);
  REQUIRE(d.bad == 0);
  if (M * N > 1) REQUIRE(d.rel_l2 < 1e-5);
}

// Row strides longer than the rows (a sub-matrix of a wider buffer): the padding of C must stay untouched, and
// beta = 0 must not read C (it starts as NaN: BLAS semantics, which the layers rely on for fresh buffers).
TEST_CASE("cuda gemm honours lda/ldb/ldc longer than the rows, and beta = 0 ignores C", "[gpu][kernels]") {
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const float beta = GENERATE(0.0f, 0.3f);
  CAPTURE(ta, tb, beta);
  const int64_t M = 7, N = 33, K = 130;
  const int64_t lda = (ta ? M : K) + 5, ldb = (tb ? K : N) + 3, ldc = N + 2;
  std::mt19937 rng(2);
  const Tensor A = random_floats({ta ? K : M, lda}, rng);
  const Tensor B = random_floats({tb ? N : K, ldb}, rng);
  Tensor C = random_floats({M, ldc}, rng);
  constexpr float kPad = 12345.0f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j)
      if (j >= N) C.data<float>()[i * ldc + j] = kPad;
      else if (beta == 0.0f) C.data<float>()[i * ldc + j] = nan;

  Tensor want = copy_to(C, Device::cpu());
  cpu_kernels().gemm(ta, tb, M, N, K, 0.7f, A.data<float>(), lda, B.data<float>(), ldb, beta, want.data<float>(), ldc);
  const Tensor dA = to_device(A), dB = to_device(B);
  Tensor dC = to_device(C);
  gpu_kernels().gemm(ta, tb, M, N, K, 0.7f, dA.data<float>(), lda, dB.data<float>(), ldb, beta, dC.data<float>(), ldc);
  const Tensor got = to_host(dC);

  size_t pad_changed = 0;
  std::vector<float> g, w;  // the M x N result, without the padding
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const float x = got.data<float>()[i * ldc + j];
      if (j >= N) {
        pad_changed += x != kPad;
      } else {
        g.push_back(x);
        w.push_back(want.data<float>()[i * ldc + j]);
      }
    }
  REQUIRE(pad_changed == 0);
  // Tolerances as in the test above.
  const std::vector<double> scale = gemm_error_scale(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, beta, C, ldc);
  const Diff d = compare(g.data(), w.data(), g.size(), 0.0, 1e-5, scale.data());
  INFO("C: " << d);
  REQUIRE(d.nonfinite == 0);
  REQUIRE(d.bad == 0);
  REQUIRE(d.rel_l2 < 1e-5);
}

TEST_CASE("cuda gemm with M = 0 or N = 0 is a no-op", "[gpu][kernels]") {
  const Tensor A = to_device(filled({4}, 1.0f)), B = to_device(filled({4}, 1.0f));
  Tensor C = to_device(filled({4}, 5.0f));
  gpu_kernels().gemm(false, false, 0, 2, 2, 1.0f, A.data<float>(), 2, B.data<float>(), 2, 0.0f, C.data<float>(), 2);
  gpu_kernels().gemm(false, false, 2, 0, 2, 1.0f, A.data<float>(), 2, B.data<float>(), 1, 0.0f, C.data<float>(), 1);
  const Diff d = compare(to_host(C), filled({4}, 5.0f));
  INFO("C: " << d);
  REQUIRE(d.bad == 0);
}

// ---- gemm in bf16 and fp16 -----------------------------------------------------------------------------------

// Both sets round A and B to the narrow type (to nearest even) and accumulate in float32; C stays float32 (no
// output rounding). A product of two bf16 (8 significant bits) or two fp16 (11 bits) values is exact in float32,
// so the two sets differ only by the float32 summation order (tensor cores on the GPU). Tolerance: each element
// within 1e-4 of s = |alpha| sum_k |op(A)_ik op(B)_kj| + |beta C_ij| (K <= 130 float32 additions are off by at most
// ~K 2^-24 = 8e-6 of s; the factor 10 leaves room for the tensor cores' accumulation), and
// ||gpu - cpu|| / ||cpu|| < 1e-4. That the operands were rounded at all shows against the float32 product:
// rounding each operand moves a result of many terms by about 0.6 u relative (u the unit roundoff: 2^-8 for bf16,
// 2^-11 for fp16), so where K >= 33, ||gpu - fp32|| / ||fp32|| must exceed u / 8 (float32 operands, or a lost
// rounding, would stay near 1e-7). Strides longer than the rows (padded) check the packing of the rounded copies;
// the padding of C must stay untouched.
TEST_CASE("cuda gemm in bf16 and fp16 matches the CPU gemm in the same precision", "[gpu][kernels]") {
  const Precision p = GENERATE(Precision::BF16, Precision::F16);
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const auto [M, N, K] = GENERATE(table<int64_t, int64_t, int64_t>(
      {{1, 1, 1}, {7, 33, 130}, {130, 7, 33}, {33, 130, 7}, {1, 130, 33}, {130, 130, 130}}));
  const bool padded = GENERATE(false, true);
  CAPTURE(precision_name(p), ta, tb, M, N, K, padded);
  const int64_t pad = padded ? 3 : 0;
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  std::mt19937 rng(3);
  const Tensor A = random_floats({ta ? K : M, lda}, rng);
  const Tensor B = random_floats({tb ? N : K, ldb}, rng);
  const Tensor C = random_floats({M, ldc}, rng);
  const float alpha = 0.7f, beta = 0.3f;

  Tensor want32 = copy_to(C, Device::cpu());
  cpu_kernels().gemm(ta, tb, M, N, K, alpha, A.data<float>(), lda, B.data<float>(), ldb, beta, want32.data<float>(),
                     ldc);
  Tensor want = copy_to(C, Device::cpu());
  Tensor got;
  {
    const ScopedPrecision scope(p);
    cpu_kernels().gemm(ta, tb, M, N, K, alpha, A.data<float>(), lda, B.data<float>(), ldb, beta, want.data<float>(),
                       ldc);
    const Tensor dA = to_device(A), dB = to_device(B);
    Tensor dC = to_device(C);
    gpu_kernels().gemm(ta, tb, M, N, K, alpha, dA.data<float>(), lda, dB.data<float>(), ldb, beta, dC.data<float>(),
                       ldc);
    got = to_host(dC);
  }

  size_t pad_changed = 0;
  std::vector<float> g, w, w32;  // the M x N results, without the padding
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t at = i * ldc + j;
      if (j >= N) {
        pad_changed += std::memcmp(got.data<float>() + at, C.data<float>() + at, sizeof(float)) != 0;
      } else {
        g.push_back(got.data<float>()[at]);
        w.push_back(want.data<float>()[at]);
        w32.push_back(want32.data<float>()[at]);
      }
    }
  REQUIRE(pad_changed == 0);
  const std::vector<double> scale = gemm_error_scale(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const Diff d = compare(g.data(), w.data(), g.size(), 0.0, 1e-4, scale.data());
  INFO("C: " << d);
  REQUIRE(d.nonfinite == 0);
  REQUIRE(d.bad == 0);
  if (M * N > 1) REQUIRE(d.rel_l2 < 1e-4);
  if (M * N > 1 && K >= 33) {
    const Diff d32 = compare(g.data(), w32.data(), g.size());
    INFO("against the float32 product: " << d32);
    REQUIRE(d32.rel_l2 > unit_roundoff(p) / 8);
  }
}

// The precision is the kernel set's state: it reads back as set, an invalid value is refused, and after a bf16 and
// an fp16 GEMM (which take the 16-bit path) F32 is float32 again: within the fp32
// test's 1e-5 of s and 1e-5 relative L2 of the CPU's float32 product (a 16-bit or TF32 product would be ~1e-3 off).
TEST_CASE("cuda set_precision round trip: it reads back, and F32 after bf16 and fp16 is float32 again",
          "[gpu][kernels]") {
  Kernels& k = gpu_kernels();
  REQUIRE(k.precision() == Precision::F32);
  for (const Precision p : {Precision::BF16, Precision::F16, Precision::BF16, Precision::F32, Precision::F16,
                            Precision::F16, Precision::F32, Precision::F32}) {
    k.set_precision(p);
    REQUIRE(k.precision() == p);
  }
  REQUIRE_THROWS_AS(k.set_precision(static_cast<Precision>(7)), InternalError);
  REQUIRE(k.precision() == Precision::F32);

  const int64_t M = 33, N = 130, K = 130;
  std::mt19937 rng(4);
  const Tensor A = random_floats({M, K}, rng), B = random_floats({K, N}, rng), C = random_floats({M, N}, rng);
  const Tensor dA = to_device(A), dB = to_device(B);
  for (const Precision p : {Precision::BF16, Precision::F16}) {
    const ScopedPrecision scope(p);
    Tensor dC = to_device(C);
    k.gemm(false, false, M, N, K, 1.0f, dA.data<float>(), K, dB.data<float>(), N, 0.5f, dC.data<float>(), N);
    REQUIRE(k.precision() == p);
  }
  REQUIRE(k.precision() == Precision::F32);
  REQUIRE(cpu_kernels().precision() == Precision::F32);
  Tensor want = copy_to(C, Device::cpu());
  cpu_kernels().gemm(false, false, M, N, K, 1.0f, A.data<float>(), K, B.data<float>(), N, 0.5f, want.data<float>(), N);
  Tensor dC = to_device(C);
  k.gemm(false, false, M, N, K, 1.0f, dA.data<float>(), K, dB.data<float>(), N, 0.5f, dC.data<float>(), N);
  const Tensor got = to_host(dC);
  const std::vector<double> scale = gemm_error_scale(false, false, M, N, K, 1.0f, A, K, B, N, 0.5f, C, N);
  const Diff d = compare(got.data<float>(), want.data<float>(), got.numel(), 0.0, 1e-5, scale.data());
  INFO("C: " << d);
  REQUIRE(d.bad == 0);
  REQUIRE(d.rel_l2 < 1e-5);
}

// ---- bias_act, bias_grad_accumulate, relu_backward -----------------------------------------------------------

// Exact: one float addition and one comparison per element, the same code (elementwise::bias_act) on both sides.
TEST_CASE("cuda bias_act matches the CPU exactly, with and without relu, out of place and in place", "[gpu][kernels]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 0, 1, 7, 64, 129);
  const int64_t cols = GENERATE(as<int64_t>{}, 1, 7, 64, 129);
  const bool relu = GENERATE(false, true);
  CAPTURE(rows, cols, relu);
  std::mt19937 rng(3);
  const Tensor x = random_floats({rows, cols}, rng), bias = random_floats({cols}, rng);
  Tensor want = Tensor::empty({rows, cols});
  cpu_kernels().bias_act(x.data<float>(), bias.data<float>(), want.data<float>(), rows, cols, relu);
  Tensor dx = to_device(x);
  const Tensor dbias = to_device(bias);

  SECTION("out of place, into a NaN-filled output") {
    Tensor dy = nan_on_device({rows, cols});
    gpu_kernels().bias_act(dx.data<float>(), dbias.data<float>(), dy.data<float>(), rows, cols, relu);
    const Diff d = compare(to_host(dy), want);
    INFO("y: " << d);
    REQUIRE(d.bad == 0);
    // The input is untouched.
    REQUIRE(named_diff("x, the input left unchanged", compare(to_host(dx), x)) == "");
  }
  SECTION("in place (x == y)") {
    gpu_kernels().bias_act(dx.data<float>(), dbias.data<float>(), dx.data<float>(), rows, cols, relu);
    const Diff d = compare(to_host(dx), want);
    INFO("y (in place over x): " << d);
    REQUIRE(d.bad == 0);
  }
}

// db[c] += sum_r dy[r, c]. The GPU sums each column in 32 row-strided partials, then the partials; the CPU row
// by row. Random floats: within 1e-6 of s_c = |db[c]| + sum_r |dy[r, c]|, the magnitude a float sum's rounding
// error scales with (it is ~2^-24 * sqrt(rows) of the largest partial sum; the two orders differ by ~1.5e-7 of
// s_c at 1000 rows). Multiples of 1/16: every partial sum is exact, so the two must agree bit for bit, which
// also shows that every row of every column is counted exactly once.
TEST_CASE("cuda bias_grad_accumulate adds the column sums into db like the CPU", "[gpu][kernels]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 0, 1, 7, 33, 1000);
  const int64_t cols = GENERATE(as<int64_t>{}, 1, 31, 33, 512);
  CAPTURE(rows, cols);
  std::mt19937 rng(4);

  SECTION("random floats, accumulating into a nonzero db") {
    const Tensor dy = random_floats({rows, cols}, rng), db0 = random_floats({cols}, rng);
    Tensor want = copy_to(db0, Device::cpu());
    cpu_kernels().bias_grad_accumulate(dy.data<float>(), want.data<float>(), rows, cols);
    const Tensor ddy = to_device(dy);
    Tensor ddb = to_device(db0);
    gpu_kernels().bias_grad_accumulate(ddy.data<float>(), ddb.data<float>(), rows, cols);
    std::vector<double> scale(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      double s = std::abs(db0.data<float>()[c]);
      for (int64_t r = 0; r < rows; ++r) s += std::abs(dy.data<float>()[r * cols + c]);
      scale[static_cast<size_t>(c)] = s;
    }
    const Tensor got = to_host(ddb);
    const Diff d = compare(got.data<float>(), want.data<float>(), got.numel(), 0.0, 1e-6, scale.data());
    INFO("db: " << d);
    REQUIRE(d.bad == 0);
  }
  SECTION("multiples of 1/16: exact in any order") {
    const Tensor dy = sixteenths({rows, cols}, rng), db0 = sixteenths({cols}, rng);
    Tensor want = copy_to(db0, Device::cpu());
    cpu_kernels().bias_grad_accumulate(dy.data<float>(), want.data<float>(), rows, cols);
    const Tensor ddy = to_device(dy);
    Tensor ddb = to_device(db0);
    gpu_kernels().bias_grad_accumulate(ddy.data<float>(), ddb.data<float>(), rows, cols);
    const Diff d = compare(to_host(ddb), want);
    INFO("db: " << d);
    REQUIRE(d.bad == 0);
  }
}

// Exact: a comparison and a select per element. Every fifth y is exactly 0 (the boundary: y > 0 is false).
TEST_CASE("cuda relu_backward matches the CPU exactly, also with dx aliasing dy", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 0, 1, 7, 1000, 100003);
  CAPTURE(n);
  std::mt19937 rng(5);
  const auto len = static_cast<int64_t>(n);
  Tensor y = random_floats({len}, rng);
  for (size_t i = 0; i < n; i += 5) y.data<float>()[i] = 0.0f;
  const Tensor dy = random_floats({len}, rng);
  Tensor want = Tensor::empty({len});
  cpu_kernels().relu_backward(y.data<float>(), dy.data<float>(), want.data<float>(), n);
  const Tensor dev_y = to_device(y);
  Tensor dev_dy = to_device(dy);

  SECTION("into a NaN-filled dx") {
    Tensor dx = nan_on_device({len});
    gpu_kernels().relu_backward(dev_y.data<float>(), dev_dy.data<float>(), dx.data<float>(), n);
    const Diff d = compare(to_host(dx), want);
    INFO("dx: " << d);
    REQUIRE(d.bad == 0);
  }
  SECTION("in place: dx == dy") {
    gpu_kernels().relu_backward(dev_y.data<float>(), dev_dy.data<float>(), dev_dy.data<float>(), n);
    const Diff d = compare(to_host(dev_dy), want);
    INFO("dx (in place over dy): " << d);
    REQUIRE(d.bad == 0);
  }
}

// ---- softmax cross-entropy -----------------------------------------------------------------------------------

// The GPU computes each row's loss in float (one warp per row), the CPU in double; the batch sums are doubles on
// both. Tolerances: the loss sum within 1e-5 relative (a row's float loss is off by ~1e-6 at most, against a
// sum >= the starting 1.5); the hit count exactly (unique maxima, see xent_inputs); dlogits within 1e-6
// absolute (p = exp(z - max - log_sum) carries log_sum's float error, a few 1e-7 relative; |dlogit| <= 1).
// stats start at {1.5, 2}: the kernel must add to them, not overwrite them.
TEST_CASE("cuda softmax_xent matches the CPU: loss sum, hits, dlogits, stats accumulate", "[gpu][kernels]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 0, 1, 7, 64, 1000);
  const int64_t cols = GENERATE(as<int64_t>{}, 1, 10, 33, 100);
  const bool with_grad = GENERATE(false, true);
  CAPTURE(rows, cols, with_grad);
  std::mt19937 rng(6);
  XentInputs in = xent_inputs(rows, cols, rng);
  if (rows > 2) in.labels.data<int32_t>()[2] = kIgnoreLabel;  // an even row (not one of the hits): skipped
  const Tensor stats0 = doubles({1.5, 2.0});

  Tensor want_stats = copy_to(stats0, Device::cpu());
  Tensor want_d = Tensor::empty({rows, cols});
  cpu_kernels().softmax_xent(in.logits.data<float>(), in.labels.data<int32_t>(),
                             with_grad ? want_d.data<float>() : nullptr, rows, cols, want_stats.data<double>());

  const Tensor logits = to_device(in.logits), labels = to_device(in.labels);
  Tensor stats = to_device(stats0);
  Tensor dlogits = nan_on_device({rows, cols});
  gpu_kernels().softmax_xent(logits.data<float>(), labels.data<int32_t>(), with_grad ? dlogits.data<float>() : nullptr,
                             rows, cols, stats.data<double>());
  const Tensor got_stats = to_host(stats);
  const double* got = got_stats.data<double>();
  const double* want = want_stats.data<double>();
  INFO(fmt::format("loss sum + 1.5: gpu {}, cpu {}; hits + 2: gpu {}, cpu {}", got[0], want[0], got[1], want[1]));
  REQUIRE(rel_err(got[0], want[0]) < 1e-5);
  REQUIRE(want[1] >= 2.0 + static_cast<double>(rows / 2));  // the odd rows are hits by construction
  REQUIRE(got[1] == want[1]);
  if (with_grad) {
    const Diff d = compare(to_host(dlogits), want_d, 1e-6);
    INFO("dlogits: " << d);
    REQUIRE(d.bad == 0);
  }
}

TEST_CASE("cuda count_targets counts the labels that are not kIgnoreLabel, as the CPU", "[gpu][kernels]") {
  const int64_t n = GENERATE(as<int64_t>{}, 0, 1, 255, 256, 257, 100003);
  CAPTURE(n);
  std::mt19937 rng(9);
  Tensor labels = Tensor::empty({n}, DType::I32);
  std::uniform_int_distribution<int32_t> lab(-1, 5);  // one in seven ignored
  for (int64_t i = 0; i < n; ++i) labels.data<int32_t>()[i] = lab(rng);
  Tensor want = doubles({2.5});
  cpu_kernels().count_targets(labels.data<int32_t>(), n, want.data<double>());
  const Tensor d = to_device(labels);
  Tensor got = to_device(doubles({2.5}));
  gpu_kernels().count_targets(d.data<int32_t>(), n, got.data<double>());
  REQUIRE(to_host(got).data<double>()[0] == want.data<double>()[0]);
}

TEST_CASE("cuda softmax_xent: a label out of range makes the loss NaN (the CPU throws)", "[gpu][kernels]") {
  const int32_t bad_label = GENERATE(-2, 10, 1000);  // -1 is kIgnoreLabel
  CAPTURE(bad_label);
  const int64_t rows = 7, cols = 10;
  std::mt19937 rng(7);
  XentInputs in = xent_inputs(rows, cols, rng);
  in.labels.data<int32_t>()[3] = bad_label;

  Tensor host_stats = doubles({1.5, 2.0});
  REQUIRE_THROWS_AS(cpu_kernels().softmax_xent(in.logits.data<float>(), in.labels.data<int32_t>(), nullptr, rows, cols,
                                               host_stats.data<double>()),
                    InternalError);

  const Tensor logits = to_device(in.logits), labels = to_device(in.labels);
  Tensor stats = to_device(doubles({1.5, 2.0}));
  Tensor dlogits = nan_on_device({rows, cols});
  gpu_kernels().softmax_xent(logits.data<float>(), labels.data<int32_t>(), dlogits.data<float>(), rows, cols,
                             stats.data<double>());
  const Tensor got = to_host(stats);
  INFO(fmt::format("stats: {}, {}", got.data<double>()[0], got.data<double>()[1]));
  REQUIRE(std::isnan(got.data<double>()[0]));
}

// ---- optimizer updates ---------------------------------------------------------------------------------------

// The per-element arithmetic is shared (elementwise.h), but nvcc contracts a * b + c into one fused multiply-add
// and g++ (x86-64, no -mfma) does not, so the two differ by a few roundings of values of magnitude <= ~4.
// Tolerance: |gpu - cpu| <= 1e-6 + 1e-6 * |cpu| for parameters and momentum buffers, after each of 3 steps.
TEST_CASE("cuda sgd_update matches the CPU: momentum 0 and 0.9, nesterov, weight decay, first step", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 1, 1000, 100003);
  const float momentum = GENERATE(0.0f, 0.9f);
  const bool nesterov = GENERATE(false, true);
  const float weight_decay = GENERATE(0.0f, 1e-2f);
  const bool first_step = GENERATE(true, false);
  CAPTURE(n, momentum, nesterov, weight_decay, first_step);
  std::mt19937 rng(8);
  const auto len = static_cast<int64_t>(n);
  Tensor param = random_floats({len}, rng), buf = random_floats({len}, rng);  // buf matters unless first_step
  Tensor dparam = to_device(param), dbuf = to_device(buf);
  float* hb = momentum != 0.0f ? buf.data<float>() : nullptr;  // no momentum: no buffer at all
  float* db = momentum != 0.0f ? dbuf.data<float>() : nullptr;
  SgdParams sp{.lr = 0.1f, .momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov,
               .first_step = first_step};
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const Tensor grad = random_floats({len}, rng);
    const Tensor dgrad = to_device(grad);
    cpu_kernels().sgd_update(param.data<float>(), grad.data<float>(), hb, n, sp);
    gpu_kernels().sgd_update(dparam.data<float>(), dgrad.data<float>(), db, n, sp);
    const Diff dp = compare(to_host(dparam), param, 1e-6, 1e-6);
    INFO("param: " << dp);
    REQUIRE(dp.bad == 0);
    if (momentum != 0.0f) {
      const Diff dm = compare(to_host(dbuf), buf, 1e-6, 1e-6);
      INFO("momentum buffer: " << dm);
      REQUIRE(dm.bad == 0);
    }
    sp.first_step = false;
  }
}

// Ten steps, so the bias corrections change (step 1: m / sqrt(v) is sign(g); step 10: a mix). Tolerance as for
// SGD (fused multiply-adds on the GPU): parameters and m within 1e-6 + 1e-6 |cpu|; v (a sum of squares, no
// cancellation) within 1e-5 relative.
TEST_CASE("cuda adamw_update matches the CPU from step 1 to step 10", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 1, 1000, 100003);
  CAPTURE(n);
  std::mt19937 rng(9);
  const auto len = static_cast<int64_t>(n);
  Tensor param = random_floats({len}, rng), m = filled({len}, 0.0f), v = filled({len}, 0.0f);
  Tensor dparam = to_device(param), dm = to_device(m), dv = to_device(v);
  AdamWParams ap{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  for (int64_t step = 1; step <= 10; ++step) {
    CAPTURE(step);
    ap.step = step;
    const Tensor grad = random_floats({len}, rng);
    const Tensor dgrad = to_device(grad);
    cpu_kernels().adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), n, ap);
    gpu_kernels().adamw_update(dparam.data<float>(), dgrad.data<float>(), dm.data<float>(), dv.data<float>(), n, ap);
    const Diff d_param = compare(to_host(dparam), param, 1e-6, 1e-6);
    const Diff d_m = compare(to_host(dm), m, 1e-6, 1e-6);
    const Diff d_v = compare(to_host(dv), v, 0.0, 1e-5);
    INFO("param: " << d_param << "\nm: " << d_m << "\nv: " << d_v);
    REQUIRE(d_param.bad == 0);
    REQUIRE(d_m.bad == 0);
    REQUIRE(d_v.bad == 0);
  }
}

// ---- scale, sum_squares --------------------------------------------------------------------------------------

TEST_CASE("cuda scale matches the CPU exactly (one rounded product per element)", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 0, 1, 1000, (1u << 20) + 3);
  CAPTURE(n);
  std::mt19937 rng(10);
  const Tensor x = random_floats({static_cast<int64_t>(n)}, rng);
  Tensor want = copy_to(x, Device::cpu());
  cpu_kernels().scale(want.data<float>(), n, 0.37f);
  Tensor dx = to_device(x);
  gpu_kernels().scale(dx.data<float>(), n, 0.37f);
  const Diff d = compare(to_host(dx), want);
  INFO("x scaled in place: " << d);
  REQUIRE(d.bad == 0);
}

// Both accumulate exact double products (a float squared fits in a double); only the order of the additions
// differs: the GPU sums 65536 short strided runs, then trees (nearly exact), the CPU sequentially, which drifts
// (a sum of positive terms rounded ~2^20 times: 6e-13 relative for these 2^20 + 3 values, measured against a
// long-double sum). 1e-12 would pass by a factor of only 1.7, so the tolerance is 1e-9: above the proven bound
// for sequential summation, (n - 1) * 2^-53 = 1.2e-10 relative, so ordering can never fail it. Values that are
// all 0.5 make every partial sum exact: then the result must be n / 4 exactly, whatever the order, which
// catches a lost or doubled element however small the tolerance above would let it be.
TEST_CASE("cuda sum_squares_to and clip_by_norm match the CPU with no host synchronisation", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 1, 1000, (1u << 20) + 3);
  const double max_norm = GENERATE(0.5, 1e9);  // clips, and does not
  CAPTURE(n, max_norm);
  std::mt19937 rng(12);
  const auto len = static_cast<int64_t>(n);
  Tensor want = random_floats({len}, rng);
  const Tensor dx0 = to_device(want);
  Tensor dx = to_device(want);
  double want_ss = 0;
  cpu_kernels().sum_squares_to(want.data<float>(), n, &want_ss);
  cpu_kernels().clip_by_norm(want.data<float>(), n, &want_ss, max_norm);
  Tensor ss = Tensor::zeros({1}, DType::F64, dx.device());
  gpu_kernels().sum_squares_to(dx.data<float>(), n, ss.data<double>());
  gpu_kernels().clip_by_norm(dx.data<float>(), n, ss.data<double>(), max_norm);
  const double got_ss = to_host(ss).data<double>()[0];
  REQUIRE(rel_err(got_ss, want_ss) < 1e-9);
  REQUIRE(got_ss == gpu_kernels().sum_squares(dx0.data<float>(), n));  // the same reduction as sum_squares
  const Tensor got = to_host(dx);
  for (size_t i = 0; i < n; ++i) REQUIRE(got.data<float>()[i] == Approx(want.data<float>()[i]).epsilon(1e-6));
}

TEST_CASE("cuda sum_squares matches the CPU and returns (not accumulates) the sum", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 0, 1, 1000, (1u << 20) + 3);
  CAPTURE(n);
  std::mt19937 rng(11);
  const auto len = static_cast<int64_t>(n);
  const Tensor x = random_floats({len}, rng);
  const double want = cpu_kernels().sum_squares(x.data<float>(), n);
  const Tensor dx = to_device(x);
  const double got = gpu_kernels().sum_squares(dx.data<float>(), n);
  INFO(fmt::format("gpu {}, cpu {}, relative difference {}", got, want, rel_err(got, want)));
  if (n == 0) {
    REQUIRE(got == 0.0);
    REQUIRE(want == 0.0);
  } else {
    REQUIRE(rel_err(got, want) < 1e-9);
  }
  REQUIRE(gpu_kernels().sum_squares(dx.data<float>(), n) == got);  // a second call: the same, not twice

  const Tensor halves = to_device(filled({len}, 0.5f));
  REQUIRE(gpu_kernels().sum_squares(halves.data<float>(), n) == 0.25 * static_cast<double>(n));
}

// ---- determinism ---------------------------------------------------------------------------------------------

// The loss statistics and the bias gradients are reduced in a fixed order, without atomics, so a rerun on the
// same inputs gives the same bits (what makes two ranks, or two runs, agree).
TEST_CASE("cuda softmax_xent, bias_grad_accumulate and sum_squares are bitwise deterministic", "[gpu][kernels]") {
  std::mt19937 rng(12);
  Kernels& k = gpu_kernels();

  const int64_t rows = 1000, cols = 100;
  const XentInputs in = xent_inputs(rows, cols, rng);
  const Tensor logits = to_device(in.logits), labels = to_device(in.labels);
  Tensor stats[2], dlogits[2];
  for (int run = 0; run < 2; ++run) {
    stats[run] = to_device(doubles({1.5, 2.0}));
    dlogits[run] = nan_on_device({rows, cols});
    k.softmax_xent(logits.data<float>(), labels.data<int32_t>(), dlogits[run].data<float>(), rows, cols,
                   stats[run].data<double>());
  }
  const Tensor s0 = to_host(stats[0]), s1 = to_host(stats[1]);
  REQUIRE(bits_differ("softmax_xent stats, rerun", s0, s1) == "");
  const Tensor d0 = to_host(dlogits[0]), d1 = to_host(dlogits[1]);
  REQUIRE(bits_differ("softmax_xent dlogits, rerun", d0, d1) == "");

  const int64_t grad_rows = 1000, grad_cols = 512;
  const Tensor dy = to_device(random_floats({grad_rows, grad_cols}, rng));
  const Tensor db0 = random_floats({grad_cols}, rng);
  Tensor db[2] = {to_device(db0), to_device(db0)};
  for (Tensor& t : db) k.bias_grad_accumulate(dy.data<float>(), t.data<float>(), grad_rows, grad_cols);
  const Tensor b0 = to_host(db[0]), b1 = to_host(db[1]);
  REQUIRE(bits_differ("bias gradient, rerun", b0, b1) == "");

  const Tensor x = to_device(random_floats({(1 << 20) + 3}, rng));
  const double first = k.sum_squares(x.data<float>(), x.numel());
  REQUIRE(k.sum_squares(x.data<float>(), x.numel()) == first);
}
