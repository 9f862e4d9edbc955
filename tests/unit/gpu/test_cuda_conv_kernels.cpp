// tests/unit/gpu/test_cuda_conv_kernels.cpp: the CUDA kernel set's convolutional-network operations against the
// CPU kernel set: convolutions (cuDNN; in fp32, bf16 and fp16), batch normalisation, relu and add, max and global
// average pooling. Random inputs from fixed seeds; odd shapes (batch 1 and 3, channels 1 and 5, stride 2 with
// padding, 1x1, 3x3 and 7x7 kernels, 0 where the operation allows it). Outputs a kernel overwrites start as NaN on
// the device, so an element it skips fails; outputs it accumulates into start random, so an overwrite fails. Each
// test states its tolerance and why; "exact" means the same float operations in the same order on both sides.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_testing.h"
#include "models/kernels/cuda/cuda_kernels.h"
#include "models/kernels/kernels.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

namespace {

// Values from {-1, -0.5, 0, 0.5, 1}: pooling windows then hold ties, which the first-index rule must settle.
Tensor coarse(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(std::move(shape));
  std::uniform_int_distribution<int> dist(-2, 2);
  for (size_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(dist(rng)) / 2.0f;
  return t;
}

Tensor doubles_on_device(size_t count, double value) {
  Tensor t = Tensor::empty({static_cast<int64_t>(count)}, DType::F64);
  for (size_t i = 0; i < count; ++i) t.data<double>()[i] = value;
  return to_device(t);
}

// Bit-for-bit equality (NaN payloads included): for the operations that are exact by construction.
template <class T>
size_t bytes_differ(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  size_t bad = 0;
  for (size_t i = 0; i < got.numel(); ++i)
    bad += std::memcmp(got.data<T>() + i, want.data<T>() + i, sizeof(T)) != 0;
  return bad;
}

// ---- convolution shapes --------------------------------------------------------------------------------------

ConvShape conv_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s, int64_t stride,
                     int64_t pad) {
  ConvShape cs{.n = n, .c = c, .h = h, .w = w, .k = k, .r = r, .s = s, .stride = stride, .pad = pad};
  REQUIRE(conv_output_size(cs));
  return cs;
}

}  // namespace

// ---- convolutions --------------------------------------------------------------------------------------------

#if DPT_HAVE_CUDNN

namespace {

std::string str(const ConvShape& cs) {
  return fmt::format("x [{}, {}, {}, {}], w [{}, {}, {}, {}], stride {}, pad {} -> [{}, {}, {}, {}]", cs.n, cs.c,
                     cs.h, cs.w, cs.k, cs.c, cs.r, cs.s, cs.stride, cs.pad, cs.n, cs.k, cs.p, cs.q);
}

// Calls f(y_index, x_index, w_index) for every product x * w of the convolution's definition (padding skipped).
template <class F>
void for_each_conv_term(const ConvShape& cs, F f) {
  for (int64_t n = 0; n < cs.n; ++n)
    for (int64_t k = 0; k < cs.k; ++k)
      for (int64_t p = 0; p < cs.p; ++p)
        for (int64_t q = 0; q < cs.q; ++q)
          for (int64_t c = 0; c < cs.c; ++c)
            for (int64_t r = 0; r < cs.r; ++r) {
              const int64_t h = p * cs.stride - cs.pad + r;
              if (h < 0 || h >= cs.h) continue;
              for (int64_t s = 0; s < cs.s; ++s) {
                const int64_t w = q * cs.stride - cs.pad + s;
                if (w < 0 || w >= cs.w) continue;
                f(((n * cs.k + k) * cs.p + p) * cs.q + q, ((n * cs.c + c) * cs.h + h) * cs.w + w,
                  ((k * cs.c + c) * cs.r + r) * cs.s + s);
              }
            }
}

// The convolution cases: batch 1 and 3, channels 1 and 5, 1x1 / 3x3 / 7x7 / 3x1 kernels, stride 1 and 2, with
// and without padding, odd and non-square images, a ResNet-like 16 -> 32 channel layer, and an empty batch.
std::vector<ConvShape> conv_cases() {
  return {
      conv_shape(1, 1, 1, 1, 1, 1, 1, 1, 0),      // 1x1 everything
      conv_shape(3, 5, 9, 7, 4, 1, 1, 1, 0),      // pointwise
      conv_shape(3, 5, 9, 7, 4, 1, 1, 2, 0),      // the 1x1 stride-2 shortcut of a downsampling block
      conv_shape(1, 1, 8, 8, 1, 3, 3, 1, 1),      // one channel in and out
      conv_shape(3, 5, 11, 9, 7, 3, 3, 1, 1),     // 3x3 "same"
      conv_shape(3, 5, 11, 9, 7, 3, 3, 2, 1),     // 3x3 stride 2, padded
      conv_shape(3, 5, 6, 6, 4, 3, 3, 2, 0),      // 3x3 stride 2, unpadded (the last row and column unread)
      conv_shape(1, 3, 23, 19, 5, 7, 7, 2, 3),    // a 7x7 stride-2 stem
      conv_shape(2, 3, 7, 8, 4, 3, 1, 1, 1),      // a 3x1 kernel (r != s)
      conv_shape(2, 16, 14, 14, 32, 3, 3, 1, 1),  // more channels
      conv_shape(0, 5, 9, 7, 4, 3, 3, 1, 1),      // an empty batch
      // Channel counts that are multiples of 8: in bf16 / fp16 these plans run NHWC (conv.cpp, conv_nhwc), the
      // operands transposed in 32x32 tiles on their way into and out of 16-bit scratch.
      conv_shape(3, 8, 9, 7, 8, 3, 3, 1, 1),       // the smallest: every tile partly filled
      conv_shape(2, 64, 14, 14, 64, 3, 3, 1, 1),   // a ResNet basic block's 3x3
      conv_shape(2, 64, 15, 15, 128, 3, 3, 2, 1),  // its downsampling 3x3/2, an odd plane
      conv_shape(2, 64, 14, 14, 128, 1, 1, 2, 0),  // and its 1x1/2 shortcut
      conv_shape(2, 3, 23, 19, 16, 7, 7, 2, 3),    // a stem of 3 channels, given to cuDNN as 8 (zero-padded)
  };
}

struct ConvData {
  Tensor x, w, dy, dw0;
};
ConvData conv_data(const ConvShape& cs, std::mt19937& rng) {
  return {random_floats({cs.n, cs.c, cs.h, cs.w}, rng), random_floats({cs.k, cs.c, cs.r, cs.s}, rng),
          random_floats({cs.n, cs.k, cs.p, cs.q}, rng), random_floats({cs.k, cs.c, cs.r, cs.s}, rng)};
}

}  // namespace

