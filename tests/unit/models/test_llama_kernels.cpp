// tests/unit/models/test_llama_kernels.cpp: the Llama family's kernels on the CPU set (issue 35), the reference the
// CUDA set is tested against (tests/unit/gpu/test_llama_kernels.cpp): RMSNorm forward against its formula in double
// and backward (dx and dgamma) against central finite differences; SwiGLU's gradients against finite differences;
// the rotary embedding against complex multiplication in double, its inverse undoing it, a fused qkv row's other
// heads untouched, positions from pos0 + row mod T; RoPE's inverse frequencies and Llama 3's scaling against their
// closed forms.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include "core/check.h"
#include "models/kernels/elementwise.h"
#include "models/kernels/factory.h"
#include "models/rope.h"

using namespace dpt;
using namespace dpt::models;

namespace {

Kernels& cpu() { return kernels_for(Device::cpu()); }

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// L = sum(w * y(x)) for a fixed random w: dL/dx by central differences in double, step h.
template <class F>
double numeric(std::vector<float>& x, size_t i, double h, F&& loss) {
  const float keep = x[i];
  x[i] = static_cast<float>(keep + h);
  const double up = loss();
  x[i] = static_cast<float>(keep - h);
  const double down = loss();
  x[i] = keep;
  return (up - down) / (2 * h);
}

}  // namespace

TEST_CASE("RMSNorm forward is x * rstd * gamma, backward matches finite differences", "[models][llama]") {
  std::mt19937 rng(11);
  const int64_t rows = 5, C = 24;
  std::vector<float> x = random_vec(rows * C, rng, -2, 2), gamma = random_vec(C, rng, 0.5f, 1.5f);
  const std::vector<float> w = random_vec(rows * C, rng);
  std::vector<float> y(rows * C, NAN), rstd(rows, NAN);
  cpu().rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), rows, C, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[r * C + c]) * x[r * C + c];
    const double s = 1.0 / std::sqrt(ss / C + 1e-5);
    CHECK(rstd[r] == Approx(s).epsilon(1e-6));
    for (int64_t c = 0; c < C; ++c) CHECK(y[r * C + c] == Approx(x[r * C + c] * s * gamma[c]).epsilon(1e-5));
  }
  auto loss = [&] {
    std::vector<float> yy(rows * C), rs(rows);
    cpu().rmsnorm_forward(x.data(), gamma.data(), yy.data(), rs.data(), rows, C, 1e-5f);
    double l = 0;
    for (size_t i = 0; i < yy.size(); ++i) l += double(w[i]) * yy[i];
    return l;
  };
  std::vector<float> dx(rows * C, NAN), dgamma(C, 0.25f);  // dgamma accumulates onto 0.25
  cpu().rmsnorm_backward(w.data(), x.data(), gamma.data(), rstd.data(), dx.data(), dgamma.data(), rows, C);
  for (size_t i = 0; i < x.size(); i += 7) {
    INFO("dx " << i);
    CHECK(dx[i] == Approx(numeric(x, i, 1e-3, loss)).margin(2e-3));
  }
  for (size_t c = 0; c < static_cast<size_t>(C); c += 5) {
    INFO("dgamma " << c);
    CHECK(dgamma[c] - 0.25f == Approx(numeric(gamma, c, 1e-3, loss)).margin(2e-3));
  }
}

TEST_CASE("SwiGLU: silu(gate) * up, gradients match finite differences, in place too", "[models][llama]") {
  std::mt19937 rng(12);
  const size_t n = 64;
  std::vector<float> gate = random_vec(n, rng, -4, 4), up = random_vec(n, rng, -2, 2);
  const std::vector<float> w = random_vec(n, rng);
  std::vector<float> y(n, NAN);
  cpu().swiglu_forward(gate.data(), up.data(), y.data(), n);
  for (size_t i = 0; i < n; ++i) CHECK(y[i] == Approx(gate[i] / (1 + std::exp(-double(gate[i]))) * up[i]).epsilon(1e-5));
  auto loss = [&] {
    std::vector<float> yy(n);
    cpu().swiglu_forward(gate.data(), up.data(), yy.data(), n);
    double l = 0;
    for (size_t i = 0; i < n; ++i) l += double(w[i]) * yy[i];
    return l;
  };
  std::vector<float> dgate(n, NAN), dup(n, NAN);
  cpu().swiglu_backward(gate.data(), up.data(), w.data(), dgate.data(), dup.data(), n);
  for (size_t i = 0; i < n; ++i) {
    INFO(i);
    CHECK(dgate[i] == Approx(numeric(gate, i, 1e-3, loss)).margin(1e-3));
    CHECK(dup[i] == Approx(numeric(up, i, 1e-3, loss)).margin(1e-3));
  }
  // In place: the gradients over the inputs, each element's pair read before it is written.
  std::vector<float> g2 = gate, u2 = up;
  cpu().swiglu_backward(g2.data(), u2.data(), w.data(), g2.data(), u2.data(), n);
  CHECK(g2 == dgate);
  CHECK(u2 == dup);
}

