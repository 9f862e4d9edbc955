// tests/unit/models/test_cpu_bn_pool_kernels.cpp: the CPU kernel set's batch normalisation and max pooling against
// plain loops. Both kernels walk memory in another order than the rule they implement (batchnorm.cpp: batch,
// channel, position; pool.cpp: a row of outputs at a time), so each is checked on random inputs of many shapes,
// among them the small planes of ResNet's last layers (1, 4 positions) and planes past the per-plane threshold.
// - Max pooling: every value and index equals elementwise::maxpool_window's scan of that output's window, with ties
//   (values from a set of four) and NaNs (the last NaN wins), across kernels, strides, paddings and odd sizes.
// - Batch norm: the statistics and backward sums against one double sum per channel (relative 1e-12: only the order
//   of the additions differs); the element-wise passes, given the same sums, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "models/kernels/elementwise.h"
#include "models/kernels/factory.h"

using namespace dpt;
using namespace dpt::models;

namespace {

std::vector<float> random_values(size_t n, std::mt19937_64& rng, float scale = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> d(offset, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("CPU max pooling equals maxpool_window's scan for every output, ties and NaNs included", "[models][pool]") {
  Kernels& k = kernels_for(Device::cpu());
  std::mt19937_64 rng(71);
  // n, c, h, w, kernel, stride, pad
  const std::vector<std::array<int64_t, 7>> shapes = {
      {2, 3, 16, 16, 3, 2, 1},  // ResNet's stem pool (the <3, 2> instance)
      {1, 2, 7, 9, 3, 2, 1},   {1, 2, 2, 2, 3, 2, 1},  {1, 1, 1, 5, 3, 2, 1}, {2, 2, 8, 6, 2, 2, 0},
      {1, 3, 9, 7, 2, 2, 1},   {1, 2, 6, 6, 3, 1, 1},  {1, 2, 11, 10, 5, 3, 2}, {1, 1, 5, 5, 1, 1, 0},
      {1, 2, 10, 13, 4, 3, 2}, {1, 1, 3, 40, 3, 2, 1},
  };
  for (const auto& [n, c, h, w, kernel, stride, pad] : shapes) {
    PoolShape ps;
    ps.n = n, ps.c = c, ps.h = h, ps.w = w, ps.kernel = kernel, ps.stride = stride, ps.pad = pad;
    REQUIRE(pool_output_size(ps));
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> x = random_values(static_cast<size_t>(n * c * h * w), rng);
      if (variant >= 1) {  // ties: four distinct values
        std::uniform_int_distribution<int> pick(0, 3);
        for (float& v : x) v = static_cast<float>(pick(rng)) - 1.5f;
      }
      if (variant == 2) {  // and NaNs, a few in each plane
        std::uniform_int_distribution<size_t> at(0, x.size() - 1);
        for (size_t i = 0; i < x.size() / 6 + 1; ++i) x[at(rng)] = std::numeric_limits<float>::quiet_NaN();
      }
      const size_t out = static_cast<size_t>(n * c * ps.p * ps.q);
      std::vector<float> y(out, 12345.0f);  // poisoned: an unwritten output shows
      std::vector<int32_t> arg(out, -7);
      k.maxpool2d_forward(x.data(), y.data(), arg.data(), ps);
      for (int64_t plane = 0; plane < n * c; ++plane)
        for (int64_t p = 0; p < ps.p; ++p)
          for (int64_t q = 0; q < ps.q; ++q) {
            int32_t want_at = 0;
            const float want = elementwise::maxpool_window(x.data() + plane * h * w, ps, p, q, want_at);
            const size_t o = static_cast<size_t>((plane * ps.p + p) * ps.q + q);
            INFO(fmt::format("shape n{} c{} {}x{} kernel {} stride {} pad {}, variant {}, plane {} output ({}, {})",
                             n, c, h, w, kernel, stride, pad, variant, plane, p, q));
            REQUIRE(arg[o] == want_at);
            REQUIRE(same_bits(y[o], want));
          }
    }
  }
}

TEST_CASE("CPU batch norm: sums against one sum per channel, element-wise passes bit for bit", "[models][bn]") {
  Kernels& k = kernels_for(Device::cpu());
  std::mt19937_64 rng(72);
  // n, c, hw: positions 1 and 4 (ResNet's last layers at 32 px), under and over the per-plane threshold (32), and
  // rows past the element-wise passes' expansion limit (c * hw > 65536).
  const std::vector<std::array<int64_t, 3>> shapes = {{7, 5, 1},  {3, 9, 4},   {4, 6, 3},  {2, 3, 31}, {2, 3, 32},
                                                      {3, 2, 33}, {2, 4, 64},  {2, 3, 257}, {2, 5, 1},  {1, 4, 7},
                                                      {2, 3, 40000}, {3, 70000, 1}};
  for (const auto& [n, c, hw] : shapes) {
    INFO(fmt::format("n {} c {} hw {}", n, c, hw));
    const BnShape bs{n, c, hw};
    const size_t total = static_cast<size_t>(n * c * hw);
    const std::vector<float> x = random_values(total, rng, 2.0f, 0.7f);  // an offset: the mean matters
    const std::vector<float> dy = random_values(total, rng);
    const std::vector<float> gamma = random_values(static_cast<size_t>(c), rng, 0.5f, 1.0f);
    const std::vector<float> beta = random_values(static_cast<size_t>(c), rng);

    // One double sum per channel, in the plain order (channel, then batch, then position).
    std::vector<double> want(static_cast<size_t>(2 * c + 1));
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0, ss = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) {
          const double v = x[static_cast<size_t>((i * c + ch) * hw + j)];
          s += v, ss += v * v;
        }
      want[ch] = s, want[c + ch] = ss;
    }
    std::vector<double> sums(static_cast<size_t>(2 * c + 1), -1.0);
    k.bn_stats(x.data(), bs, sums.data());
    for (int64_t i = 0; i < 2 * c; ++i) REQUIRE(sums[i] == Approx(want[i]).epsilon(1e-12).margin(1e-12));
    REQUIRE(sums[2 * c] == static_cast<double>(n * hw));

    // Forward (training): from the same sums, y and the saved and running statistics bit for bit against the
    // per-channel loop with the shared formulas.
    std::vector<float> rm(static_cast<size_t>(c), 0.1f), rv(static_cast<size_t>(c), 0.9f), rm_want = rm, rv_want = rv;
    std::vector<float> mean(static_cast<size_t>(c)), invstd(static_cast<size_t>(c)), y(total, 99.0f), y_want(total);
    const float eps = 1e-5f, momentum = 0.1f;
    k.bn_forward_train(x.data(), gamma.data(), beta.data(), sums.data(), bs, eps, momentum, rm.data(), rv.data(),
                       mean.data(), invstd.data(), y.data());
    for (int64_t ch = 0; ch < c; ++ch) {
      const elementwise::BnMoments m = elementwise::bn_moments(sums[ch], sums[c + ch], sums[2 * c], eps);
      REQUIRE(same_bits(mean[ch], m.mean));
      REQUIRE(same_bits(invstd[ch], m.invstd));
      REQUIRE(same_bits(rm[ch], elementwise::lerp_running(rm_want[ch], m.mean, momentum)));
      REQUIRE(same_bits(rv[ch], elementwise::lerp_running(rv_want[ch], m.unbiased_var, momentum)));
      const float a = gamma[ch] * m.invstd, b = beta[ch] - m.mean * a;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) {
          const size_t o = static_cast<size_t>((i * c + ch) * hw + j);
          y_want[o] = x[o] * a + b;
        }
    }
    for (size_t o = 0; o < total; ++o) {
      INFO("y at " << o);
      REQUIRE(same_bits(y[o], y_want[o]));
    }