namespace {

// The three directions of cs on the GPU (fp32, the algorithms its plan runs now) against the CPU's im2col + OpenBLAS.
// Tolerance: each element within 1e-5 of s_i, the sum of the absolute values of its terms (for dw, plus |dw
// before|): the magnitude a float sum's rounding error scales with. For K terms a float dot product is off by
// ~sqrt(K) 2^-24 s typically (K <= 288 here: ~1e-6 s), K 2^-24 s at worst; Winograd's and FFT's transforms add a few
// roundings more. Outputs that are overwritten start as NaN; dw starts random and must come back as dw + the
// gradient (conv2d_backward_weight accumulates).
void check_conv_fp32(const ConvShape& cs, const ConvData& in) {
  const Tensor x = to_device(in.x), w = to_device(in.w), dy = to_device(in.dy);
  const size_t ny = in.dy.numel(), nx = in.x.numel(), nw = in.w.numel();
  {
    INFO("forward");
    Tensor want = Tensor::empty({cs.n, cs.k, cs.p, cs.q});
    cpu_kernels().conv2d_forward(in.x.data<float>(), in.w.data<float>(), want.data<float>(), cs);
    Tensor y = nan_on_device({cs.n, cs.k, cs.p, cs.q});
    gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), cs);
    std::vector<double> scale(ny, 0.0);
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(yi)] += std::abs(static_cast<double>(in.x.data<float>()[xi]) * in.w.data<float>()[wi]);
    });
    const Tensor got = to_host(y);
    const Diff d = compare(got.data<float>(), want.data<float>(), ny, 0.0, 1e-5, scale.data());
    INFO("y: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.bad == 0);
  }
  {
    INFO("backward data (overwrites dx)");
    Tensor want = Tensor::empty({cs.n, cs.c, cs.h, cs.w});
    cpu_kernels().conv2d_backward_data(in.dy.data<float>(), in.w.data<float>(), want.data<float>(), cs);
    Tensor dx = nan_on_device({cs.n, cs.c, cs.h, cs.w});
    gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), cs);
    std::vector<double> scale(nx, 0.0);
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(xi)] += std::abs(static_cast<double>(in.dy.data<float>()[yi]) * in.w.data<float>()[wi]);
    });
    const Tensor got = to_host(dx);
    const Diff d = compare(got.data<float>(), want.data<float>(), nx, 0.0, 1e-5, scale.data());
    INFO("dx: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.bad == 0);
  }
  {
    INFO("backward weight (accumulates into dw)");
    Tensor want = copy_to(in.dw0, Device::cpu());
    cpu_kernels().conv2d_backward_weight(in.dy.data<float>(), in.x.data<float>(), want.data<float>(), cs);
    Tensor dw = to_device(in.dw0);
    gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw.data<float>(), cs);
    std::vector<double> scale(nw, 0.0);
    for (size_t i = 0; i < nw; ++i) scale[i] = std::abs(in.dw0.data<float>()[i]);
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(wi)] += std::abs(static_cast<double>(in.dy.data<float>()[yi]) * in.x.data<float>()[xi]);
    });
    const Tensor got = to_host(dw);
    const Diff d = compare(got.data<float>(), want.data<float>(), nw, 0.0, 1e-5, scale.data());
    INFO("dw: " << d);
    REQUIRE(d.bad == 0);
    if (cs.n == 0) REQUIRE(named_diff("dw, empty batch", compare(got, in.dw0)) == "");  // an empty batch adds nothing
  }
}

CudaKernels& cuda_set() { return dynamic_cast<CudaKernels&>(gpu_kernels()); }

}  // namespace

// cuDNN (FMA math, no TF32; its own choice among deterministic algorithms: implicit GEMM, Winograd, FFT...)
// against the CPU (check_conv_fp32).
TEST_CASE("cuda conv2d forward, backward data and backward weight match the CPU", "[gpu][kernels]") {
  const std::vector<ConvShape> cases = conv_cases();
  const auto which = static_cast<size_t>(GENERATE(range(0, 16)));
  // train.deterministic = false: cuDNN's first algorithm whatever its determinism, within the same bounds.
  const bool deterministic = GENERATE(true, false);
  REQUIRE(which < cases.size());
  const ConvShape cs = cases[which];
  INFO(str(cs) << (deterministic ? "" : ", non-deterministic algorithms allowed"));
  gpu_kernels().set_deterministic(deterministic);
  struct Restore {
    ~Restore() { gpu_kernels().set_deterministic(true); }
  } restore;
  std::mt19937 rng(21);
  check_conv_fp32(cs, conv_data(cs, rng));
}

// train.autotune's convolution sweep (sweep_conv_plans, here on these two shapes' fp32 plans alone) after all three
// directions have run: a line per direction, each timed; with a margin of -1e9 every direction with another
// algorithm it may run switches to the fastest of them (one at least: these shapes have several deterministic
// algorithms a direction). Then the switched algorithms still match the CPU (check_conv_fp32) and give the same bits
// on a rerun, every direction (deterministic ones only were candidates). With no margin nothing switches. (The two
// plans keep their switched algorithms for the tests after this one: deterministic ones, within the same bounds.)
TEST_CASE("cuda conv2d after train.autotune's sweep: the algorithms switched still match the CPU, bit-reproducibly",
          "[gpu][kernels]") {
  std::mt19937 rng(25);
  const ConvShape a = conv_shape(3, 16, 14, 14, 32, 3, 3, 1, 1), b = conv_shape(1, 3, 23, 19, 5, 7, 7, 2, 3);
  const ConvData in_a = conv_data(a, rng), in_b = conv_data(b, rng);
  check_conv_fp32(a, in_a);  // the plans made, every direction run
  check_conv_fp32(b, in_b);
  const auto count = [](const std::vector<std::string>& lines, const char* what) {
    return std::ranges::count_if(lines, [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  const auto joined = [](const std::vector<std::string>& lines) {
    std::string all;
    for (const std::string& l : lines) all += l + "\n";
    return all;
  };
  const std::array<ConvShape, 2> shapes{a, b};
  const std::vector<std::string> looked = cuda_set().sweep_conv_plans(2, std::nullopt, shapes);
  INFO(joined(looked));
  REQUIRE(count(looked, ": chosen ") == 6);  // 2 plans x 3 directions, and only those
  REQUIRE(count(looked, "x [3, 16, 14, 14] w [32, 16, 3, 3] stride 1 pad 1, fp32, deterministic") == 3);
  REQUIRE(count(looked, "adopted") == 0);
  REQUIRE(count(looked, "failed") == 0);
  const std::vector<std::string> tuned = cuda_set().sweep_conv_plans(2, -1e9, shapes);
  INFO(joined(tuned));
  REQUIRE(count(tuned, ": chosen ") == 6);
  REQUIRE(count(tuned, "; adopted") >= 1);
  REQUIRE(count(tuned, "failed") == 0);
  for (const auto& [cs, in] : {std::pair{a, in_a}, std::pair{b, in_b}}) {
    INFO(str(cs));
    check_conv_fp32(cs, in);
    const Tensor x = to_device(in.x), w = to_device(in.w), dy = to_device(in.dy);
    Tensor y[2], dx[2], dw[2];
    for (int run = 0; run < 2; ++run) {
      y[run] = nan_on_device({cs.n, cs.k, cs.p, cs.q});
      dx[run] = nan_on_device({cs.n, cs.c, cs.h, cs.w});
      dw[run] = to_device(in.dw0);
      gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y[run].data<float>(), cs);
      gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx[run].data<float>(), cs);
      gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw[run].data<float>(), cs);
    }
    REQUIRE(bits_differ("y, rerun", to_host(y[0]), to_host(y[1])) == "");
    REQUIRE(bits_differ("dx, rerun", to_host(dx[0]), to_host(dx[1])) == "");
    REQUIRE(bits_differ("dw, rerun", to_host(dw[0]), to_host(dw[1])) == "");
  }
}

// The algorithms are chosen by cuDNN's heuristics among the deterministic ones, once per shape: a rerun gives the
// same bits, also after another shape has been run in between (the plan cache keeps each shape's choice).
TEST_CASE("cuda conv2d is bitwise deterministic across calls and interleaved shapes", "[gpu][kernels]") {
  std::mt19937 rng(22);
  const ConvShape a = conv_shape(3, 16, 14, 14, 32, 3, 3, 1, 1), b = conv_shape(1, 3, 23, 19, 5, 7, 7, 2, 3);
  const ConvData in_a = conv_data(a, rng), in_b = conv_data(b, rng);
  const Tensor x = to_device(in_a.x), w = to_device(in_a.w), dy = to_device(in_a.dy);
  const Tensor xb = to_device(in_b.x), wb = to_device(in_b.w);
  Tensor y[2], dx[2], dw[2];
  for (int run = 0; run < 2; ++run) {
    y[run] = nan_on_device({a.n, a.k, a.p, a.q});
    dx[run] = nan_on_device({a.n, a.c, a.h, a.w});
    dw[run] = to_device(in_a.dw0);
    gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y[run].data<float>(), a);
    gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx[run].data<float>(), a);
    gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw[run].data<float>(), a);
    Tensor yb = nan_on_device({b.n, b.k, b.p, b.q});  // another shape in between
    gpu_kernels().conv2d_forward(xb.data<float>(), wb.data<float>(), yb.data<float>(), b);
  }
  REQUIRE(bits_differ("y, rerun", to_host(y[0]), to_host(y[1])) == "");
  REQUIRE(bits_differ("dx, rerun", to_host(dx[0]), to_host(dx[1])) == "");
  REQUIRE(bits_differ("dw, rerun", to_host(dw[0]), to_host(dw[1])) == "");
}

