// tests/unit/gpu/test_llama_kernels.cpp: the CUDA set's Llama-family kernels (issue 35) against the CPU set's
// (tests/unit/models/test_llama_kernels.cpp checks those against finite differences and closed forms): RMSNorm
// forward and backward (dgamma accumulating onto random values), SwiGLU forward and backward (in place too), the
// rotary embedding on the q and k heads of a fused qkv row (the v heads untouched) and back. Fresh random inputs
// from fixed seeds; outputs start as NaN on the device, so an element left unwritten fails. Tolerances: the row
// sums in double on both sides (a few float ulps apart); the element-wise ones one float operation sequence each
// (expf and sinf/cosf may differ by an ulp between the host's libm and CUDA's).
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "core/check.h"
#include "gpu_testing.h"
#include "models/rope.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

TEST_CASE("cuda RMSNorm matches the CPU, forward and backward", "[gpu][llama]") {
  std::mt19937 rng(91);
  for (const int64_t C : {int64_t{4096}, int64_t{37}}) {
    const int64_t rows = 300;
    CAPTURE(C);
    const Tensor x = random_floats({rows, C}, rng, -3.0f, 3.0f), dy = random_floats({rows, C}, rng);
    const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), dg0 = random_floats({C}, rng);
    Tensor y = filled({rows, C}, kNaN), dx = filled({rows, C}, kNaN), rstd = filled({rows}, kNaN);
    Tensor dg = copy_to(dg0, Device::cpu());
    Tensor gx = to_device(x), gdy = to_device(dy), ggamma = to_device(gamma), gdg = to_device(dg0);
    Tensor gy = nan_on_device({rows, C}), gdx = nan_on_device({rows, C}), grstd = nan_on_device({rows});
    cpu_kernels().rmsnorm_forward(x.data<float>(), gamma.data<float>(), y.data<float>(), rstd.data<float>(), rows, C,
                                  1e-5f);
    gpu_kernels().rmsnorm_forward(gx.data<float>(), ggamma.data<float>(), gy.data<float>(), grstd.data<float>(), rows,
                                  C, 1e-5f);
    cpu_kernels().rmsnorm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(), rstd.data<float>(),
                                   dx.data<float>(), dg.data<float>(), rows, C);
    gpu_kernels().rmsnorm_backward(gdy.data<float>(), gx.data<float>(), ggamma.data<float>(), grstd.data<float>(),
                                   gdx.data<float>(), gdg.data<float>(), rows, C);
    const Diff d_y = compare(to_host(gy), y, 1e-6, 1e-6), d_rstd = compare(to_host(grstd), rstd, 0.0, 1e-6);
    const Diff d_dx = compare(to_host(gdx), dx, 1e-5, 1e-5), d_dg = compare(to_host(gdg), dg, 1e-4, 1e-5);
    INFO("y: " << d_y << "\nrstd: " << d_rstd << "\ndx: " << d_dx << "\ndgamma: " << d_dg);
    CHECK(d_y.bad + d_rstd.bad + d_dx.bad + d_dg.bad == 0);
  }
}

