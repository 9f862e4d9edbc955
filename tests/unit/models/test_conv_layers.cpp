// tests/unit/models/test_conv_layers.cpp: the convolutional network's layers and blocks (Conv2d, BatchNorm2d,
// ReLU, MaxPool2d, AdaptiveAvgPool2d, BasicBlock, Bottleneck, whole ResNets) on the CPU kernel set: input and
// parameter gradients against central finite differences, forward results against naive loops and closed
// forms, BatchNorm's running statistics and modes, torchvision's names and shapes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <array>
#include <map>
#include <random>

#include "model_testing.h"
#include "models/kernels/factory.h"
#include "models/model.h"
#include "models/resnet.h"
#include "core/bfloat16.h"
#include "models/kernels/cpu/onednn_conv.h"

using namespace dpt;
using namespace dpt::models;
using dpt::test::random_tensor;
using dpt::test::check_gradients;
using dpt::test::wrap;

// Kernels::conv2d_backward (what Conv2d's backward calls, so that the CUDA set can round dy once): by default the
// weight gradient accumulated, then the data gradient, bit for bit as the two calls; dx null: dw alone.
TEST_CASE("conv2d_backward is backward weight then backward data, dx null leaving only dw", "[models][conv]") {
  std::mt19937_64 rng(5);
  Kernels& k = kernels_for(Device::cpu());
  ConvShape cs{.n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .r = 3, .s = 3, .stride = 2, .pad = 1};
  REQUIRE(conv_output_size(cs));
  const Tensor x = random_tensor({cs.n, cs.c, cs.h, cs.w}, rng), w = random_tensor({cs.k, cs.c, cs.r, cs.s}, rng);
  const Tensor dy = random_tensor({cs.n, cs.k, cs.p, cs.q}, rng), dw0 = random_tensor({cs.k, cs.c, cs.r, cs.s}, rng);
  Tensor dx_apart = Tensor::empty(x.shape()), dw_apart = Tensor::empty(w.shape());
  dw_apart.copy_from(dw0);
  k.conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw_apart.data<float>(), cs);
  k.conv2d_backward_data(dy.data<float>(), w.data<float>(), dx_apart.data<float>(), cs);
  for (const bool with_dx : {true, false}) {
    INFO(with_dx);
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape());
    for (size_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] = 7.0f;
    dw.copy_from(dw0);
    k.conv2d_backward(dy.data<float>(), x.data<float>(), w.data<float>(), with_dx ? dx.data<float>() : nullptr,
                      dw.data<float>(), cs);
    REQUIRE(std::memcmp(dw.data<float>(), dw_apart.data<float>(), dw.bytes()) == 0);
    if (with_dx) {
      REQUIRE(std::memcmp(dx.data<float>(), dx_apart.data<float>(), dx.bytes()) == 0);
    } else {
      for (size_t i = 0; i < dx.numel(); ++i) REQUIRE(dx.data<float>()[i] == 7.0f);
    }
  }
}

TEST_CASE("conv2d forward matches a naive loop (stride, padding, rectangular input, 1x1)", "[models][conv]") {
  std::mt19937_64 rng(1);
  Kernels& k = kernels_for(Device::cpu());
  for (auto [c, kk, r, stride, pad, h, w] : std::vector<std::array<int64_t, 7>>{
           {3, 4, 3, 1, 1, 5, 6}, {2, 3, 3, 2, 1, 7, 5}, {1, 2, 7, 2, 3, 9, 9}, {5, 3, 1, 1, 0, 4, 3}, {4, 6, 1, 2, 0, 5, 5},
           {1, 1, 3, 1, 0, 3, 3}}) {
    ConvShape cs{.n = 2, .c = c, .h = h, .w = w, .k = kk, .r = r, .s = r, .stride = stride, .pad = pad};
    REQUIRE(conv_output_size(cs));
    Tensor x = random_tensor({cs.n, c, h, w}, rng), wt = random_tensor({kk, c, r, r}, rng);
    Tensor y = Tensor::empty({cs.n, kk, cs.p, cs.q});
    k.conv2d_forward(x.data<float>(), wt.data<float>(), y.data<float>(), cs);
    for (int64_t n = 0; n < cs.n; ++n)
      for (int64_t o = 0; o < kk; ++o)
        for (int64_t p = 0; p < cs.p; ++p)
          for (int64_t q = 0; q < cs.q; ++q) {
            double s = 0;
            for (int64_t ci = 0; ci < c; ++ci)
              for (int64_t i = 0; i < r; ++i)
                for (int64_t j = 0; j < r; ++j) {
                  const int64_t hh = p * stride - pad + i, ww = q * stride - pad + j;
                  if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
                  s += double(x.data<float>()[((n * c + ci) * h + hh) * w + ww]) * wt.data<float>()[((o * c + ci) * r + i) * r + j];
                }
            REQUIRE(y.data<float>()[((n * kk + o) * cs.p + p) * cs.q + q] == Approx(s).margin(1e-5));
          }
  }
}