TEST_CASE("cuda conv2d rejects a shape whose p, q do not follow from the rest", "[gpu][kernels]") {
  ConvShape cs = conv_shape(1, 2, 8, 8, 3, 3, 3, 1, 1);
  cs.p += 1;
  const Tensor x = nan_on_device({1, 2, 8, 8}), w = nan_on_device({3, 2, 3, 3});
  Tensor y = nan_on_device({1, 3, 9, 8});
  REQUIRE_THROWS_AS(gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), cs),
                    InternalError);
}

// ---- convolutions in bf16 and fp16 ----------------------------------------------------------------------------

namespace {

// How a 16-bit convolution result compares with the CPU's in the same precision (want) and in float32 (want32).
// Both sets round x, w and dy to the narrow type and accumulate the (exact) products in float32; the GPU then also
// rounds its output to the narrow type (cuDNN's legacy API has no 16-bit-in, float32-out configuration), the CPU
// does not. With u the unit roundoff (2^-8 bf16, 2^-11 fp16), element i must be within
//   rel_out m_i + (u / 4) s_i,
// m_i the magnitude of what the GPU rounded (|want_i|; for dw the gradient alone, |want_i - dw0_i|), rel_out 1e-2
// for bf16 and 2e-3 for fp16 (2.5 and 4 times u, the most one rounding moves a value), s_i as in the fp32 test
// (the sum of the terms' absolute values: float32 summation in another order, and whatever intermediate roundings
// cuDNN's 16-bit algorithms make, stay far below u / 4 of it; a wrong index or layout is off by ~s_i). Over the
// output (n >= 100 values): ||gpu - cpu|| / ||cpu|| < u (the output rounding alone gives ~0.4 u), and
// ||gpu - fp32|| / ||fp32|| > u / 8 (rounding the operands gives ~0.6 u; float32 operands would give ~1e-7), where
// there is arithmetic to round (`rounds`: not for dw over an empty batch, which must stay dw0 exactly).
void check_low_precision(const char* name, const Tensor& got, const Tensor& want, const Tensor& want32,
                         const std::vector<double>& m, const std::vector<double>& s, Precision p, bool rounds = true) {
  const size_t n = got.numel();
  REQUIRE(want.numel() == n);
  REQUIRE(want32.numel() == n);
  const double u = unit_roundoff(p), rel_out = p == Precision::BF16 ? 1e-2 : 2e-3;
  std::vector<double> scale(n);  // rel_out * scale_i is the tolerance above
  for (size_t i = 0; i < n; ++i) scale[i] = m[i] + (u / 4 / rel_out) * s[i];
  const Diff d = compare(got.data<float>(), want.data<float>(), n, 0.0, rel_out, scale.data());
  INFO(name << ": " << d);
  REQUIRE(d.nonfinite == 0);
  REQUIRE(d.bad == 0);
  if (n >= 100 && rounds) {
    REQUIRE(d.rel_l2 < u);
    const Diff d32 = compare(got, want32);
    INFO(name << " against float32: " << d32);
    REQUIRE(d32.rel_l2 > u / 8);
  }
}

std::vector<double> abs_values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::abs(static_cast<double>(t.data<float>()[i]));
  return v;
}

}  // namespace

// The shapes of the fp32 test, in bf16 and fp16; tolerances in check_low_precision. Overwritten outputs start as
// NaN; dw starts random and must come back as dw + the (rounded) gradient.
TEST_CASE("cuda conv2d in bf16 and fp16 matches the CPU in the same precision", "[gpu][kernels]") {
  const Precision prec = GENERATE(Precision::BF16, Precision::F16);
  const std::vector<ConvShape> cases = conv_cases();
  const auto which = static_cast<size_t>(GENERATE(range(0, 16)));
  REQUIRE(which < cases.size());
  const ConvShape cs = cases[which];
  INFO(precision_name(prec) << ": " << str(cs));
  std::mt19937 rng(23);
  const ConvData in = conv_data(cs, rng);
  const Tensor x = to_device(in.x), w = to_device(in.w), dy = to_device(in.dy);
  const size_t ny = in.dy.numel(), nx = in.x.numel(), nw = in.w.numel();

  SECTION("forward") {
    Tensor want32 = Tensor::empty({cs.n, cs.k, cs.p, cs.q}), want = Tensor::empty({cs.n, cs.k, cs.p, cs.q});
    cpu_kernels().conv2d_forward(in.x.data<float>(), in.w.data<float>(), want32.data<float>(), cs);
    Tensor got;
    {
      const ScopedPrecision scope(prec);
      cpu_kernels().conv2d_forward(in.x.data<float>(), in.w.data<float>(), want.data<float>(), cs);
      Tensor y = nan_on_device({cs.n, cs.k, cs.p, cs.q});
      gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), cs);
      got = to_host(y);
    }
    std::vector<double> scale(ny, 0.0);
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(yi)] += std::abs(static_cast<double>(in.x.data<float>()[xi]) * in.w.data<float>()[wi]);
    });
    check_low_precision("y", got, want, want32, abs_values(want), scale, prec);
  }
  SECTION("backward data (overwrites dx)") {
    Tensor want32 = Tensor::empty({cs.n, cs.c, cs.h, cs.w}), want = Tensor::empty({cs.n, cs.c, cs.h, cs.w});
    cpu_kernels().conv2d_backward_data(in.dy.data<float>(), in.w.data<float>(), want32.data<float>(), cs);
    Tensor got;
    {
      const ScopedPrecision scope(prec);
      cpu_kernels().conv2d_backward_data(in.dy.data<float>(), in.w.data<float>(), want.data<float>(), cs);
      Tensor dx = nan_on_device({cs.n, cs.c, cs.h, cs.w});
      gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), cs);
      got = to_host(dx);
    }
    std::vector<double> scale(nx, 0.0);
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(xi)] += std::abs(static_cast<double>(in.dy.data<float>()[yi]) * in.w.data<float>()[wi]);
    });
    check_low_precision("dx", got, want, want32, abs_values(want), scale, prec);
  }
  SECTION("backward weight (accumulates into dw)") {
    Tensor want32 = copy_to(in.dw0, Device::cpu()), want = copy_to(in.dw0, Device::cpu());
    cpu_kernels().conv2d_backward_weight(in.dy.data<float>(), in.x.data<float>(), want32.data<float>(), cs);
    Tensor got;
    {
      const ScopedPrecision scope(prec);
      cpu_kernels().conv2d_backward_weight(in.dy.data<float>(), in.x.data<float>(), want.data<float>(), cs);
      Tensor dw = to_device(in.dw0);
      gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw.data<float>(), cs);
      got = to_host(dw);
    }
    std::vector<double> scale(nw, 0.0), grad(nw, 0.0);
    for (size_t i = 0; i < nw; ++i) {
      scale[i] = std::abs(in.dw0.data<float>()[i]);
      grad[i] = std::abs(static_cast<double>(want.data<float>()[i]) - in.dw0.data<float>()[i]);
    }
    for_each_conv_term(cs, [&](int64_t yi, int64_t xi, int64_t wi) {
      scale[static_cast<size_t>(wi)] += std::abs(static_cast<double>(in.dy.data<float>()[yi]) * in.x.data<float>()[xi]);
    });
    check_low_precision("dw", got, want, want32, grad, scale, prec, cs.n > 0);
    if (cs.n == 0) REQUIRE(named_diff("dw, empty batch", compare(got, in.dw0)) == "");  // an empty batch adds nothing
  }
}

