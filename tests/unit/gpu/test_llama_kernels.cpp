// tests/unit/gpu/test_llama_kernels.cpp: the CUDA set's Llama-family kernels (issue 35) against the CPU set's
// (tests/unit/models/test_llama_kernels.cpp checks those against finite differences and closed forms): RMSNorm
// forward and backward (dgamma accumulating onto random values), SwiGLU forward and backward (in place too), the
// rotary embedding on the q and k heads of a fused qkv row (the v heads untouched) and back; the embedding without
// positions; the same three on bf16 activations (the fast path's); and the whole Llama (models/llama) moved to the GPU
// against the CPU, KV-cache steps included. Fresh random inputs
// from fixed seeds; outputs start as NaN on the device, so an element left unwritten fails. Tolerances: the row
// sums in double on both sides (a few float ulps apart); the element-wise ones one float operation sequence each
// (expf and sinf/cosf may differ by an ulp between the host's libm and CUDA's).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "core/check.h"
#include "gpu_testing.h"
#include "models/llama/llama.h"
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

// The Llama family's fast path kernels on bf16 activations: the GPU's against the CPU set's (which
// tests/unit/models/test_llama_kernels.cpp finds equal to the float32 kernels on the widened values, rounded once).
// The same arithmetic on both sides: equal within one bf16 rounding step (a float32 ulp apart before rounding can
// round to neighbouring bf16 values); rstd and dgamma float32 as the float32 kernels'.
TEST_CASE("cuda bf16 RMSNorm, SwiGLU and rope match the CPU's", "[gpu][llama][fastpath]") {
  std::mt19937 rng(94);
  // SmolLM-135M's width (576: rows in registers, 3 vectors a lane, the backward fused), Llama 3.2 1B's (2048: the
  // forward in registers, the backward per pass), 1024 (the fused backward's largest) and an odd one (one column at a
  // time). 300 rows: the backward's 10 runs of 30 rows.
  for (const int64_t C : {int64_t{576}, int64_t{2048}, int64_t{1024}, int64_t{37}}) {
    const int64_t rows = 300;
    CAPTURE(C);
    const Tensor x = bf16_random({rows, C}, rng, -3.0f, 3.0f), dy = bf16_random({rows, C}, rng);
    const Tensor gamma = random_floats({C}, rng, 0.5f, 1.5f), dg0 = random_floats({C}, rng);
    Tensor y = bf16_nan({rows, C}), dx = bf16_nan({rows, C}), rstd = filled({rows}, kNaN);
    Tensor dg = copy_to(dg0, Device::cpu());
    Tensor gx = to_device(x), gdy = to_device(dy), ggamma = to_device(gamma), gdg = to_device(dg0);
    Tensor gy = to_device(bf16_nan({rows, C})), gdx = to_device(bf16_nan({rows, C})), grstd = nan_on_device({rows});
    cpu_kernels().rmsnorm_forward_bf16(x.data<BFloat16>(), gamma.data<float>(), y.data<BFloat16>(), rstd.data<float>(),
                                       rows, C, 1e-5f);
    gpu_kernels().rmsnorm_forward_bf16(gx.data<BFloat16>(), ggamma.data<float>(), gy.data<BFloat16>(),
                                       grstd.data<float>(), rows, C, 1e-5f);
    cpu_kernels().rmsnorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                        rstd.data<float>(), dx.data<BFloat16>(), dg.data<float>(), rows, C, nullptr);
    gpu_kernels().rmsnorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                        grstd.data<float>(), gdx.data<BFloat16>(), gdg.data<float>(), rows, C, nullptr);
    const Diff d_y = compare_bf16(gy, y, 1e-6, kBf16Step), d_rstd = compare(to_host(grstd), rstd, 0.0, 1e-6);
    const Diff d_dx = compare_bf16(gdx, dx, 1e-5, kBf16Step), d_dg = compare(to_host(gdg), dg, 1e-4, 1e-5);
    INFO("y: " << d_y << "\nrstd: " << d_rstd << "\ndx: " << d_dx << "\ndgamma: " << d_dg);
    CHECK(d_y.bad + d_rstd.bad + d_dx.bad + d_dg.bad == 0);
    {  // The residual add before the norm (add_rmsnorm_forward_bf16, fused where the rows are held in registers): the
       // sum the CPU's add_bf16 bits, sum, y and rstd the GPU's two calls' bits; then in place over the first summand.
      const Tensor b = bf16_random({rows, C}, rng);
      Tensor sum = bf16_nan({rows, C});
      cpu_kernels().add_bf16(x.data<BFloat16>(), b.data<BFloat16>(), sum.data<BFloat16>(),
                             static_cast<size_t>(rows * C));
      Tensor gb = to_device(b), gsum = to_device(bf16_nan({rows, C})), gy2 = to_device(bf16_nan({rows, C}));
      Tensor gsum3 = to_device(bf16_nan({rows, C})), gy3 = to_device(bf16_nan({rows, C}));
      Tensor grstd2 = nan_on_device({rows}), grstd3 = nan_on_device({rows}), ga = to_device(x);
      gpu_kernels().add_rmsnorm_forward_bf16(gx.data<BFloat16>(), gb.data<BFloat16>(), gsum.data<BFloat16>(),
                                             ggamma.data<float>(), gy2.data<BFloat16>(), grstd2.data<float>(), rows, C,
                                             1e-5f);
      gpu_kernels().add_bf16(gx.data<BFloat16>(), gb.data<BFloat16>(), gsum3.data<BFloat16>(),
                             static_cast<size_t>(rows * C));
      gpu_kernels().rmsnorm_forward_bf16(gsum3.data<BFloat16>(), ggamma.data<float>(), gy3.data<BFloat16>(),
                                         grstd3.data<float>(), rows, C, 1e-5f);
      const Tensor hsum = to_host(gsum), hy2 = to_host(gy2), hr2 = to_host(grstd2);
      CHECK(bits_differ("fused add: sum against the CPU add_bf16", hsum, sum) == "");
      CHECK(bits_differ("fused add: sum against add_bf16 on the GPU", hsum, to_host(gsum3)) == "");
      CHECK(bits_differ("fused add: y against the two calls", hy2, to_host(gy3)) == "");
      CHECK(bits_differ("fused add: rstd against the two calls", hr2, to_host(grstd3)) == "");
      Tensor gy4 = to_device(bf16_nan({rows, C})), grstd4 = nan_on_device({rows});
      gpu_kernels().add_rmsnorm_forward_bf16(ga.data<BFloat16>(), gb.data<BFloat16>(), ga.data<BFloat16>(),
                                             ggamma.data<float>(), gy4.data<BFloat16>(), grstd4.data<float>(), rows, C,
                                             1e-5f);
      CHECK(bits_differ("fused add in place over the first summand: sum", to_host(ga), sum) == "");
      CHECK(bits_differ("fused add in place over the first summand: y", to_host(gy4), hy2) == "");
      Tensor gb5 = to_device(b), gy5 = to_device(bf16_nan({rows, C}));  // in place over the second summand
      gpu_kernels().add_rmsnorm_forward_bf16(gx.data<BFloat16>(), gb5.data<BFloat16>(), gb5.data<BFloat16>(),
                                             ggamma.data<float>(), gy5.data<BFloat16>(), grstd4.data<float>(), rows, C,
                                             1e-5f);
      CHECK(bits_differ("fused add in place over the second summand: sum", to_host(gb5), sum) == "");
      CHECK(bits_differ("fused add in place over the second summand: y", to_host(gy5), hy2) == "");
      // Every row one element into its buffer (the add, then the norm one column at a time): the sum's bits, y as
      // the CPU's norm of that sum.
      Tensor ga1 = shifted_on_device(x), gb1 = shifted_on_device(b), gs1 = shifted_on_device(bf16_nan({rows, C}));
      Tensor gy1 = shifted_on_device(bf16_nan({rows, C}));
      gpu_kernels().add_rmsnorm_forward_bf16(ga1.data<BFloat16>() + 1, gb1.data<BFloat16>() + 1,
                                             gs1.data<BFloat16>() + 1, ggamma.data<float>(), gy1.data<BFloat16>() + 1,
                                             grstd4.data<float>(), rows, C, 1e-5f);
      Tensor ysum = bf16_nan({rows, C}), r5 = filled({rows}, kNaN);
      cpu_kernels().rmsnorm_forward_bf16(sum.data<BFloat16>(), gamma.data<float>(), ysum.data<BFloat16>(),
                                         r5.data<float>(), rows, C, 1e-5f);
      CHECK(bits_differ("fused add, rows 2-byte aligned: sum", shifted_back(gs1, {rows, C}), sum) == "");
      const Diff u_y = compare_bf16(shifted_back(gy1, {rows, C}), ysum, 1e-6, kBf16Step);
      INFO("unaligned add then norm, y: " << u_y);
      CHECK(u_y.bad == 0);
    }
    // With a residual gradient added before dx's rounding (the GPU may fuse it into an fma, one rounding where the CPU
    // has two: within the tolerance), then with it in dx's buffer; dgamma the same bits as without the residual.
    const Tensor res = bf16_random({rows, C}, rng);
    Tensor dxr = bf16_nan({rows, C}), dgr = copy_to(dg0, Device::cpu());
    cpu_kernels().rmsnorm_backward_bf16(dy.data<BFloat16>(), x.data<BFloat16>(), gamma.data<float>(),
                                        rstd.data<float>(), dxr.data<BFloat16>(), dgr.data<float>(), rows, C,
                                        res.data<BFloat16>());
    Tensor gres = to_device(res), gdxr = to_device(bf16_nan({rows, C})), gdgr = to_device(dg0);
    gpu_kernels().rmsnorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                        grstd.data<float>(), gdxr.data<BFloat16>(), gdgr.data<float>(), rows, C,
                                        gres.data<BFloat16>());
    const Diff r_dx = compare_bf16(gdxr, dxr, 1e-5, kBf16Step);
    INFO("dx + residual: " << r_dx);
    CHECK(r_dx.bad == 0);
    Tensor ginplace = to_device(res), gdg2 = to_device(dg0);
    gpu_kernels().rmsnorm_backward_bf16(gdy.data<BFloat16>(), gx.data<BFloat16>(), ggamma.data<float>(),
                                        grstd.data<float>(), ginplace.data<BFloat16>(), gdg2.data<float>(), rows, C,
                                        ginplace.data<BFloat16>());
    const Tensor a = to_host(gdxr), b = to_host(ginplace), c = to_host(gdgr), d = to_host(gdg2), e = to_host(gdg);
    CHECK(bits_differ("dx + residual in place over the residual", a, b) == "");
    CHECK(bits_differ("dgamma with a residual", c, e) == "");
    CHECK(bits_differ("dgamma with a residual in place", d, e) == "");
  }
  // SwiGLU, the backward in place over its inputs as the fast path runs it.
  const int64_t n = 100003;
  const Tensor gate = bf16_random({n}, rng, -6.0f, 6.0f), up = bf16_random({n}, rng, -2.0f, 2.0f);
  const Tensor g = bf16_random({n}, rng);
  Tensor y = bf16_nan({n}), dgate = copy_to(gate, Device::cpu()), dup = copy_to(up, Device::cpu());
  Tensor ggate = to_device(gate), gup = to_device(up), gg = to_device(g), gy = to_device(bf16_nan({n}));
  const auto N = static_cast<size_t>(n);
  cpu_kernels().swiglu_forward_bf16(gate.data<BFloat16>(), up.data<BFloat16>(), y.data<BFloat16>(), N);
  gpu_kernels().swiglu_forward_bf16(ggate.data<BFloat16>(), gup.data<BFloat16>(), gy.data<BFloat16>(), N);
  cpu_kernels().swiglu_backward_bf16(dgate.data<BFloat16>(), dup.data<BFloat16>(), g.data<BFloat16>(),
                                     dgate.data<BFloat16>(), dup.data<BFloat16>(), N);
  gpu_kernels().swiglu_backward_bf16(ggate.data<BFloat16>(), gup.data<BFloat16>(), gg.data<BFloat16>(),
                                     ggate.data<BFloat16>(), gup.data<BFloat16>(), N);
  const Diff s_y = compare_bf16(gy, y, 1e-6, kBf16Step), s_dg = compare_bf16(ggate, dgate, 1e-6, kBf16Step);
  const Diff s_du = compare_bf16(gup, dup, 1e-6, kBf16Step);
  INFO("swiglu y: " << s_y << "\ndgate: " << s_dg << "\ndup: " << s_du);
  CHECK(s_y.bad + s_dg.bad + s_du.bad == 0);
  // rope on a fused qkv row's q and k heads (9 query heads over 3 key/value heads of 64, SmolLM-135M's), and back.
  const int64_t B = 2, T = 33, hq = 9, hkv = 3, D = 64, pos0 = 4, stride = (hq + 2 * hkv) * D;
  std::vector<float> cos, sin;
  rope_tables(pos0 + T, D, 10000.0, {}, cos, sin);
  Tensor tcos = Tensor::empty({pos0 + T, D / 2}), tsin = Tensor::empty({pos0 + T, D / 2});
  std::copy(cos.begin(), cos.end(), tcos.data<float>());
  std::copy(sin.begin(), sin.end(), tsin.data<float>());
  const Tensor qkv = bf16_random({B * T, stride}, rng, -2.0f, 2.0f);
  Tensor want = copy_to(qkv, Device::cpu()), got = to_device(qkv), gcos = to_device(tcos), gsin = to_device(tsin);
  for (const bool inverse : {false, true}) {
    CAPTURE(inverse);
    cpu_kernels().rope_bf16(want.data<BFloat16>(), tcos.data<float>(), tsin.data<float>(), B * T, T, pos0, hq + hkv, D,
                            stride, inverse);
    gpu_kernels().rope_bf16(got.data<BFloat16>(), gcos.data<float>(), gsin.data<float>(), B * T, T, pos0, hq + hkv, D,
                            stride, inverse);
    const Diff d = compare_bf16(got, want, 1e-6, kBf16Step);
    INFO("qkv: " << d);
    CHECK(d.bad == 0);
  }
}