namespace {

float round_to(float x, Precision p) {
  return p == Precision::BF16 ? dpt::round_to_bf16(x) : p == Precision::F16 ? float(static_cast<_Float16>(x)) : x;
}

}  // namespace

TEST_CASE("conv2d forward and both backwards match naive loops: oneDNN and im2col, fp32, bf16 and fp16",
          "[models][conv]") {
  std::mt19937_64 rng(7);
  Kernels& k = kernels_for(Device::cpu());
  // {c, k, kernel, stride, pad, h, w}: ResNet's shapes in small (3x3 same, 3x3 stride 2, the 1x1 downsample on
  // an even size, where oneDNN's right padding is negative, the 7x7 stem) and odd ones; then the small-stem
  // ResNet's own on Fashion-MNIST: the 1-channel 28x28 stem (oneDNN pads its one channel to a block) and layer2's
  // 28 -> 14 3x3 and 1x1 convolutions, at full size (integration.resnet_torch_parity's shapes); last, those with one
  // output position whose window covers the input (one GEMM over the batch: ResNet's last stage at 32 px, 3x3 on
  // 1x1 and 3x3 stride 2 on 2x2, a 5x5 stride 3 on 3x3, an unpadded 3x3 on 3x3, a 1x1 on 1x1).
  const std::vector<std::array<int64_t, 7>> shapes = {{16, 16, 3, 1, 1, 6, 6}, {8, 16, 3, 2, 1, 8, 8},
                                                      {8, 16, 1, 2, 0, 8, 8},  {3, 8, 7, 2, 3, 11, 10},
                                                      {5, 3, 1, 1, 0, 4, 3},   {3, 4, 3, 2, 1, 3, 3},
                                                      {1, 64, 3, 1, 1, 28, 28}, {64, 32, 3, 2, 1, 28, 28},
                                                      {64, 32, 1, 2, 0, 28, 28}, {16, 24, 3, 1, 1, 1, 1},
                                                      {8, 16, 3, 2, 1, 2, 2},  {4, 6, 5, 3, 2, 3, 3},
                                                      {4, 5, 3, 2, 0, 3, 3},   {6, 4, 1, 1, 0, 1, 1}};
  for (const bool onednn_on : {true, false})
    for (const Precision prec : {Precision::F32, Precision::BF16, Precision::F16})
      for (auto [c, kk, r, stride, pad, h, w] : shapes) {
        INFO("oneDNN " << onednn_on << ", precision " << int(prec) << ", c " << c << " k " << kk << " r " << r
                       << " stride " << stride << " pad " << pad << " " << h << "x" << w);
        ConvShape cs{.n = 3, .c = c, .h = h, .w = w, .k = kk, .r = r, .s = r, .stride = stride, .pad = pad};
        REQUIRE(conv_output_size(cs));
        Tensor x = random_tensor({cs.n, c, h, w}, rng), wt = random_tensor({kk, c, r, r}, rng);
        Tensor dy = random_tensor({cs.n, kk, cs.p, cs.q}, rng), dw0 = random_tensor({kk, c, r, r}, rng);
        Tensor y = Tensor::empty(dy.shape()), dx = Tensor::empty(x.shape()), dw = Tensor::empty(wt.shape());
        dw.copy_from(dw0);
        models::onednn::set_enabled(onednn_on);
        k.set_precision(prec);
        k.conv2d_forward(x.data<float>(), wt.data<float>(), y.data<float>(), cs);
        k.conv2d_backward_data(dy.data<float>(), wt.data<float>(), dx.data<float>(), cs);
        k.conv2d_backward_weight(dy.data<float>(), x.data<float>(), dw.data<float>(), cs);
        k.set_precision(Precision::F32);
        models::onednn::set_enabled(true);
        // The reference: operands rounded to the precision, products summed in double.
        std::vector<double> y_ref(y.numel()), dx_ref(x.numel()), dw_ref(wt.numel());
        for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] = dw0.data<float>()[i];
        auto at = [](const Tensor& t, size_t i, Precision p) { return double(round_to(t.data<float>()[i], p)); };
        for (int64_t n = 0; n < cs.n; ++n)
          for (int64_t o = 0; o < kk; ++o)
            for (int64_t p = 0; p < cs.p; ++p)
              for (int64_t q = 0; q < cs.q; ++q) {
                const size_t yi = ((n * kk + o) * cs.p + p) * cs.q + q;
                for (int64_t ci = 0; ci < c; ++ci)
                  for (int64_t i = 0; i < r; ++i)
                    for (int64_t j = 0; j < r; ++j) {
                      const int64_t hh = p * stride - pad + i, ww = q * stride - pad + j;
                      if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
                      const size_t xi = ((n * c + ci) * h + hh) * w + ww, wi = ((o * c + ci) * r + i) * r + j;
                      y_ref[yi] += at(x, xi, prec) * at(wt, wi, prec);
                      dx_ref[xi] += at(dy, yi, prec) * at(wt, wi, prec);
                      dw_ref[wi] += at(dy, yi, prec) * at(x, xi, prec);
                    }
              }
        auto compare = [](const Tensor& got, const std::vector<double>& want, const char* what) {
          for (size_t i = 0; i < want.size(); ++i) {
            INFO(what << " " << i << ": " << got.data<float>()[i] << " vs " << want[i]);
            REQUIRE(got.data<float>()[i] == Approx(want[i]).epsilon(1e-4).margin(2e-4));
          }
        };
        compare(y, y_ref, "y");
        compare(dx, dx_ref, "dx");
        compare(dw, dw_ref, "dw (accumulated onto its old value)");
      }
}