// Plans are cached per (shape, precision): a bf16 or fp16 call of a shape neither replaces nor disturbs its fp32
// plan (the fp32 bits before and after are the same), each 16-bit precision reproduces its own bits, and the 16-bit
// results are not the fp32 ones.
TEST_CASE("cuda conv2d keeps one plan per precision: each precision's bits are reproducible around the others",
          "[gpu][kernels]") {
  std::mt19937 rng(24);
  const ConvShape a = conv_shape(3, 16, 14, 14, 32, 3, 3, 1, 1);
  const ConvData in = conv_data(a, rng);
  const Tensor x = to_device(in.x), w = to_device(in.w), dy = to_device(in.dy);
  struct Results {
    Tensor y, dx, dw;
  };
  const auto run = [&](Precision p) {
    const ScopedPrecision scope(p);
    Tensor y = nan_on_device({a.n, a.k, a.p, a.q}), dx = nan_on_device({a.n, a.c, a.h, a.w});
    Tensor dw = to_device(in.dw0);
    gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), a);
    gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx.data<float>(), a);
    gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw.data<float>(), a);
    return Results{to_host(y), to_host(dx), to_host(dw)};
  };
  const Results f32a = run(Precision::F32), bf16a = run(Precision::BF16), f16a = run(Precision::F16);
  const Results f32b = run(Precision::F32), bf16b = run(Precision::BF16), f16b = run(Precision::F16);
  for (const auto& [first, second] : {std::pair{&f32a, &f32b}, std::pair{&bf16a, &bf16b}, std::pair{&f16a, &f16b}}) {
    REQUIRE(bits_differ("y, around the other precisions", first->y, second->y) == "");
    REQUIRE(bits_differ("dx, around the other precisions", first->dx, second->dx) == "");
    REQUIRE(bits_differ("dw, around the other precisions", first->dw, second->dw) == "");
  }
  for (const Results* low : {&bf16a, &f16a}) {
    REQUIRE(bytes_differ<float>(low->y, f32a.y) > 0);
    REQUIRE(bytes_differ<float>(low->dx, f32a.dx) > 0);
    REQUIRE(bytes_differ<float>(low->dw, f32a.dw) > 0);
  }
}

// Which plans run NHWC (the sweep's lines name it): 16-bit ones whose channel counts are multiples of 8, or whose
// input has fewer than 8 (the stem's 3, zero-padded to 8) and output a multiple of 8; not fp32 ones, not 5 -> 7
// channels, and none made while DPT_CONV_NCHW=1 is set. Each plan's results match the CPU in
// the test above; here the switch itself.
TEST_CASE("cuda conv2d runs NHWC for 16-bit plans with channels in multiples of 8, NCHW under DPT_CONV_NCHW=1",
          "[gpu][kernels]") {
  const auto layout = [](const ConvShape& cs, Precision p) {
    const ScopedPrecision scope(p);
    std::mt19937 rng(26);
    const ConvData in = conv_data(cs, rng);
    const Tensor x = to_device(in.x), w = to_device(in.w);
    Tensor y = nan_on_device({cs.n, cs.k, cs.p, cs.q});
    gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), cs);
    const std::array<ConvShape, 1> only{cs};
    // A line per direction chosen: an NHWC plan chooses all three when made, an NCHW one only the forward run here.
    return cuda_set().sweep_conv_plans(1, std::nullopt, only);
  };
  const auto nhwc_lines = [](const std::vector<std::string>& lines) {
    return std::ranges::count_if(lines, [](const std::string& l) { return l.find(", NHWC") != std::string::npos; });
  };
  ::unsetenv("DPT_CONV_NCHW");
  const std::vector<std::string> bf16 = layout(conv_shape(2, 16, 6, 6, 24, 3, 3, 1, 1), Precision::BF16);
  for (const std::string& l : bf16) UNSCOPED_INFO(l);
  REQUIRE(bf16.size() == 3);
  REQUIRE(nhwc_lines(bf16) == 3);
  REQUIRE(nhwc_lines(layout(conv_shape(2, 16, 6, 6, 24, 3, 3, 1, 1), Precision::F16)) == 3);
  REQUIRE(nhwc_lines(layout(conv_shape(2, 16, 6, 6, 24, 3, 3, 1, 1), Precision::F32)) == 0);
  REQUIRE(nhwc_lines(layout(conv_shape(3, 5, 11, 9, 7, 3, 3, 1, 1), Precision::BF16)) == 0);
  const std::vector<std::string> stem = layout(conv_shape(2, 3, 12, 12, 16, 7, 7, 2, 3), Precision::BF16);
  REQUIRE(nhwc_lines(stem) == 3);
  for (const std::string& l : stem) {
    INFO(l);
    REQUIRE(l.find("x [2, 8, 12, 12] w [16, 8, 7, 7]") != std::string::npos);
    REQUIRE(l.find("(3 channels, zero-padded)") != std::string::npos);
  }
  ::setenv("DPT_CONV_NCHW", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("DPT_CONV_NCHW"); }
  } unset;
  const std::vector<std::string> forced = layout(conv_shape(3, 16, 6, 6, 24, 3, 3, 1, 1), Precision::BF16);
  REQUIRE(forced.size() == 1);
  REQUIRE(nhwc_lines(forced) == 0);
}

// conv2d_backward (Conv2d's backward: dw accumulates, then dx) rounds dy once in bf16 / fp16 and shares it between
// the two directions: the same algorithms on the same operands, so the bits of the two separate calls, in every
// precision, NHWC and NCHW plans (64 and 5 channels), and with dx null (dw alone). dx starts as NaN, dw random.
TEST_CASE("cuda conv2d_backward gives the bits of backward weight then backward data", "[gpu][kernels]") {
  const Precision prec = GENERATE(Precision::F32, Precision::BF16, Precision::F16);
  const ConvShape cs = GENERATE(conv_shape(2, 64, 14, 14, 64, 3, 3, 1, 1), conv_shape(3, 5, 11, 9, 7, 3, 3, 2, 1));
  const bool with_dx = GENERATE(true, false);
  INFO(precision_name(prec) << ": " << str(cs) << (with_dx ? "" : ", dw alone"));
  const ScopedPrecision scope(prec);
  std::mt19937 rng(27);
  const ConvData in = conv_data(cs, rng);
  const Tensor x = to_device(in.x), w = to_device(in.w), dy = to_device(in.dy);
  Tensor dx_apart = nan_on_device({cs.n, cs.c, cs.h, cs.w}), dw_apart = to_device(in.dw0);
  gpu_kernels().conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw_apart.data<float>(), cs);
  gpu_kernels().conv2d_backward_data(dy.data<float>(), w.data<float>(), dx_apart.data<float>(), cs);
  Tensor dx = nan_on_device({cs.n, cs.c, cs.h, cs.w}), dw = to_device(in.dw0);
  gpu_kernels().conv2d_backward(dy.data<float>(), x.data<float>(), w.data<float>(),
                                with_dx ? dx.data<float>() : nullptr, dw.data<float>(), cs);
  REQUIRE(bits_differ("dw, one call against two", to_host(dw), to_host(dw_apart)) == "");
  if (with_dx) {
    REQUIRE(bits_differ("dx, one call against two", to_host(dx), to_host(dx_apart)) == "");
  } else {
    const Tensor untouched = to_host(dx);  // still NaN: dx was not asked for
    for (size_t i = 0; i < untouched.numel(); ++i) REQUIRE(std::isnan(untouched.data<float>()[i]));
  }
}

#else

TEST_CASE("cuda conv2d without cuDNN: an UnsupportedError that names cuDNN", "[gpu][kernels]") {
  const ConvShape cs = conv_shape(1, 2, 8, 8, 3, 3, 3, 1, 1);
  const Tensor x = nan_on_device({1, 2, 8, 8}), w = nan_on_device({3, 2, 3, 3});
  Tensor y = nan_on_device({1, 3, 8, 8});
  REQUIRE_THROWS_WITH(gpu_kernels().conv2d_forward(x.data<float>(), w.data<float>(), y.data<float>(), cs),
                      Catch::Contains("cuDNN"));
  REQUIRE_THROWS_AS(gpu_kernels().conv2d_backward_data(y.data<float>(), w.data<float>(), y.data<float>(), cs),
                    UnsupportedError);
  REQUIRE_THROWS_AS(gpu_kernels().conv2d_backward_weight(y.data<float>(), x.data<float>(), y.data<float>(), cs),
                    UnsupportedError);
  REQUIRE_THROWS_AS(gpu_kernels().conv2d_backward(y.data<float>(), x.data<float>(), w.data<float>(), nullptr,
                                                  y.data<float>(), cs),
                    UnsupportedError);
}