// The Llama's embedding has no position table: wpe and dwpe nullptr.
TEST_CASE("cuda embedding without positions (wpe nullptr) is the CPU's bit for bit, forward and backward",
          "[gpu][llama]") {
  std::mt19937 rng(93);
  const int64_t rows = 45, T = 9, C = 70, vocab = 300;
  Tensor tokens = Tensor::empty({rows}, DType::I32);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  for (int64_t r = 0; r < rows; ++r) tokens.data<int32_t>()[r] = r % 7 == 0 ? 5 : dist(rng);  // repeats included
  const Tensor wte = random_floats({vocab, C}, rng), dy = random_floats({rows, C}, rng);
  const Tensor dwte0 = random_floats({vocab, C}, rng);
  Tensor want = Tensor::empty({rows, C}), want_dwte = copy_to(dwte0, Device::cpu());
  cpu_kernels().embedding_forward(tokens.data<int32_t>(), wte.data<float>(), nullptr, want.data<float>(), rows, T, C,
                                  vocab);
  cpu_kernels().embedding_backward(tokens.data<int32_t>(), dy.data<float>(), want_dwte.data<float>(), nullptr, rows, T,
                                   C, vocab);
  const Tensor dtok = to_device(tokens), dwte = to_device(wte), ddy = to_device(dy);
  Tensor y = nan_on_device({rows, C}), gdwte = to_device(dwte0);
  gpu_kernels().embedding_forward(dtok.data<int32_t>(), dwte.data<float>(), nullptr, y.data<float>(), rows, T, C, vocab);
  gpu_kernels().embedding_backward(dtok.data<int32_t>(), ddy.data<float>(), gdwte.data<float>(), nullptr, rows, T, C,
                                   vocab);
  const Diff fwd = compare(to_host(y), want), bwd = compare(to_host(gdwte), want_dwte);
  INFO("y: " << fwd << "; dwte: " << bwd);
  CHECK(fwd.bad == 0);
  CHECK(fwd.max_abs == 0.0);
  CHECK(bwd.bad == 0);
  CHECK(bwd.max_abs == 0.0);
}