    // Forward (evaluation), from the running statistics.
    std::vector<float> ye(total, 99.0f);
    k.bn_forward_eval(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), bs, eps, ye.data());
    for (int64_t ch = 0; ch < c; ++ch) {
      const float is = 1.0f / std::sqrt(rv[ch] + eps);
      const float a = gamma[ch] * is, b = beta[ch] - rm[ch] * a;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) {
          const size_t o = static_cast<size_t>((i * c + ch) * hw + j);
          INFO("eval y at " << o);
          REQUIRE(same_bits(ye[o], x[o] * a + b));
        }
    }

    // Backward: the two sums per channel, dgamma and dbeta accumulated onto what they held.
    std::vector<double> bwant(static_cast<size_t>(2 * c));
    for (int64_t ch = 0; ch < c; ++ch) {
      double sg = 0, sgx = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) {
          const size_t o = static_cast<size_t>((i * c + ch) * hw + j);
          sg += dy[o];
          sgx += dy[o] * (x[o] - static_cast<double>(mean[ch])) * invstd[ch];
        }
      bwant[ch] = sg, bwant[c + ch] = sgx;
    }
    std::vector<double> bsums(static_cast<size_t>(2 * c + 1), -1.0);
    std::vector<float> dgamma(static_cast<size_t>(c), 0.25f), dbeta(static_cast<size_t>(c), -0.5f);
    k.bn_backward_reduce(dy.data(), x.data(), mean.data(), invstd.data(), bs, bsums.data(), dgamma.data(),
                         dbeta.data());
    for (int64_t ch = 0; ch < c; ++ch) {
      REQUIRE(bsums[ch] == Approx(bwant[ch]).epsilon(1e-12).margin(1e-10));
      REQUIRE(bsums[c + ch] == Approx(bwant[c + ch]).epsilon(1e-12).margin(1e-10));
      REQUIRE(dbeta[ch] == Approx(-0.5 + bwant[ch]).epsilon(1e-6).margin(1e-6));
      REQUIRE(dgamma[ch] == Approx(0.25 + bwant[c + ch]).epsilon(1e-6).margin(1e-6));
    }
    REQUIRE(bsums[2 * c] == static_cast<double>(n * hw));

    // Backward data, from the same sums: bit for bit.
    std::vector<float> dx(total, 99.0f);
    k.bn_backward_data(dy.data(), x.data(), gamma.data(), mean.data(), invstd.data(), bsums.data(), bs, dx.data());
    for (int64_t ch = 0; ch < c; ++ch) {
      const elementwise::BnBackward kc = elementwise::bn_backward_coefficients(gamma[ch], mean[ch], invstd[ch],
                                                                               bsums[ch], bsums[c + ch], bsums[2 * c]);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) {
          const size_t o = static_cast<size_t>((i * c + ch) * hw + j);
          INFO("dx at " << o);
          REQUIRE(same_bits(dx[o], elementwise::bn_backward(dy[o], x[o], kc)));
        }
    }
  }
}