#endif

// ---- batch normalisation -------------------------------------------------------------------------------------

namespace {

struct BnCase {
  int64_t n, c, hw;
};
// BatchNorm1d (hw 1), one channel, 7x7 and 7x9 planes, and per-channel counts of 80000 and 200006 values, which
// the GPU cuts into several runs (kBnValuesPerSplit = 16384) summed by different blocks.
// The last four: ResNet-34's planes at 224 px (56^2 ... 7^2 positions, 64 ... 512 channels), a few images each.
const BnCase kBnCases[] = {{1, 1, 1},       {3, 5, 1},        {3, 5, 49},      {1, 5, 63},     {4, 3, 20000},
                           {2, 3, 100003},  {2, 64, 3136},    {3, 128, 784},   {4, 256, 196},  {5, 512, 49}};

std::vector<double> host_doubles(const Tensor& device_tensor) {
  const Tensor h = to_host(device_tensor);
  return {h.data<double>(), h.data<double>() + h.numel()};
}

// Sum over (n, hw) of |f(i)| per channel, i the index into [n, c, hw].
template <class F>
std::vector<double> per_channel_abs_sum(const BnShape& bs, F f) {
  std::vector<double> s(static_cast<size_t>(bs.c), 0.0);
  for (int64_t n = 0; n < bs.n; ++n)
    for (int64_t ch = 0; ch < bs.c; ++ch)
      for (int64_t j = 0; j < bs.hw; ++j) s[static_cast<size_t>(ch)] += std::abs(f((n * bs.c + ch) * bs.hw + j));
  return s;
}

}  // namespace

// The sums are doubles on both sides, over the same float values (x^2 is exact in double), in another order: the
// CPU sequentially, the GPU in runs, strided per thread, then trees. Sequential summation is off by at most
// (m - 1) 2^-53 sum|terms| (m <= 200006 values: 2.2e-11), so the tolerance is 1e-10 of sum|terms| per channel;
// the count (sums[2c]) exactly. With multiples of 1/16 every partial sum is exact: bit for bit, which also shows
// that every value is counted once. sums start as NaN (overwritten).
TEST_CASE("cuda bn_stats matches the CPU: per-channel sums of x and x^2, and the count", "[gpu][kernels]") {
  const BnCase bc = GENERATE(values<BnCase>({{1, 1, 1}, {3, 5, 1}, {3, 5, 49}, {1, 5, 63}, {4, 3, 20000},
                                             {2, 3, 100003}, {0, 5, 49}, {2, 64, 3136}, {3, 128, 784},
                                             {4, 256, 196}, {5, 512, 49}}));
  const bool exact = GENERATE(false, true);
  const BnShape bs{.n = bc.n, .c = bc.c, .hw = bc.hw};
  CAPTURE(bs.n, bs.c, bs.hw, exact);
  std::mt19937 rng(31);
  const Tensor x = exact ? sixteenths({bs.n, bs.c, bs.hw}, rng) : random_floats({bs.n, bs.c, bs.hw}, rng, -1.0f, 3.0f);
  const size_t nsums = static_cast<size_t>(2 * bs.c + 1);
  std::vector<double> want(nsums);
  cpu_kernels().bn_stats(x.data<float>(), bs, want.data());
  const Tensor dx = to_device(x);
  Tensor sums = doubles_on_device(nsums, std::numeric_limits<double>::quiet_NaN());
  gpu_kernels().bn_stats(dx.data<float>(), bs, sums.data<double>());
  const std::vector<double> got = host_doubles(sums);

  const std::vector<double> s1 = per_channel_abs_sum(bs, [&](int64_t i) { return double{x.data<float>()[i]}; });
  const std::vector<double> s2 = per_channel_abs_sum(bs, [&](int64_t i) {
    const double v = x.data<float>()[i];
    return v * v;
  });
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    CAPTURE(ch);
    const auto c = static_cast<size_t>(ch), c2 = static_cast<size_t>(bs.c + ch);
    INFO(fmt::format("sum gpu {} cpu {}; sum of squares gpu {} cpu {}", got[c], want[c], got[c2], want[c2]));
    if (exact) {
      REQUIRE(got[c] == want[c]);
      REQUIRE(got[c2] == want[c2]);
    } else {
      REQUIRE(std::abs(got[c] - want[c]) <= 1e-10 * s1[c]);
      REQUIRE(std::abs(got[c2] - want[c2]) <= 1e-10 * s2[c]);
    }
  }
  REQUIRE(got[nsums - 1] == static_cast<double>(bs.n * bs.hw));
  REQUIRE(want[nsums - 1] == got[nsums - 1]);
}

// From the same sums (the CPU's, on both sides): mean and invstd are computed in double by the shared
// elementwise::bn_moments and rounded to float, so they agree to the last bit but for a rare rounding tie:
// 1e-6 relative. Running statistics: (1 - m) r + m b in float, fused on the GPU: 1e-6 relative + 1e-7. y = x a + b
// with a = gamma invstd, b = beta - mean a, fused on the GPU: within 1e-5 of |x a| + |b| + |mean a| (observed ~1e-7;
// the 1e-5 leaves room for the per-channel a, b rounding differently; b carries mean a's rounding, which |b| alone
// does not bound where beta and mean a nearly cancel: the H200 run of 2026-11-29 saw 2.8e-8 on y = 0.00204 at 4 x 256
// x 196, 1.36x a bound of |x a| + |b|). Every output but the running statistics starts as NaN.
TEST_CASE("cuda bn_forward_train matches the CPU: saved and running statistics, y", "[gpu][kernels]") {
  const BnCase bc = GENERATE(from_range(std::begin(kBnCases), std::end(kBnCases)));
  const BnShape bs{.n = bc.n, .c = bc.c, .hw = bc.hw};
  CAPTURE(bs.n, bs.c, bs.hw);
  std::mt19937 rng(32);
  const Tensor x = random_floats({bs.n, bs.c, bs.hw}, rng, -1.0f, 3.0f);
  const Tensor gamma = random_floats({bs.c}, rng, 0.5f, 1.5f), beta = random_floats({bs.c}, rng);
  const Tensor rm0 = random_floats({bs.c}, rng), rv0 = random_floats({bs.c}, rng, 0.5f, 2.0f);
  const float eps = 1e-5f, momentum = 0.1f;
  std::vector<double> sums(static_cast<size_t>(2 * bs.c + 1));
  cpu_kernels().bn_stats(x.data<float>(), bs, sums.data());

  Tensor rm = copy_to(rm0, Device::cpu()), rv = copy_to(rv0, Device::cpu());
  Tensor mean = Tensor::empty({bs.c}), invstd = Tensor::empty({bs.c}), y = Tensor::empty({bs.n, bs.c, bs.hw});
  cpu_kernels().bn_forward_train(x.data<float>(), gamma.data<float>(), beta.data<float>(), sums.data(), bs, eps,
                                 momentum, rm.data<float>(), rv.data<float>(), mean.data<float>(),
                                 invstd.data<float>(), y.data<float>());

  Tensor dsums = Tensor::empty({static_cast<int64_t>(sums.size())}, DType::F64);
  std::memcpy(dsums.data<double>(), sums.data(), sums.size() * sizeof(double));
  dsums = to_device(dsums);
  const Tensor d_x = to_device(x), d_gamma = to_device(gamma), d_beta = to_device(beta);
  Tensor d_rm = to_device(rm0), d_rv = to_device(rv0);
  Tensor d_mean = nan_on_device({bs.c}), d_invstd = nan_on_device({bs.c}), d_y = nan_on_device({bs.n, bs.c, bs.hw});
  gpu_kernels().bn_forward_train(d_x.data<float>(), d_gamma.data<float>(), d_beta.data<float>(),
                                 dsums.data<double>(), bs, eps, momentum, d_rm.data<float>(), d_rv.data<float>(),
                                 d_mean.data<float>(), d_invstd.data<float>(), d_y.data<float>());

  const Diff d_m = compare(to_host(d_mean), mean, 0.0, 1e-6), d_i = compare(to_host(d_invstd), invstd, 0.0, 1e-6);
  const Diff d_r1 = compare(to_host(d_rm), rm, 1e-7, 1e-6), d_r2 = compare(to_host(d_rv), rv, 1e-7, 1e-6);
  INFO("save_mean: " << d_m << "\nsave_invstd: " << d_i << "\nrunning_mean: " << d_r1 << "\nrunning_var: " << d_r2);
  REQUIRE(d_m.bad == 0);
  REQUIRE(d_i.bad == 0);
  REQUIRE(d_r1.bad == 0);
  REQUIRE(d_r2.bad == 0);

  std::vector<double> scale(y.numel());
  for (size_t i = 0; i < y.numel(); ++i) {
    const auto ch = static_cast<size_t>(static_cast<int64_t>(i) / bs.hw % bs.c);
    const double a = double{gamma.data<float>()[ch]} * invstd.data<float>()[ch];
    const double b = beta.data<float>()[ch] - mean.data<float>()[ch] * a;
    scale[i] = std::abs(x.data<float>()[i] * a) + std::abs(b) + std::abs(mean.data<float>()[ch] * a);
  }
  const Tensor got = to_host(d_y);
  const Diff d = compare(got.data<float>(), y.data<float>(), y.numel(), 0.0, 1e-5, scale.data());
  INFO("y: " << d);
  REQUIRE(d.bad == 0);
}