TEST_CASE("conv2d on an empty batch computes nothing and leaves dw as it was: oneDNN and im2col", "[models][conv]") {
  std::mt19937_64 rng(9);
  Kernels& k = kernels_for(Device::cpu());
  for (const int64_t hw : {5, 1}) {  // 1: the single-window GEMM's path
    for (const bool onednn_on : {true, false}) {
      ConvShape cs{.n = 0, .c = 4, .h = hw, .w = hw, .k = 6, .r = 3, .s = 3, .stride = 1, .pad = 1};
      REQUIRE(conv_output_size(cs));
      INFO("oneDNN " << onednn_on << ", " << hw << "x" << hw);
      const Tensor dw0 = random_tensor({6, 4, 3, 3}, rng);
      Tensor dw = Tensor::empty(dw0.shape());
      dw.copy_from(dw0);
      float none = 0.0f;  // no element is read or written; any valid pointer does
      models::onednn::set_enabled(onednn_on);
      k.conv2d_forward(&none, dw0.data<float>(), &none, cs);
      k.conv2d_backward_data(&none, dw0.data<float>(), &none, cs);
      k.conv2d_backward_weight(&none, &none, dw.data<float>(), cs);
      models::onednn::set_enabled(true);
      for (size_t i = 0; i < dw.numel(); ++i) REQUIRE(dw.data<float>()[i] == dw0.data<float>()[i]);
    }
  }
}