// A Llama (grouped-query: 4 query heads over 2, head_dim 10, biases on q/k/v: Qwen2's; untied and tied) on the CPU and
// the same one moved to cuda:0, weights 4x the initialisation's: one forward, the mean softmax cross-entropy, one
// backward, then generation's KV-cache forwards (a prompt of 5, then 1 token). Tolerances as the GPT's whole-model
// test: logits, loss and d(logits) 1e-5 relative L2, every parameter gradient 1e-4.
TEST_CASE("a Llama moved to cuda reproduces the CPU's logits, loss, every gradient and its KV-cache steps",
          "[gpu][model][llama]") {
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    LlamaOptions o;
    o.n_layer = 2;
    o.n_head = 4;
    o.n_kv_head = 2;
    o.n_embd = 36;
    o.head_dim = 10;
    o.intermediate_size = 50;
    o.vocab_size = 97;
    o.max_positions = 16;
    o.qkv_bias = true;
    o.tie_embeddings = tied;
    o.rope_theta = 1000.0;
    constexpr int64_t kBatch = 3, kT = 11;
    auto cpu_model = make_llama(o), gpu_model = make_llama(o);
    cpu_model->init(42);
    gpu_model->init(42);
    for (auto* m : {cpu_model.get(), gpu_model.get()})
      for (size_t i = 0; i < m->num_params(); ++i) m->params().data<float>()[i] *= 4.0f;
    gpu_model->to(gpu());
    std::mt19937 rng(113);
    Tensor tokens = Tensor::empty({kBatch, kT}, DType::I32), labels = Tensor::empty({kBatch * kT}, DType::I32);
    std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(o.vocab_size - 1));
    for (int64_t i = 0; i < kBatch * kT; ++i) {
      tokens.data<int32_t>()[i] = dist(rng);
      labels.data<int32_t>()[i] = dist(rng);
    }
    cpu_model->zero_grad();
    gpu_model->zero_grad();
    const Tensor& cpu_logits = cpu_model->forward(tokens);
    const Tensor& gpu_logits = gpu_model->forward(to_device(tokens));
    {
      const Diff d = compare(to_host(gpu_logits), cpu_logits);
      INFO("logits: " << d);
      REQUIRE(d.nonfinite == 0);
      REQUIRE(d.rel_l2 < 1e-5);
    }
    SoftmaxCrossEntropy cpu_loss, gpu_loss;
    const LossResult want = cpu_loss.forward_backward(cpu_logits, labels, cpu_model->kernels());
    const LossResult got = gpu_loss.forward_backward(gpu_logits, to_device(labels), gpu_model->kernels());
    INFO(fmt::format("loss sum: gpu {}, cpu {}", got.loss_sum, want.loss_sum));
    REQUIRE(rel_err(got.loss_sum, want.loss_sum) < 1e-5);
    cpu_model->backward(cpu_loss.grad());
    gpu_model->backward(gpu_loss.grad());
    const Tensor got_grads = to_host(gpu_model->grads());
    for (const NamedParam& np : cpu_model->named_params()) {
      const Diff d = compare(got_grads.data<float>() + np.offset, cpu_model->grads().data<float>() + np.offset,
                             np.param.numel());
      INFO(np.name << ": " << d);
      REQUIRE(d.nonfinite == 0);
      REQUIRE(d.rel_l2 < 1e-4);
    }
    // Generation's forwards: a prompt of 5 positions, then one more, through each side's KV cache.
    for (auto* m : {cpu_model.get(), gpu_model.get()}) {
      m->set_training(false);
      dynamic_cast<Llama&>(m->root()).begin_kv_cache(kBatch, m->device());
    }
    for (const int64_t n : {int64_t{5}, int64_t{1}}) {
      Tensor step = Tensor::empty({kBatch, n}, DType::I32);
      for (int64_t i = 0; i < kBatch * n; ++i) step.data<int32_t>()[i] = dist(rng);
      const Tensor& c = cpu_model->forward(step);
      const Diff d = compare(to_host(gpu_model->forward(to_device(step))), c);
      INFO("KV-cache step of " << n << ": " << d);
      REQUIRE(d.nonfinite == 0);
      REQUIRE(d.rel_l2 < 1e-5);
    }
  }
}