// y = x a + b with a = gamma / sqrt(running_var + eps) in float on both sides, fused on the GPU: within 1e-5 of
// |x a| + |b| + |running_mean a| (as for training). An empty batch writes nothing.
TEST_CASE("cuda bn_forward_eval matches the CPU", "[gpu][kernels]") {
  const BnCase bc = GENERATE(values<BnCase>({{1, 1, 1}, {3, 5, 1}, {3, 5, 49}, {4, 3, 20000}, {0, 5, 49}}));
  const BnShape bs{.n = bc.n, .c = bc.c, .hw = bc.hw};
  CAPTURE(bs.n, bs.c, bs.hw);
  std::mt19937 rng(33);
  const Tensor x = random_floats({bs.n, bs.c, bs.hw}, rng, -1.0f, 3.0f);
  const Tensor gamma = random_floats({bs.c}, rng, 0.5f, 1.5f), beta = random_floats({bs.c}, rng);
  const Tensor rm = random_floats({bs.c}, rng), rv = random_floats({bs.c}, rng, 0.5f, 2.0f);
  const float eps = 1e-5f;
  Tensor y = Tensor::empty({bs.n, bs.c, bs.hw});
  cpu_kernels().bn_forward_eval(x.data<float>(), gamma.data<float>(), beta.data<float>(), rm.data<float>(),
                                rv.data<float>(), bs, eps, y.data<float>());
  const Tensor d_x = to_device(x), d_gamma = to_device(gamma), d_beta = to_device(beta), d_rm = to_device(rm),
               d_rv = to_device(rv);
  Tensor d_y = nan_on_device({bs.n, bs.c, bs.hw});
  gpu_kernels().bn_forward_eval(d_x.data<float>(), d_gamma.data<float>(), d_beta.data<float>(), d_rm.data<float>(),
                                d_rv.data<float>(), bs, eps, d_y.data<float>());
  std::vector<double> scale(y.numel());
  for (size_t i = 0; i < y.numel(); ++i) {
    const auto ch = static_cast<size_t>(static_cast<int64_t>(i) / bs.hw % bs.c);
    const double a = gamma.data<float>()[ch] / std::sqrt(double{rv.data<float>()[ch]} + eps);
    const double ma = double{rm.data<float>()[ch]} * a;
    scale[i] = std::abs(x.data<float>()[i] * a) + std::abs(beta.data<float>()[ch] - ma) + std::abs(ma);
  }
  const Tensor got = to_host(d_y);
  const Diff d = compare(got.data<float>(), y.data<float>(), y.numel(), 0.0, 1e-5, scale.data());
  INFO("y: " << d);
  REQUIRE(d.bad == 0);
}

// sums: doubles of the same double terms (dy and dy (x - mean) invstd) in another order: 1e-10 of sum|terms| per
// channel, as bn_stats; the count exactly. dgamma and dbeta start random and accumulate the sums rounded to
// float: 1e-6 of |start| + sum|terms|. The sums start as NaN. An empty batch leaves sums 0 and adds 0.
TEST_CASE("cuda bn_backward_reduce matches the CPU: sums, dgamma and dbeta accumulate", "[gpu][kernels]") {
  const BnCase bc = GENERATE(values<BnCase>({{1, 1, 1}, {3, 5, 1}, {3, 5, 49}, {1, 5, 63}, {4, 3, 20000},
                                             {2, 3, 100003}, {0, 5, 49}, {2, 64, 3136}, {3, 128, 784},
                                             {4, 256, 196}, {5, 512, 49}}));
  const BnShape bs{.n = bc.n, .c = bc.c, .hw = bc.hw};
  CAPTURE(bs.n, bs.c, bs.hw);
  std::mt19937 rng(34);
  const Tensor x = random_floats({bs.n, bs.c, bs.hw}, rng, -1.0f, 3.0f), dy = random_floats({bs.n, bs.c, bs.hw}, rng);
  const Tensor mean = random_floats({bs.c}, rng, 0.5f, 1.5f), invstd = random_floats({bs.c}, rng, 0.5f, 2.0f);
  const Tensor dgamma0 = random_floats({bs.c}, rng), dbeta0 = random_floats({bs.c}, rng);
  const size_t nsums = static_cast<size_t>(2 * bs.c + 1);

  std::vector<double> want(nsums);
  Tensor dgamma = copy_to(dgamma0, Device::cpu()), dbeta = copy_to(dbeta0, Device::cpu());
  cpu_kernels().bn_backward_reduce(dy.data<float>(), x.data<float>(), mean.data<float>(), invstd.data<float>(), bs,
                                   want.data(), dgamma.data<float>(), dbeta.data<float>());
  const Tensor d_x = to_device(x), d_dy = to_device(dy), d_mean = to_device(mean), d_invstd = to_device(invstd);
  Tensor d_dgamma = to_device(dgamma0), d_dbeta = to_device(dbeta0);
  Tensor sums = doubles_on_device(nsums, std::numeric_limits<double>::quiet_NaN());
  gpu_kernels().bn_backward_reduce(d_dy.data<float>(), d_x.data<float>(), d_mean.data<float>(),
                                   d_invstd.data<float>(), bs, sums.data<double>(), d_dgamma.data<float>(),
                                   d_dbeta.data<float>());
  const std::vector<double> got = host_doubles(sums);

  const auto term2 = [&](int64_t i) {
    const auto ch = static_cast<size_t>(i / bs.hw % bs.c);
    return double{dy.data<float>()[i]} * (x.data<float>()[i] - double{mean.data<float>()[ch]}) *
           invstd.data<float>()[ch];
  };
  const std::vector<double> s1 = per_channel_abs_sum(bs, [&](int64_t i) { return double{dy.data<float>()[i]}; });
  const std::vector<double> s2 = per_channel_abs_sum(bs, term2);
  std::vector<double> scale_g(static_cast<size_t>(bs.c)), scale_b(static_cast<size_t>(bs.c));
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    CAPTURE(ch);
    const auto c = static_cast<size_t>(ch), c2 = static_cast<size_t>(bs.c + ch);
    INFO(fmt::format("sum dy gpu {} cpu {}; sum dy xhat gpu {} cpu {}", got[c], want[c], got[c2], want[c2]));
    REQUIRE(std::abs(got[c] - want[c]) <= 1e-10 * s1[c]);
    REQUIRE(std::abs(got[c2] - want[c2]) <= 1e-10 * s2[c]);
    scale_b[c] = std::abs(dbeta0.data<float>()[ch]) + s1[c];
    scale_g[c] = std::abs(dgamma0.data<float>()[ch]) + s2[c];
  }
  REQUIRE(got[nsums - 1] == static_cast<double>(bs.n * bs.hw));
  const Tensor g_dgamma = to_host(d_dgamma), g_dbeta = to_host(d_dbeta);
  const Diff d_g = compare(g_dgamma.data<float>(), dgamma.data<float>(), dgamma.numel(), 0.0, 1e-6, scale_g.data());
  const Diff d_b = compare(g_dbeta.data<float>(), dbeta.data<float>(), dbeta.numel(), 0.0, 1e-6, scale_b.data());
  INFO("dgamma: " << d_g << "\ndbeta: " << d_b);
  REQUIRE(d_g.bad == 0);
  REQUIRE(d_b.bad == 0);
}