TEST_CASE("Conv2d gradients match finite differences", "[models][conv]") {
  std::mt19937_64 rng(2);
  SECTION("3x3, stride 1, padding 1") { auto m = wrap(std::make_unique<Conv2d>(2, 3, 3, 1, 1)); check_gradients(*m, random_tensor({2, 2, 5, 4}, rng), 10); }
  SECTION("3x3, stride 2, padding 1, odd size") { auto m = wrap(std::make_unique<Conv2d>(3, 2, 3, 2, 1)); check_gradients(*m, random_tensor({1, 3, 7, 7}, rng), 11); }
  SECTION("7x7 stride 2 padding 3 (the ImageNet stem)") { auto m = wrap(std::make_unique<Conv2d>(1, 2, 7, 2, 3)); check_gradients(*m, random_tensor({2, 1, 9, 8}, rng), 12); }
  SECTION("1x1 pointwise") { auto m = wrap(std::make_unique<Conv2d>(4, 3, 1)); check_gradients(*m, random_tensor({3, 4, 2, 3}, rng), 13); }
  SECTION("3x3 padding 1 on a 2x2 input (kernel wider than the image)") { auto m = wrap(std::make_unique<Conv2d>(3, 4, 3, 1, 1)); check_gradients(*m, random_tensor({2, 3, 2, 2}, rng), 15); }
  SECTION("3x3 stride 2 padding 1 on 3x3") { auto m = wrap(std::make_unique<Conv2d>(2, 3, 3, 2, 1)); check_gradients(*m, random_tensor({2, 2, 3, 3}, rng), 16); }
  SECTION("1x1 stride 2 (a downsample)") { auto m = wrap(std::make_unique<Conv2d>(3, 5, 1, 2)); check_gradients(*m, random_tensor({2, 3, 5, 5}, rng), 14); }
}

TEST_CASE("Conv2d rejects inputs too small or with the wrong channels", "[models][conv]") {
  auto m = wrap(std::make_unique<Conv2d>(2, 3, 5));
  REQUIRE_THROWS_AS(m->forward(Tensor::zeros({1, 2, 3, 3})), ConfigError);
  REQUIRE_THROWS_AS(m->forward(Tensor::zeros({1, 3, 8, 8})), InternalError);
}

TEST_CASE("BatchNorm2d: training normalises per channel and moves the running statistics", "[models][bn]") {
  // One channel, values 1..4 (n 2, hw 2): mean 2.5, biased var 1.25, unbiased 5/3.
  auto bn = std::make_unique<BatchNorm2d>(1);
  auto* raw = bn.get();
  auto m = wrap(std::move(bn));
  Tensor x = Tensor::empty({2, 1, 1, 2});
  for (int i = 0; i < 4; ++i) x.data<float>()[i] = static_cast<float>(i + 1);
  const Tensor& y = m->forward(x);
  const double invstd = 1.0 / std::sqrt(1.25 + 1e-5);
  for (int i = 0; i < 4; ++i) REQUIRE(y.data<float>()[i] == Approx((i + 1 - 2.5) * invstd).epsilon(1e-6));
  const auto& buffers = m->named_buffers();
  REQUIRE(buffers.size() == 2);
  REQUIRE(buffers[0].name == "running_mean");
  REQUIRE(buffers[0].tensor.data<float>()[0] == Approx(0.25));              // 0.9 * 0 + 0.1 * 2.5
  REQUIRE(buffers[1].tensor.data<float>()[0] == Approx(0.9 + 0.1 * 5.0 / 3));  // from 1, unbiased
  // Evaluation mode uses the running statistics and leaves them alone.
  m->set_training(false);
  const Tensor& ye = m->forward(x);
  REQUIRE(ye.data<float>()[0] == Approx((1 - 0.25) / std::sqrt(0.9 + 0.5 / 3 + 1e-5)).epsilon(1e-5));
  REQUIRE(buffers[0].tensor.data<float>()[0] == Approx(0.25));
  // num_batches_tracked counts training forwards and is part of the state, as a 0-d int64.
  const auto state = m->state();
  REQUIRE(state.size() == 5);
  REQUIRE(state[4].name == "num_batches_tracked");
  REQUIRE(state[4].tensor.dtype() == DType::I64);
  REQUIRE(state[4].tensor.ndim() == 0);
  REQUIRE(state[4].tensor.data<int64_t>()[0] == 1);
  REQUIRE_FALSE(raw->synced());
  // One value per channel cannot be normalised in training.
  m->set_training(true);
  REQUIRE_THROWS_AS(m->forward(Tensor::zeros({1, 1, 1, 1})), ConfigError);
}