TEST_CASE("SwiGLU over several of the CPU kernel's chunks: the exact values to float rounding, every element "
          "written, in place the same bits", "[models][llama]") {
  // 40000 elements: two whole chunks of 16384 and a part (the kernels run oneDNN's SiLU chunk by chunk).
  std::mt19937 rng(14);
  const size_t n = 40000;
  const std::vector<float> gate = random_vec(n, rng, -12, 12), up = random_vec(n, rng, -2, 2), w = random_vec(n, rng);
  std::vector<float> y(n, NAN), dgate(n, NAN), dup(n, NAN);
  cpu().swiglu_forward(gate.data(), up.data(), y.data(), n);
  cpu().swiglu_backward(gate.data(), up.data(), w.data(), dgate.data(), dup.data(), n);
  // Each against the formula in double, the error bounded relative to the sizes of the terms it adds (silu' is 0
  // near gate = -1.28, where 1 + gate (1 - s) cancels).
  double worst = 0;
  size_t worst_at = 0;
  auto compare = [&](const char* what, const std::vector<float>& got, size_t i, double want, double size) {
    const double err = std::abs(got[i] - want) / (size + 1e-30);
    if (!(err <= worst)) {  // NaN too
      worst = std::isnan(err) ? INFINITY : err;
      worst_at = i;
    }
    if (!(err < 1e-6)) FAIL_CHECK(what << "[" << i << "] = " << got[i] << ", exactly " << want);
  };
  for (size_t i = 0; i < n; ++i) {
    const double x = gate[i], s = 1 / (1 + std::exp(-x)), u = up[i], d = w[i];
    compare("y", y, i, x * s * u, std::abs(x * s * u));
    compare("dgate", dgate, i, d * u * s * (1 + x * (1 - s)), std::abs(d * u) * s * (1 + std::abs(x) * (1 - s)));
    compare("dup", dup, i, d * x * s, std::abs(d * x * s));
  }
  INFO("worst error " << worst << " (relative to the terms' sizes) at " << worst_at);
  CHECK(worst < 1e-6);
  std::vector<float> a = gate, b = up, c = up;
  cpu().swiglu_forward(gate.data(), c.data(), c.data(), n);  // y over up
  CHECK(std::memcmp(c.data(), y.data(), n * sizeof(float)) == 0);
  cpu().swiglu_backward(a.data(), b.data(), w.data(), b.data(), a.data(), n);  // dgate over up, dup over gate
  CHECK(std::memcmp(b.data(), dgate.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), dup.data(), n * sizeof(float)) == 0);
}

TEST_CASE("rope: rotate_half pairs turned by position x inverse frequency, inverse undoes it", "[models][llama]") {
  std::mt19937 rng(13);
  const int64_t B = 2, T = 5, heads = 3, D = 8, half = D / 2, pos0 = 2;
  const int64_t stride = heads * D + 7;  // a fused row: the rotated heads, then 7 floats left alone
  std::vector<float> cos, sin;
  rope_tables(pos0 + T, D, 10000.0, {}, cos, sin);
  const std::vector<float> inv = rope_inv_freq(D, 10000.0);
  std::vector<float> x = random_vec(B * T * stride, rng);
  const std::vector<float> x0 = x;
  cpu().rope(x.data(), cos.data(), sin.data(), B * T, T, pos0, heads, D, stride, false);
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t p = pos0 + r % T;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = r * stride + h * D + i, b = a + half;
        // (x1 + i x2) e^{i p f}
        const std::complex<double> z = std::complex<double>(x0[a], x0[b]) * std::polar(1.0, double(p) * inv[i]);
        INFO("row " << r << " head " << h << " pair " << i);
        CHECK(x[a] == Approx(z.real()).margin(1e-5));
        CHECK(x[b] == Approx(z.imag()).margin(1e-5));
      }
    for (int64_t c = heads * D; c < stride; ++c) CHECK(x[r * stride + c] == x0[r * stride + c]);
  }
  cpu().rope(x.data(), cos.data(), sin.data(), B * T, T, pos0, heads, D, stride, true);
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == Approx(x0[i]).margin(1e-6));
}