TEST_CASE("cuda SwiGLU matches the CPU, forward and backward, in place too", "[gpu][llama]") {
  std::mt19937 rng(92);
  const int64_t n = 100003;
  const Tensor gate = random_floats({n}, rng, -6.0f, 6.0f), up = random_floats({n}, rng, -2.0f, 2.0f);
  const Tensor dy = random_floats({n}, rng);
  Tensor y = filled({n}, kNaN), dgate = filled({n}, kNaN), dup = filled({n}, kNaN);
  Tensor ggate = to_device(gate), gup = to_device(up), gdy = to_device(dy);
  Tensor gy = nan_on_device({n}), gdgate = nan_on_device({n}), gdup = nan_on_device({n});
  const auto N = static_cast<size_t>(n);
  cpu_kernels().swiglu_forward(gate.data<float>(), up.data<float>(), y.data<float>(), N);
  gpu_kernels().swiglu_forward(ggate.data<float>(), gup.data<float>(), gy.data<float>(), N);
  cpu_kernels().swiglu_backward(gate.data<float>(), up.data<float>(), dy.data<float>(), dgate.data<float>(),
                                dup.data<float>(), N);
  gpu_kernels().swiglu_backward(ggate.data<float>(), gup.data<float>(), gdy.data<float>(), gdgate.data<float>(),
                                gdup.data<float>(), N);
  const Diff d_y = compare(to_host(gy), y, 1e-6, 1e-6), d_dg = compare(to_host(gdgate), dgate, 1e-6, 1e-6);
  const Diff d_du = compare(to_host(gdup), dup, 1e-6, 1e-6);
  INFO("y: " << d_y << "\ndgate: " << d_dg << "\ndup: " << d_du);
  CHECK(d_y.bad + d_dg.bad + d_du.bad == 0);
  // In place over the inputs.
  gpu_kernels().swiglu_backward(ggate.data<float>(), gup.data<float>(), gdy.data<float>(), ggate.data<float>(),
                                gup.data<float>(), N);
  const Diff i_dg = compare(to_host(ggate), dgate, 1e-6, 1e-6), i_du = compare(to_host(gup), dup, 1e-6, 1e-6);
  INFO("in place dgate: " << i_dg << "\nin place dup: " << i_du);
  CHECK(i_dg.bad + i_du.bad == 0);
}

TEST_CASE("cuda rope matches the CPU on a fused qkv row's q and k heads, and back", "[gpu][llama]") {
  std::mt19937 rng(93);
  // GQA as Llama 3 8B shapes it, smaller: 8 query heads, 2 key/value heads of 64; rows of q | k | v.
  const int64_t B = 3, T = 37, hq = 8, hkv = 2, D = 64, pos0 = 5, stride = (hq + 2 * hkv) * D;
  std::vector<float> cos, sin;
  RopeScaling llama3{.type = "llama3", .original_max_position_embeddings = 32};
  rope_tables(pos0 + T, D, 500000.0, llama3, cos, sin);
  const int64_t half = D / 2;
  Tensor tcos = Tensor::empty({pos0 + T, half}), tsin = Tensor::empty({pos0 + T, half});
  std::copy(cos.begin(), cos.end(), tcos.data<float>());
  std::copy(sin.begin(), sin.end(), tsin.data<float>());
  const Tensor qkv = random_floats({B * T, stride}, rng, -2.0f, 2.0f);
  Tensor want = copy_to(qkv, Device::cpu());
  Tensor got = to_device(qkv), gcos = to_device(tcos), gsin = to_device(tsin);
  for (const bool inverse : {false, true}) {
    CAPTURE(inverse);
    // q heads from column 0, k heads after them; the v heads stay as they are.
    cpu_kernels().rope(want.data<float>(), tcos.data<float>(), tsin.data<float>(), B * T, T, pos0, hq, D, stride, inverse);
    cpu_kernels().rope(want.data<float>() + hq * D, tcos.data<float>(), tsin.data<float>(), B * T, T, pos0, hkv, D,
                       stride, inverse);
    gpu_kernels().rope(got.data<float>(), gcos.data<float>(), gsin.data<float>(), B * T, T, pos0, hq, D, stride, inverse);
    gpu_kernels().rope(got.data<float>() + hq * D, gcos.data<float>(), gsin.data<float>(), B * T, T, pos0, hkv, D,
                       stride, inverse);
    const Diff d = compare(to_host(got), want, 1e-6, 1e-6);
    INFO("qkv: " << d);
    CHECK(d.bad == 0);
  }
  // Forward then inverse: the input again (within rounding), the v heads bit for bit.
  const Diff back = compare(to_host(got), qkv, 1e-5, 1e-5);
  INFO("after forward and inverse: " << back);
  CHECK(back.bad == 0);
}