TEST_CASE("BatchNorm2d gradients match finite differences (training mode)", "[models][bn]") {
  std::mt19937_64 rng(4);
  auto m = wrap(std::make_unique<BatchNorm2d>(3));
  // Non-trivial affine parameters so dgamma and dbeta matter.
  for (size_t i = 0; i < m->num_params(); ++i) m->params().data<float>()[i] = uniform(rng, 0.5f, 1.5f);
  check_gradients(*m, random_tensor({4, 3, 2, 3}, rng, 2.0f), 20, 1e-2f, 3e-2, 3e-3);
}

TEST_CASE("ReLU, MaxPool2d and AdaptiveAvgPool2d: forward and gradients", "[models][pool]") {
  std::mt19937_64 rng(5);
  SECTION("ReLU") { auto m = wrap(std::make_unique<ReLU>()); check_gradients(*m, random_tensor({2, 3, 4, 4}, rng), 30, 1e-3f); }
  SECTION("MaxPool2d 3x3 stride 2 padding 1") {
    auto m = wrap(std::make_unique<MaxPool2d>(3, 2, 1));
    check_gradients(*m, random_tensor({2, 2, 7, 6}, rng), 31, 1e-3f);
  }
  SECTION("MaxPool2d picks the first maximum and never a padded position") {
    auto m = wrap(std::make_unique<MaxPool2d>(3, 2, 1));
    Tensor x = Tensor::empty({1, 1, 2, 2});
    for (int i = 0; i < 4; ++i) x.data<float>()[i] = -5.0f;  // all negative: padding (as -inf) must not win
    const Tensor& y = m->forward(x);
    REQUIRE(y.shape() == std::vector<int64_t>{1, 1, 1, 1});
    REQUIRE(y.data<float>()[0] == -5.0f);
    Tensor dy = Tensor::empty({1, 1, 1, 1});
    dy.data<float>()[0] = 1.0f;
    const Tensor& dx = m->backward(dy);
    REQUIRE(dx.data<float>()[0] == 1.0f);  // the first of the tied maxima
    for (int i = 1; i < 4; ++i) REQUIRE(dx.data<float>()[i] == 0.0f);
  }
  SECTION("AdaptiveAvgPool2d") {
    auto m = wrap(std::make_unique<AdaptiveAvgPool2d>());
    Tensor x = random_tensor({2, 3, 3, 5}, rng);
    const Tensor& y = m->forward(x);
    REQUIRE(y.shape() == std::vector<int64_t>{2, 3, 1, 1});
    double s = 0;
    for (int i = 0; i < 15; ++i) s += x.data<float>()[15 + i];
    REQUIRE(y.data<float>()[1] == Approx(s / 15).epsilon(1e-5));
    check_gradients(*m, x, 32);
  }
}

TEST_CASE("residual blocks: gradients match finite differences", "[models][resnet]") {
  std::mt19937_64 rng(6);
  // Steps of 1e-3: a step of 1e-2 crosses the ReLU kinks of some elements (checked: the analytic values
  // agree with differences at 1e-3 and 3e-4).
  SECTION("BasicBlock, identity shortcut") { auto m = wrap(std::make_unique<BasicBlock>(3, 3, 1)); check_gradients(*m, random_tensor({3, 3, 4, 4}, rng), 40, 1e-3f, 3e-2, 5e-3, 150); }
  SECTION("BasicBlock, stride 2 with downsample") { auto m = wrap(std::make_unique<BasicBlock>(2, 4, 2)); check_gradients(*m, random_tensor({3, 2, 5, 5}, rng), 41, 1e-3f, 3e-2, 5e-3, 150); }
  SECTION("BasicBlock, stride 2 on 3x3 (a 2x2 output)") { auto m = wrap(std::make_unique<BasicBlock>(3, 5, 2)); check_gradients(*m, random_tensor({4, 3, 3, 3}, rng), 43, 1e-3f, 3e-2, 5e-3, 150); }
  SECTION("Bottleneck with downsample") { auto m = wrap(std::make_unique<Bottleneck>(4, 2, 2)); check_gradients(*m, random_tensor({3, 4, 4, 4}, rng), 42, 1e-3f, 3e-2, 5e-3, 150); }
}