// From the same sums (the CPU's): the per-channel coefficients a, b, c of dx = dy a + x b + c come from the shared
// elementwise::bn_backward_coefficients (double, rounded to float); the per-element sum is fused on the GPU.
// Tolerance: within 1e-5 of |dy a| + |x b| + |c| (observed ~1e-7). dx starts as NaN.
TEST_CASE("cuda bn_backward_data matches the CPU", "[gpu][kernels]") {
  const BnCase bc = GENERATE(from_range(std::begin(kBnCases), std::end(kBnCases)));
  const BnShape bs{.n = bc.n, .c = bc.c, .hw = bc.hw};
  CAPTURE(bs.n, bs.c, bs.hw);
  std::mt19937 rng(35);
  const Tensor x = random_floats({bs.n, bs.c, bs.hw}, rng, -1.0f, 3.0f), dy = random_floats({bs.n, bs.c, bs.hw}, rng);
  const Tensor gamma = random_floats({bs.c}, rng, 0.5f, 1.5f);
  std::vector<double> stats(static_cast<size_t>(2 * bs.c + 1)), sums(stats.size());
  cpu_kernels().bn_stats(x.data<float>(), bs, stats.data());
  Tensor mean = Tensor::empty({bs.c}), invstd = Tensor::empty({bs.c});
  for (int64_t ch = 0; ch < bs.c; ++ch) {
    const double count = stats[static_cast<size_t>(2 * bs.c)];
    const double m = stats[static_cast<size_t>(ch)] / count;
    mean.data<float>()[ch] = static_cast<float>(m);
    invstd.data<float>()[ch] =
        static_cast<float>(1.0 / std::sqrt(stats[static_cast<size_t>(bs.c + ch)] / count - m * m + 1e-5));
  }
  Tensor dg = Tensor::zeros({bs.c}), db = Tensor::zeros({bs.c});
  cpu_kernels().bn_backward_reduce(dy.data<float>(), x.data<float>(), mean.data<float>(), invstd.data<float>(), bs,
                                   sums.data(), dg.data<float>(), db.data<float>());
  Tensor want = Tensor::empty({bs.n, bs.c, bs.hw});
  cpu_kernels().bn_backward_data(dy.data<float>(), x.data<float>(), gamma.data<float>(), mean.data<float>(),
                                 invstd.data<float>(), sums.data(), bs, want.data<float>());

  Tensor dsums = Tensor::empty({static_cast<int64_t>(sums.size())}, DType::F64);
  std::memcpy(dsums.data<double>(), sums.data(), sums.size() * sizeof(double));
  dsums = to_device(dsums);
  const Tensor d_x = to_device(x), d_dy = to_device(dy), d_gamma = to_device(gamma), d_mean = to_device(mean),
               d_invstd = to_device(invstd);
  Tensor d_dx = nan_on_device({bs.n, bs.c, bs.hw});
  gpu_kernels().bn_backward_data(d_dy.data<float>(), d_x.data<float>(), d_gamma.data<float>(), d_mean.data<float>(),
                                 d_invstd.data<float>(), dsums.data<double>(), bs, d_dx.data<float>());

  const double count = sums[static_cast<size_t>(2 * bs.c)];
  std::vector<double> scale(want.numel());
  for (size_t i = 0; i < want.numel(); ++i) {
    const auto ch = static_cast<size_t>(static_cast<int64_t>(i) / bs.hw % bs.c);
    const double g = double{gamma.data<float>()[ch]} * invstd.data<float>()[ch];
    const double mdy = sums[ch] / count, mdyx = sums[static_cast<size_t>(bs.c) + ch] / count;
    const double a = g, b = -g * mdyx * invstd.data<float>()[ch], c = -g * mdy - b * mean.data<float>()[ch];
    scale[i] = std::abs(dy.data<float>()[i] * a) + std::abs(x.data<float>()[i] * b) + std::abs(c);
  }
  const Tensor got = to_host(d_dx);
  const Diff d = compare(got.data<float>(), want.data<float>(), want.numel(), 0.0, 1e-5, scale.data());
  INFO("dx: " << d);
  REQUIRE(d.bad == 0);
}

// The per-channel sums are reduced in a fixed order (runs, threads, trees: no atomics), so a rerun gives the
// same bits.
TEST_CASE("cuda bn_stats and bn_backward_reduce are bitwise deterministic", "[gpu][kernels]") {
  const BnShape bs{.n = 2, .c = 3, .hw = 100003};
  std::mt19937 rng(36);
  const Tensor x = to_device(random_floats({bs.n, bs.c, bs.hw}, rng));
  const Tensor dy = to_device(random_floats({bs.n, bs.c, bs.hw}, rng));
  const Tensor mean = to_device(random_floats({bs.c}, rng)), invstd = to_device(random_floats({bs.c}, rng, 0.5f, 2.0f));
  const size_t nsums = static_cast<size_t>(2 * bs.c + 1);
  std::vector<double> stats[2], grads[2];
  for (int run = 0; run < 2; ++run) {
    Tensor s = doubles_on_device(nsums, 0.0), g = doubles_on_device(nsums, 0.0);
    Tensor dgamma = to_device(filled({bs.c}, 0.0f)), dbeta = to_device(filled({bs.c}, 0.0f));
    gpu_kernels().bn_stats(x.data<float>(), bs, s.data<double>());
    gpu_kernels().bn_backward_reduce(dy.data<float>(), x.data<float>(), mean.data<float>(), invstd.data<float>(), bs,
                                     g.data<double>(), dgamma.data<float>(), dbeta.data<float>());
    stats[run] = host_doubles(s);
    grads[run] = host_doubles(g);
  }
  REQUIRE(bits_differ("bn_stats sums, rerun", stats[0].data(), stats[1].data(), nsums * sizeof(double),
                      DType::F64) == "");
  REQUIRE(bits_differ("bn_backward_reduce sums, rerun", grads[0].data(), grads[1].data(), nsums * sizeof(double),
                      DType::F64) == "");
}

// ---- relu, add -----------------------------------------------------------------------------------------------

// Exact: one comparison (and one addition) per element, the same on both sides. Every fifth input is exactly 0
// (relu's boundary). Outputs start as NaN; in place (y aliasing an input) too.
TEST_CASE("cuda relu and add (+relu) match the CPU exactly, also in place", "[gpu][kernels]") {
  const size_t n = GENERATE(as<size_t>{}, 0, 1, 7, 1000, 100003);
  CAPTURE(n);
  std::mt19937 rng(41);
  const auto len = static_cast<int64_t>(n);
  Tensor a = random_floats({len}, rng);
  for (size_t i = 0; i < n; i += 5) a.data<float>()[i] = 0.0f;
  const Tensor b = random_floats({len}, rng);
  const Tensor da = to_device(a), db = to_device(b);

  SECTION("relu") {
    Tensor want = Tensor::empty({len});
    cpu_kernels().relu(a.data<float>(), want.data<float>(), n);
    Tensor y = nan_on_device({len});
    gpu_kernels().relu(da.data<float>(), y.data<float>(), n);
    const Diff d = compare(to_host(y), want);
    INFO("relu y: " << d);
    REQUIRE(d.bad == 0);
    Tensor inplace = to_device(a);
    gpu_kernels().relu(inplace.data<float>(), inplace.data<float>(), n);
    REQUIRE(named_diff("relu y in place", compare(to_host(inplace), want)) == "");
  }
  SECTION("add") {
    const bool relu = GENERATE(false, true);
    CAPTURE(relu);
    Tensor want = Tensor::empty({len});
    cpu_kernels().add(a.data<float>(), b.data<float>(), want.data<float>(), n, relu);
    Tensor y = nan_on_device({len});
    gpu_kernels().add(da.data<float>(), db.data<float>(), y.data<float>(), n, relu);
    const Diff d = compare(to_host(y), want);
    INFO("add y: " << d);
    REQUIRE(d.bad == 0);
    Tensor ya = to_device(a), yb = to_device(b);
    gpu_kernels().add(ya.data<float>(), db.data<float>(), ya.data<float>(), n, relu);  // y == a
    gpu_kernels().add(da.data<float>(), yb.data<float>(), yb.data<float>(), n, relu);  // y == b
    REQUIRE(named_diff("add y in place over a", compare(to_host(ya), want)) == "");
    REQUIRE(named_diff("add y in place over b", compare(to_host(yb), want)) == "");
  }
}