TEST_CASE("rope_inv_freq: theta^(-2i/d), and Llama 3's scaling band by band", "[models][llama]") {
  const std::vector<float> plain = rope_inv_freq(64, 500000.0);
  REQUIRE(plain.size() == 32);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == Approx(std::pow(500000.0, -2.0 * i / 64)).epsilon(1e-6));
  RopeScaling s{.type = "llama3", .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                .original_max_position_embeddings = 8192};
  const std::vector<float> scaled = rope_inv_freq(64, 500000.0, s);
  int low = 0, high = 0, mid = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    INFO("pair " << i << " wavelength " << wavelen);
    if (wavelen < 8192.0 / 4) {  // short wavelengths: kept
      CHECK(scaled[i] == plain[i]);
      ++high;
    } else if (wavelen > 8192.0 / 1) {  // long ones: slowed by the factor
      CHECK(scaled[i] == Approx(plain[i] / 8.0).epsilon(1e-6));
      ++low;
    } else {  // between: a blend, slower than kept and faster than slowed
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      CHECK(scaled[i] == Approx((1 - smooth) * plain[i] / 8 + smooth * plain[i]).epsilon(1e-6));
      CHECK(scaled[i] < plain[i]);
      CHECK(scaled[i] > plain[i] / 8);
      ++mid;
    }
  }
  CHECK(low > 0);  // every band occurs at Llama 3's head_dim 64... 128 and theta 500000
  CHECK(high > 0);
  CHECK(mid > 0);
  CHECK_THROWS_WITH(rope_inv_freq(63, 1e4), Catch::Contains("even head_dim"));
  CHECK_THROWS_WITH(rope_inv_freq(64, 1e4, RopeScaling{.type = "yarn"}), Catch::Contains("'yarn' is not supported"));
  CHECK_THROWS_WITH(rope_inv_freq(64, 1e4, RopeScaling{.type = "llama3", .low_freq_factor = 4, .high_freq_factor = 1}),
                    Catch::Contains("0 < low < high"));
}

namespace {

std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_bfloat16(v[i]);
  return out;
}
std::vector<float> widen(const std::vector<BFloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}
// bf16 bits equal to the rounding of the float32 results: the same arithmetic, one rounding.
size_t rounding_mismatches(const std::vector<BFloat16>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i].bits != to_bfloat16(want[i]).bits;
  return bad;
}

}  // namespace