TEST_CASE("a small ResNet: parameter gradients through the whole network and the loss", "[models][resnet]") {
  ResNetOptions o;
  o.blocks = {1, 1};
  o.widths = {4, 8};
  o.in_channels = 2;
  o.num_classes = 3;
  o.small_stem = true;
  auto model = make_resnet(o, "tiny");
  model->init(9);
  std::mt19937_64 rng(8);
  Tensor x = random_tensor({4, 2, 6, 6}, rng, 2.0f);
  Tensor labels = Tensor::empty({4}, DType::I32);
  for (int i = 0; i < 4; ++i) labels.data<int32_t>()[i] = i % 3;
  SoftmaxCrossEntropy loss;
  auto loss_at = [&] {
    auto r = loss.forward(model->forward(x), labels, model->kernels());
    return r.loss_sum / static_cast<double>(r.count);
  };
  model->zero_grad();
  loss.forward_backward(model->forward(x), labels, model->kernels());
  REQUIRE_FALSE(model->backward(loss.grad()).defined());  // the stem needs no input gradient
  std::vector<float> g(model->grads().data<float>(), model->grads().data<float>() + model->num_params());
  float* p = model->params().data<float>();
  for (size_t i = 0; i < model->num_params(); i += 7) {
    const float saved = p[i];
    // A small step: with a batch of 4, BatchNorm makes the loss strongly curved (1e-2 is already too far).
    p[i] = saved + 1e-3f;
    const double lp = loss_at();
    p[i] = saved - 1e-3f;
    const double lm = loss_at();
    p[i] = saved;
    INFO("parameter " << i << " (" << model->num_params() << ")");
    REQUIRE(g[i] == Approx((lp - lm) / 2e-3).epsilon(3e-2).margin(1e-3));
  }
}

TEST_CASE("ResNet-18 and -50 have torchvision's names, shapes and sizes", "[models][resnet]") {
  auto r18 = make_resnet(resnet_preset(18), "resnet18");
  REQUIRE(r18->num_params() == 11689512);  // torchvision.models.resnet18(): sum of p.numel()
  auto r50 = make_resnet(resnet_preset(50), "resnet50");
  REQUIRE(r50->num_params() == 25557032);
  auto r34o = resnet_preset(34);
  r34o.num_classes = 10;
  auto r34 = make_resnet(r34o, "resnet34");
  REQUIRE(r34->num_params() == 21289802);  // resnet34(num_classes=10)
  const auto state = r18->state();
  // The first and last entries of torchvision's resnet18().state_dict(), and a downsample.
  REQUIRE(state.size() == 122);
  REQUIRE(state[0].name == "conv1.weight");
  REQUIRE(state[0].tensor.shape() == std::vector<int64_t>{64, 3, 7, 7});
  REQUIRE(state[1].name == "bn1.weight");
  REQUIRE(state[3].name == "bn1.running_mean");
  REQUIRE(state[5].name == "bn1.num_batches_tracked");
  REQUIRE(state[6].name == "layer1.0.conv1.weight");
  REQUIRE(state[120].name == "fc.weight");
  REQUIRE(state[121].name == "fc.bias");
  bool downsample = false;
  for (const auto& nt : state)
    if (nt.name == "layer2.0.downsample.0.weight") {
      downsample = true;
      REQUIRE(nt.tensor.shape() == std::vector<int64_t>{128, 64, 1, 1});
    }
  REQUIRE(downsample);
  // ImageNet-sized forward: [2, 3, 64, 64] -> [2, 1000].
  r18->init(1);
  r18->set_training(false);
  Tensor x = Tensor::zeros({2, 3, 64, 64});
  REQUIRE(r18->forward(x).shape() == std::vector<int64_t>{2, 1000});
}