// ---- pooling -------------------------------------------------------------------------------------------------

namespace {

PoolShape pool_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel, int64_t stride, int64_t pad) {
  PoolShape ps{.n = n, .c = c, .h = h, .w = w, .kernel = kernel, .stride = stride, .pad = pad};
  REQUIRE(pool_output_size(ps));
  return ps;
}

// 1x1; 2x2/2 (disjoint windows); ResNet's 3x3/2 pad 1 (overlapping, padded); 3x3/1 pad 1 (each input in up to 9
// windows); 3x3/3 pad 1 on odd planes; a 7x7 window, stride 1, pad 3; an empty batch.
std::vector<PoolShape> pool_cases() {
  return {pool_shape(1, 1, 1, 1, 1, 1, 0),  pool_shape(3, 5, 9, 7, 2, 2, 0),  pool_shape(3, 5, 9, 7, 3, 2, 1),
          pool_shape(1, 1, 8, 8, 3, 1, 1),  pool_shape(3, 5, 10, 11, 3, 3, 1), pool_shape(2, 3, 7, 7, 7, 1, 3),
          pool_shape(0, 5, 9, 7, 3, 2, 1),
          // ResNet's stem (3/2 pad 1 on 112^2, 64 channels) and an odd-sized plane with the same window.
          pool_shape(2, 64, 112, 112, 3, 2, 1), pool_shape(3, 4, 57, 55, 3, 2, 1)};
}

}  // namespace

// Exact: both scan each window r then s with the shared rule (elementwise::maxpool_takes), so y and argmax agree
// bit for bit. Values: random floats; coarse values (ties everywhere: the first index must win); coarse values
// with NaNs (a NaN wins, and the same NaN on both sides). y and argmax start as NaN and -7.
TEST_CASE("cuda maxpool2d_forward matches the CPU exactly: values, argmax, ties, NaN", "[gpu][kernels]") {
  const std::vector<PoolShape> cases = pool_cases();
  const auto which = static_cast<size_t>(GENERATE(range(0, 9)));
  REQUIRE(which < cases.size());
  const PoolShape ps = cases[which];
  const int inputs = GENERATE(0, 1, 2);  // random, coarse (ties), coarse with NaNs
  CAPTURE(ps.n, ps.c, ps.h, ps.w, ps.kernel, ps.stride, ps.pad, inputs);
  std::mt19937 rng(51);
  Tensor x = inputs == 0 ? random_floats({ps.n, ps.c, ps.h, ps.w}, rng) : coarse({ps.n, ps.c, ps.h, ps.w}, rng);
  if (inputs == 2)
    for (size_t i = 3; i < x.numel(); i += 17) x.data<float>()[i] = kNaN;
  Tensor want_y = Tensor::empty({ps.n, ps.c, ps.p, ps.q});
  Tensor want_arg = Tensor::empty({ps.n, ps.c, ps.p, ps.q}, DType::I32);
  cpu_kernels().maxpool2d_forward(x.data<float>(), want_y.data<float>(), want_arg.data<int32_t>(), ps);

  const Tensor dx = to_device(x);
  Tensor y = nan_on_device({ps.n, ps.c, ps.p, ps.q});
  Tensor arg0 = Tensor::empty({ps.n, ps.c, ps.p, ps.q}, DType::I32);
  for (size_t i = 0; i < arg0.numel(); ++i) arg0.data<int32_t>()[i] = -7;
  Tensor arg = to_device(arg0);
  gpu_kernels().maxpool2d_forward(dx.data<float>(), y.data<float>(), arg.data<int32_t>(), ps);
  const Tensor got_y = to_host(y), got_arg = to_host(arg);
  REQUIRE(bits_differ("argmax", got_arg, want_arg) == "");
  if (inputs == 2) {
    REQUIRE(bits_differ("y", got_y, want_y) == "");
  } else {
    const Diff d = compare(got_y, want_y);
    INFO("y: " << d);
    REQUIRE(d.bad == 0);
  }
}

// Exact: the GPU gathers, for each input element, the dy of the windows whose argmax it is in (p, q) order; the
// CPU scatters in the same order from zero, so each element sees the same additions. Coarse inputs make one
// element the argmax of several overlapping windows. dx starts as NaN (elements no window took must become 0).
TEST_CASE("cuda maxpool2d_backward matches the CPU exactly, overlapping windows included", "[gpu][kernels]") {
  const std::vector<PoolShape> cases = pool_cases();
  const auto which = static_cast<size_t>(GENERATE(range(0, 9)));
  REQUIRE(which < cases.size());
  const PoolShape ps = cases[which];
  CAPTURE(ps.n, ps.c, ps.h, ps.w, ps.kernel, ps.stride, ps.pad);
  std::mt19937 rng(52);
  const Tensor x = coarse({ps.n, ps.c, ps.h, ps.w}, rng);
  const Tensor dy = random_floats({ps.n, ps.c, ps.p, ps.q}, rng);
  Tensor y = Tensor::empty({ps.n, ps.c, ps.p, ps.q}), arg = Tensor::empty({ps.n, ps.c, ps.p, ps.q}, DType::I32);
  cpu_kernels().maxpool2d_forward(x.data<float>(), y.data<float>(), arg.data<int32_t>(), ps);
  Tensor want = Tensor::empty({ps.n, ps.c, ps.h, ps.w});
  cpu_kernels().maxpool2d_backward(dy.data<float>(), arg.data<int32_t>(), want.data<float>(), ps);

  const Tensor d_dy = to_device(dy), d_arg = to_device(arg);
  Tensor dx = nan_on_device({ps.n, ps.c, ps.h, ps.w});
  gpu_kernels().maxpool2d_backward(d_dy.data<float>(), d_arg.data<int32_t>(), dx.data<float>(), ps);
  const Diff d = compare(to_host(dx), want);
  INFO("dx: " << d);
  REQUIRE(d.bad == 0);
}

// Exact: one thread per row adds the row in index order in float and multiplies by the float 1/hw, as the CPU
// loop; backward writes dy * (1/hw). Outputs start as NaN.
TEST_CASE("cuda avgpool forward and backward match the CPU exactly", "[gpu][kernels]") {
  const int64_t rows = GENERATE(as<int64_t>{}, 0, 1, 7, 1536);
  const int64_t hw = GENERATE(as<int64_t>{}, 1, 49, 3136);
  CAPTURE(rows, hw);
  std::mt19937 rng(53);
  const Tensor x = random_floats({rows, hw}, rng), dy = random_floats({rows}, rng);
  Tensor want_y = Tensor::empty({rows}), want_dx = Tensor::empty({rows, hw});
  cpu_kernels().avgpool_forward(x.data<float>(), want_y.data<float>(), rows, hw);
  cpu_kernels().avgpool_backward(dy.data<float>(), want_dx.data<float>(), rows, hw);
  const Tensor d_x = to_device(x), d_dy = to_device(dy);
  Tensor y = nan_on_device({rows}), dx = nan_on_device({rows, hw});
  gpu_kernels().avgpool_forward(d_x.data<float>(), y.data<float>(), rows, hw);
  gpu_kernels().avgpool_backward(d_dy.data<float>(), dx.data<float>(), rows, hw);
  const Diff d_y = compare(to_host(y), want_y), d_dx = compare(to_host(dx), want_dx);
  INFO("y: " << d_y << "\ndx: " << d_dx);
  REQUIRE(d_y.bad == 0);
  REQUIRE(d_dx.bad == 0);
}