TEST_CASE("the bf16 RMSNorm, SwiGLU and rope are the float32 kernels on the widened values, rounded once",
          "[models][llama]") {
  std::mt19937 rng(17);
  const int64_t rows = 19, C = 40;
  const auto x16 = to_bf16(random_vec(rows * C, rng, -3.0f, 3.0f)), dy16 = to_bf16(random_vec(rows * C, rng));
  const auto gamma = random_vec(C, rng, 0.5f, 1.5f), dg0 = random_vec(C, rng);
  const auto x = widen(x16), dy = widen(dy16);
  // RMSNorm: y, dx rounded from the float32 kernel's; rstd and dgamma (float32) the same bits.
  std::vector<float> y(x.size()), rstd(rows), dx(x.size()), dg = dg0, rstd16(rows, NAN), dg16 = dg0;
  std::vector<BFloat16> y16(x.size()), dx16(x.size());
  cpu().rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), rows, C, 1e-5f);
  cpu().rmsnorm_forward_bf16(x16.data(), gamma.data(), y16.data(), rstd16.data(), rows, C, 1e-5f);
  cpu().rmsnorm_backward(dy.data(), x.data(), gamma.data(), rstd.data(), dx.data(), dg.data(), rows, C);
  cpu().rmsnorm_backward_bf16(dy16.data(), x16.data(), gamma.data(), rstd16.data(), dx16.data(), dg16.data(), rows, C,
                              nullptr);
  CHECK(rounding_mismatches(y16, y) == 0);
  CHECK(rstd16 == rstd);
  CHECK(rounding_mismatches(dx16, dx) == 0);
  CHECK(dg16 == dg);
  {  // With a residual gradient: dx + residual in float32, rounded once (not twice); in dx's buffer too.
    const auto res16 = to_bf16(random_vec(rows * C, rng));
    std::vector<BFloat16> dxr(x.size()), inplace = res16;
    std::vector<float> dgr = dg0;
    cpu().rmsnorm_backward_bf16(dy16.data(), x16.data(), gamma.data(), rstd16.data(), dxr.data(), dgr.data(), rows, C,
                                res16.data());
    cpu().rmsnorm_backward_bf16(dy16.data(), x16.data(), gamma.data(), rstd16.data(), inplace.data(), dgr.data(), rows,
                                C, inplace.data());
    std::vector<float> sum(x.size());
    size_t twice = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      sum[i] = dx[i] + to_float(res16[i]);
      twice += dxr[i].bits != to_bfloat16(to_float(dx16[i]) + to_float(res16[i])).bits;
    }
    CHECK(rounding_mismatches(dxr, sum) == 0);
    CHECK(twice > 0);  // two roundings differ somewhere: the check above tells them apart
    CHECK(std::memcmp(dxr.data(), inplace.data(), dxr.size() * sizeof(BFloat16)) == 0);
    std::vector<float> dg_twice = dg0;  // dgamma as two backwards without the residual
    std::vector<BFloat16> scratch(x.size());
    for (int rep = 0; rep < 2; ++rep)
      cpu().rmsnorm_backward_bf16(dy16.data(), x16.data(), gamma.data(), rstd16.data(), scratch.data(),
                                  dg_twice.data(), rows, C, nullptr);
    CHECK(dgr == dg_twice);
  }
  // SwiGLU, in place too, over more than two of the CPU kernel's chunks.
  const size_t n = 40000;
  const auto gate16 = to_bf16(random_vec(n, rng, -6.0f, 6.0f)), up16 = to_bf16(random_vec(n, rng, -2.0f, 2.0f));
  const auto g16 = to_bf16(random_vec(n, rng));
  const auto gate = widen(gate16), up = widen(up16), g = widen(g16);
  std::vector<float> s(n), dgate(n), dup(n);
  cpu().swiglu_forward(gate.data(), up.data(), s.data(), n);
  cpu().swiglu_backward(gate.data(), up.data(), g.data(), dgate.data(), dup.data(), n);
  std::vector<BFloat16> s16(n), a16 = gate16, b16 = up16;
  cpu().swiglu_forward_bf16(gate16.data(), up16.data(), s16.data(), n);
  cpu().swiglu_backward_bf16(a16.data(), b16.data(), g16.data(), a16.data(), b16.data(), n);  // in place
  CHECK(rounding_mismatches(s16, s) == 0);
  CHECK(rounding_mismatches(a16, dgate) == 0);
  CHECK(rounding_mismatches(b16, dup) == 0);
  // rope on the q and k heads of fused qkv rows (2 query heads, 1 key/value head of 8); the v head untouched.
  const int64_t T = 5, D = 8, heads = 2, kv = 1, stride = (heads + 2 * kv) * D;
  std::vector<float> cos, sin;
  rope_tables(T + 3, D, 10000.0, {}, cos, sin);
  const auto q16 = to_bf16(random_vec(2 * T * stride, rng, -2.0f, 2.0f));
  auto q = widen(q16);
  auto r16 = q16;
  for (const bool inverse : {false, true}) {
    cpu().rope(q.data(), cos.data(), sin.data(), 2 * T, T, 3, heads + kv, D, stride, inverse);
    cpu().rope_bf16(r16.data(), cos.data(), sin.data(), 2 * T, T, 3, heads + kv, D, stride, inverse);
    CHECK(rounding_mismatches(r16, q) == 0);
    q = widen(r16);  // the next pass starts from the rounded values, as the bf16 kernel does
  }
  for (int64_t r = 0; r < 2 * T; ++r)
    for (int64_t c = (heads + kv) * D; c < stride; ++c) CHECK(r16[r * stride + c].bits == q16[r * stride + c].bits);
}