TEST_CASE("ResNet initialisation follows torchvision: BN 1/0, convs kaiming normal fan_out", "[models][resnet]") {
  auto o = resnet_preset(18);
  o.widths = {16, 32, 64, 128};
  auto m = make_resnet(o, "r");
  m->init(3);
  for (const auto& np : m->named_params()) {
    const float* v = np.param.data<float>();
    if (np.name.find("bn") != std::string::npos || np.name.find("downsample.1") != std::string::npos) {
      const float want = np.name.ends_with("weight") ? 1.0f : 0.0f;
      for (size_t i = 0; i < np.param.numel(); ++i) REQUIRE(v[i] == want);
    } else if (np.param.ndim() == 4 && np.param.numel() > 2000) {
      const double fan_out = static_cast<double>(np.param.dim(0) * np.param.dim(2) * np.param.dim(3));
      double ss = 0;
      for (size_t i = 0; i < np.param.numel(); ++i) ss += double(v[i]) * v[i];
      INFO(np.name);
      REQUIRE(std::sqrt(ss / np.param.numel()) == Approx(std::sqrt(2.0 / fan_out)).epsilon(0.1));
    }
  }
  for (const auto& b : m->named_buffers()) {
    const float want = b.name.ends_with("running_var") ? 1.0f : 0.0f;
    REQUIRE(b.tensor.data<float>()[0] == want);
  }
}

TEST_CASE("load_state: a missing key or a wrong shape names the key and changes nothing", "[models][resnet]") {
  ResNetOptions o;
  o.blocks = {1};
  o.widths = {4};
  o.in_channels = 1;
  o.num_classes = 2;
  o.small_stem = true;
  auto a = make_resnet(o, "a"), b = make_resnet(o, "b");
  a->init(1);
  b->init(2);
  auto state = a->state();
  std::map<std::string, Tensor> by_name;
  for (auto& nt : state) by_name[nt.name] = nt.tensor;
  auto find = [&](const std::string& n) -> const Tensor* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : &it->second;
  };
  const std::vector<float> before(b->params().data<float>(), b->params().data<float>() + b->num_params());
  by_name.erase("layer1.0.bn2.running_var");
  REQUIRE_THROWS_WITH(b->load_state(find, "file"), Catch::Contains("layer1.0.bn2.running_var"));
  by_name["layer1.0.bn2.running_var"] = Tensor::zeros({4});
  by_name["fc.weight"] = Tensor::zeros({3, 4});
  REQUIRE_THROWS_WITH(b->load_state(find, "file"), Catch::Contains("fc.weight"));
  REQUIRE(std::equal(before.begin(), before.end(), b->params().data<float>()));
  by_name["fc.weight"] = state[state.size() - 2].tensor;
  // A counter (num_batches_tracked) that is no count: a bool (uint8), a float NaN, a float past int64. It was read
  // after the weights had been copied (a bool: an error with the model half loaded; the floats: undefined
  // conversions); now it is refused, naming it, and nothing changes.
  const std::string counter = "layer1.0.bn1.num_batches_tracked";
  REQUIRE(by_name.count(counter));
  const Tensor good_counter = by_name[counter];
  const auto one = [](DType dtype, double v) {
    Tensor t = Tensor::empty({}, dtype);
    if (dtype == DType::U8) t.data<uint8_t>()[0] = static_cast<uint8_t>(v);
    if (dtype == DType::F32) t.data<float>()[0] = static_cast<float>(v);
    return t;
  };
  for (const Tensor& bad : {one(DType::U8, 1), one(DType::F32, std::nan("")), one(DType::F32, 1e30),
                            one(DType::F32, 2.5)}) {
    by_name[counter] = bad;
    REQUIRE_THROWS_WITH(b->load_state(find, "file"), Catch::Contains(counter));
    REQUIRE(std::equal(before.begin(), before.end(), b->params().data<float>()));
  }
  by_name[counter] = Tensor::zeros({2}, DType::I64);  // two counts: the file's error, not an internal check's
  REQUIRE_THROWS_AS(b->load_state(find, "file"), CheckpointError);
  REQUIRE_THROWS_WITH(b->load_state(find, "file"), Catch::Contains(counter + " has shape [2], expected one element"));
  by_name[counter] = one(DType::F32, 3);  // a float holding a count loads, as torch's copy_ converts it
  b->load_state(find, "file");
  bool found = false;
  for (const auto& nt : b->state())
    if (nt.name == counter) found = nt.tensor.data<int64_t>()[0] == 3;
  REQUIRE(found);
  by_name[counter] = good_counter;
  b->load_state(find, "file");
  REQUIRE(std::equal(a->params().data<float>(), a->params().data<float>() + a->num_params(), b->params().data<float>()));
}
