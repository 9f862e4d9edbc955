// tests/unit/models/test_models.cpp: layer and model gradients against finite differences; the loss and the
// optimizer updates against closed forms; the CPU GEMM against a naive loop.
#include <catch2/catch.hpp>

#include <array>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include <omp.h>
#include <sys/time.h>

#include "model_testing.h"
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/kernels/elementwise.h"
#include "models/kernels/factory.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;
using dpt::test::random_tensor;

namespace {

Tensor labels_tensor(std::vector<int32_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

double model_loss(Model& m, const Tensor& x, const Tensor& y) {
  SoftmaxCrossEntropy loss;
  auto r = loss.forward(m.forward(x), y, m.kernels());
  return r.loss_sum / static_cast<double>(r.count);
}

}  // namespace

TEST_CASE("gemm matches a naive loop for every transpose combination and odd sizes, in oneDNN and OpenBLAS",
          "[models]") {
  std::mt19937_64 rng(1);
  Kernels& k = kernels_for(Device::cpu());
  for (const bool onednn : {true, false})
    for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{5, 7, 3}, {37, 53, 29}, {1, 70, 33}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          INFO("oneDNN " << onednn << ", " << M << "x" << N << "x" << K << ", trans " << ta << tb);
          Tensor A = ta ? random_tensor({K, M}, rng) : random_tensor({M, K}, rng);
          Tensor B = tb ? random_tensor({N, K}, rng) : random_tensor({K, N}, rng);
          Tensor C = random_tensor({M, N}, rng);
          Tensor C0 = Tensor::empty({M, N});
          C0.copy_from(C);
          models::detail::set_gemm_onednn(onednn);
          k.gemm(ta, tb, M, N, K, 2.0f, A.data<float>(), ta ? M : K, B.data<float>(), tb ? K : N, 0.5f, C.data<float>(),
                 N);
          models::detail::set_gemm_onednn(true);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (int64_t p = 0; p < K; ++p) {
                float a = ta ? A.data<float>()[p * M + i] : A.data<float>()[i * K + p];
                float b = tb ? B.data<float>()[j * K + p] : B.data<float>()[p * N + j];
                s += double(a) * b;
              }
              REQUIRE(C.data<float>()[i * N + j] == Approx(2.0 * s + 0.5 * C0.data<float>()[i * N + j]).margin(1e-4));
            }
        }
}

TEST_CASE("gemm follows BLAS's rules for beta 0 and K 0 in both libraries", "[models]") {
  std::mt19937_64 rng(3);
  Kernels& k = kernels_for(Device::cpu());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const bool onednn : {true, false}) {
    INFO("oneDNN " << onednn);
    models::detail::set_gemm_onednn(onednn);
    Tensor A = random_tensor({4, 3}, rng), B = random_tensor({3, 5}, rng);
    std::vector<float> C(20, nan);  // beta 0: C is never read, so its NaNs do not survive
    k.gemm(false, false, 4, 5, 3, 1.0f, A.data<float>(), 3, B.data<float>(), 5, 0.0f, C.data(), 5);
    for (float v : C) REQUIRE(std::isfinite(v));
    std::vector<float> Z(20, nan);  // K 0, beta 0: C = 0 (oneDNN's sgemm alone would leave it)
    k.gemm(false, false, 4, 5, 0, 1.0f, A.data<float>(), 1, B.data<float>(), 5, 0.0f, Z.data(), 5);
    for (float v : Z) REQUIRE(v == 0.0f);
    std::vector<float> H(20, 3.0f);  // K 0: C = beta C
    k.gemm(false, false, 4, 5, 0, 1.0f, A.data<float>(), 1, B.data<float>(), 5, 0.5f, H.data(), 5);
    for (float v : H) REQUIRE(v == 1.5f);
  }
  models::detail::set_gemm_onednn(true);
}

// Debian's oneDNN 2.6.3 sgemm corrupted memory (wrong products, then malloc's abort) when a signal arrived while its
// kernels ran; dptrain's stop handlers (SIGUSR1, SIGTERM) are such signals. gemm holds signals during oneDNN's call.
TEST_CASE("gemm gives the same bits while signals arrive, in both libraries", "[models]") {
  std::mt19937_64 rng(5);
  Kernels& k = kernels_for(Device::cpu());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // oneDNN's sgemm runs with one OpenMP thread only (gemm.cpp)
  struct sigaction quiet {}, before {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = SA_RESTART;
  REQUIRE(sigaction(SIGALRM, &quiet, &before) == 0);
  for (const bool onednn : {true, false}) {
    INFO("oneDNN " << onednn);
    models::detail::set_gemm_onednn(onednn);
    // The MLP's shapes at batch 32: forward, backward data, backward weights.
    const std::vector<std::array<int64_t, 5>> shapes = {
        {32, 512, 784, 0, 1}, {32, 784, 512, 0, 0}, {512, 784, 32, 1, 0}};  // M N K trans_a trans_b
    std::vector<Tensor> a, b, want;
    for (const auto& [M, N, K, ta, tb] : shapes) {
      a.push_back(random_tensor(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K}, rng));
      b.push_back(random_tensor(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, rng));
      want.push_back(Tensor::zeros({M, N}));
    }
    auto product = [&](size_t i, Tensor& c) {
      const auto& [M, N, K, ta, tb] = shapes[i];
      k.gemm(ta, tb, M, N, K, 1.0f, a[i].data<float>(), ta ? M : K, b[i].data<float>(), tb ? K : N, 0.0f,
             c.data<float>(), N);
    };
    for (size_t i = 0; i < shapes.size(); ++i) product(i, want[i]);
    itimerval every{};  // a signal every 37 us, most of them inside a product
    every.it_interval.tv_usec = every.it_value.tv_usec = 37;
    REQUIRE(setitimer(ITIMER_REAL, &every, nullptr) == 0);
    size_t differ = 0;
    for (int round = 0; round < 100; ++round)
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor got = Tensor::empty(want[i].shape());
        product(i, got);
        differ += std::memcmp(got.data<float>(), want[i].data<float>(), want[i].bytes()) != 0;
      }
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    CHECK(differ == 0);
  }
  models::detail::set_gemm_onednn(true);
  sigaction(SIGALRM, &before, nullptr);
  omp_set_num_threads(threads);
}

// tests/CMakeLists.txt gives every unit test OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1. The second once went
// missing (a CMake list split by catch_discover_tests): oneDNN's eltwise kernels then spun two OpenMP threads in each
// test, and two finite-difference cases side by side on CI's two cores ran 100x slower, past their timeout.
TEST_CASE("ctest gives each unit test one thread: OpenBLAS and OpenMP (oneDNN) alike", "[models]") {
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  if (!blas || std::string(blas) != "1") {
    SUCCEED("not run by ctest (OPENBLAS_NUM_THREADS is not 1): nothing to check");
    return;
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  REQUIRE(omp != nullptr);
  CHECK(std::string(omp) == "1");
  CHECK(omp_get_max_threads() == 1);
}

TEST_CASE("softmax cross-entropy: closed form for uniform logits and known gradient", "[models]") {
  Kernels& k = kernels_for(Device::cpu());
  SoftmaxCrossEntropy loss;
  Tensor logits = Tensor::zeros({2, 4});
  logits.data<float>()[4 + 2] = 1.0f;  // second row predicts class 2
  auto r = loss.forward_backward(logits, labels_tensor({3, 2}), k);
  const double row1 = std::log(3.0 + std::exp(1.0)) - 1.0;
  REQUIRE(r.loss_sum == Approx(std::log(4.0) + row1).epsilon(1e-6));
  REQUIRE(r.correct == 1);  // row 0 ties: argmax is class 0, label 3: a miss; row 1 is a hit
  // d(mean loss)/dz = (softmax - onehot) / rows
  REQUIRE(loss.grad().data<float>()[3] == Approx((0.25 - 1.0) / 2).epsilon(1e-6));
  REQUIRE(loss.grad().data<float>()[0] == Approx(0.25 / 2).epsilon(1e-6));
  REQUIRE_THROWS_AS(loss.forward(logits, labels_tensor({4, 0}), k), InternalError);  // label out of range
}

TEST_CASE("global-norm clipping from a sum of squares: clip_grad_norm_'s factor, only when below 1", "[models]") {
  Kernels& k = kernels_for(Device::cpu());
  float x[2] = {3.0f, 4.0f};
  double ss = 0;
  k.sum_squares_to(x, 2, &ss);
  REQUIRE(ss == 25.0);
  k.clip_by_norm(x, 2, &ss, 1.0);  // norm 5: x * 1 / (5 + 1e-6)
  REQUIRE(x[0] == static_cast<float>(3.0) * static_cast<float>(1.0 / (5.0 + 1e-6)));
  REQUIRE(x[1] == static_cast<float>(4.0) * static_cast<float>(1.0 / (5.0 + 1e-6)));
  float y[2] = {3.0f, 4.0f};
  k.clip_by_norm(y, 2, &ss, 10.0);  // the norm is within 10: unchanged
  REQUIRE((y[0] == 3.0f && y[1] == 4.0f));
}

TEST_CASE("MLP gradients match central finite differences", "[models]") {
  std::mt19937_64 rng(7);
  auto model = make_mlp(6, {5, 4}, 3);
  model->init(11);
  Tensor x = random_tensor({4, 6}, rng, 2.0f);
  Tensor y = labels_tensor({0, 2, 1, 2});

  model->zero_grad();
  SoftmaxCrossEntropy loss;
  loss.forward_backward(model->forward(x), y, model->kernels());
  model->backward(loss.grad());
  // Backward accumulates: a second pass doubles the gradient.
  std::vector<float> analytic(model->grads().data<float>(), model->grads().data<float>() + model->num_params());
  loss.forward_backward(model->forward(x), y, model->kernels());
  model->backward(loss.grad());
  for (size_t i = 0; i < analytic.size(); ++i) REQUIRE(model->grads().data<float>()[i] == Approx(2 * analytic[i]));

  float* p = model->params().data<float>();
  const float eps = 1e-2f;
  int checked = 0;
  for (size_t i = 0; i < model->num_params(); ++i) {
    const float saved = p[i];
    p[i] = saved + eps;
    const double lp = model_loss(*model, x, y);
    p[i] = saved - eps;
    const double lm = model_loss(*model, x, y);
    p[i] = saved;
    const double numeric = (lp - lm) / (2.0 * eps);
    INFO("parameter " << i << " analytic " << analytic[i] << " numeric " << numeric);
    REQUIRE(analytic[i] == Approx(numeric).margin(2e-4).epsilon(2e-2));
    ++checked;
  }
  REQUIRE(checked == 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
}

TEST_CASE("parameters live in one flat buffer under PyTorch's names", "[models]") {
  auto model = make_mlp(784, {512, 512}, 10);
  REQUIRE(model->num_params() == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  const auto& np = model->named_params();
  REQUIRE(np.size() == 6);
  REQUIRE(np[0].name == "layers.0.weight");
  REQUIRE(np[0].param.shape() == std::vector<int64_t>{512, 784});
  REQUIRE(np[3].name == "layers.2.bias");
  REQUIRE(np[5].name == "layers.4.bias");
  REQUIRE(np[5].offset + np[5].param.numel() == model->num_params());
  REQUIRE(np[2].param.raw() == static_cast<void*>(model->params().data<float>() + np[2].offset));
  // Same seed, same init; another seed, another init.
  auto a = make_mlp(8, {4}, 3), b = make_mlp(8, {4}, 3), c = make_mlp(8, {4}, 3);
  a->init(5);
  b->init(5);
  c->init(6);
  REQUIRE(std::equal(a->params().data<float>(), a->params().data<float>() + a->num_params(), b->params().data<float>()));
  REQUIRE_FALSE(std::equal(a->params().data<float>(), a->params().data<float>() + a->num_params(), c->params().data<float>()));
  // PyTorch's bound for Linear(in, out): 1/sqrt(in); in = 8 for layers.0, 4 for layers.2.
  for (const auto& np : a->named_params()) {
    const float bound = 1.0f / std::sqrt(np.name.starts_with("layers.0") ? 8.0f : 4.0f);
    for (size_t i = 0; i < np.param.numel(); ++i) REQUIRE(std::abs(np.param.data<float>()[i]) <= bound);
  }
}

TEST_CASE("SGD with momentum, weight decay and nesterov follows PyTorch's update", "[models]") {
  Kernels& k = kernels_for(Device::cpu());
  float p = 1.0f, buf = 0.0f;
  const float g1 = 0.5f, g2 = -0.25f;
  SgdParams sp{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = false, .first_step = true};
  k.sgd_update(&p, &g1, &buf, 1, sp);
  // step 1: g = 0.5 + 0.01*1 = 0.51; buf = 0.51; p = 1 - 0.051
  REQUIRE(buf == Approx(0.51f));
  REQUIRE(p == Approx(0.949f));
  sp.first_step = false;
  k.sgd_update(&p, &g2, &buf, 1, sp);
  const float g = -0.25f + 0.01f * 0.949f, b = 0.9f * 0.51f + g;
  REQUIRE(buf == Approx(b));
  REQUIRE(p == Approx(0.949f - 0.1f * b));
  float q = 1.0f, qb = 0.0f;
  SgdParams nes{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.0f, .nesterov = true, .first_step = true};
  k.sgd_update(&q, &g1, &qb, 1, nes);
  REQUIRE(q == Approx(1.0f - 0.1f * (0.5f + 0.9f * 0.5f)));
}

TEST_CASE("SGD over many elements: every option's loop gives elementwise::sgd's bits element by element", "[models]") {
  Kernels& k = kernels_for(Device::cpu());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  const size_t n = 1003;  // not a multiple of a vector's width
  std::vector<float> p0(n), g(n), b0(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = u(rng);
    g[i] = u(rng);
    b0[i] = u(rng);
  }
  for (const float momentum : {0.0f, 0.9f})
    for (const bool first : {true, false})
      for (const bool nesterov : {false, true}) {
        CAPTURE(momentum, first, nesterov);
        const SgdParams sp{.lr = 0.05f, .momentum = momentum, .weight_decay = 0.01f, .nesterov = nesterov,
                           .first_step = first};
        std::vector<float> pe = p0, be = b0, pk = p0, bk = b0;
        for (size_t i = 0; i < n; ++i) elementwise::sgd(pe[i], g[i], momentum != 0.0f ? &be[i] : nullptr, sp);
        k.sgd_update(pk.data(), g.data(), momentum != 0.0f ? bk.data() : nullptr, n, sp);
        CHECK(std::memcmp(pk.data(), pe.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(bk.data(), be.data(), n * sizeof(float)) == 0);
      }
  std::vector<float> pk = p0;
  CHECK_THROWS_WITH(k.sgd_update(pk.data(), g.data(), nullptr, n, SgdParams{.momentum = 0.9f}),
                    Catch::Contains("without a momentum buffer"));
}

TEST_CASE("AdamW first step moves each parameter by lr against the gradient's sign", "[models]") {
  Kernels& k = kernels_for(Device::cpu());
  float p[2] = {1.0f, -2.0f}, g[2] = {0.3f, -4.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  AdamWParams ap{.lr = 0.01f, .weight_decay = 0.1f, .step = 1};
  k.adamw_update(p, g, m, v, 2, ap);
  // Bias-corrected m/sqrt(v) = sign(g) on step 1 (eps aside); decoupled decay multiplies by 1 - lr*wd.
  REQUIRE(p[0] == Approx(1.0f * (1 - 0.001f) - 0.01f).epsilon(1e-5));
  REQUIRE(p[1] == Approx(-2.0f * (1 - 0.001f) + 0.01f).epsilon(1e-5));
}

TEST_CASE("round_to_fp16 equals the _Float16 conversion", "[models][amp]") {
  auto check = [](float x) {
    const float want = static_cast<float>(static_cast<_Float16>(x)), got = round_to_fp16(x);
    INFO("x " << x << " want " << want << " got " << got);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(std::memcmp(&want, &got, 4) == 0);  // bit for bit: signed zeros and infinities too
    }
  };
  // Every 4099th bit pattern (all exponents, signs and mantissa patterns), then the edges: fp16's largest
  // value and the overflow threshold, the normal/subnormal boundary, the smallest subnormal and half of it
  // (a tie that rounds to zero), ties at 11 significant bits.
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) {
    const uint32_t bits = static_cast<uint32_t>(b);
    float x;
    std::memcpy(&x, &bits, 4);
    check(x);
  }
  for (float x : {65504.0f, 65519.99f, 65520.0f, 0x1p-14f, 0x1.ffcp-15f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.8p-25f,
                  1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0.0f, -0.0f, 3e38f})
    for (float s : {1.0f, -1.0f}) check(s * x);
}

TEST_CASE("gemm in bf16 and fp16: operands rounded, float32 arithmetic, and fp16 overflows to inf", "[models][amp]") {
  Kernels& k = kernels_for(Device::cpu());
  // 1 + 2^-10 is exact in fp16 and float, rounds to 1 in bf16 (8 significant bits); 1 + 2^-12 rounds to 1 in
  // both. A 1x1 by 1x1 product shows the operand rounding, a 1x2 by 2x1 the float32 accumulation.
  const float a[2] = {1.0f + 0x1p-10f, 1.0f + 0x1p-12f}, b[2] = {1.0f, 1.0f};
  auto product = [&](Precision p, int64_t kk) {
    k.set_precision(p);
    float c = -1.0f;
    k.gemm(false, false, 1, 1, kk, 1.0f, a, kk, b, 1, 0.0f, &c, 1);
    k.set_precision(Precision::F32);
    return c;
  };
  REQUIRE(product(Precision::F32, 1) == 1.0f + 0x1p-10f);
  REQUIRE(product(Precision::F16, 1) == 1.0f + 0x1p-10f);
  REQUIRE(product(Precision::BF16, 1) == 1.0f);
  REQUIRE(product(Precision::F32, 2) == 2.0f + 0x1p-10f + 0x1p-12f);
  REQUIRE(product(Precision::F16, 2) == 2.0f + 0x1p-10f);
  REQUIRE(product(Precision::BF16, 2) == 2.0f);
  // fp16's largest value is 65504: 70000 overflows to inf (what loss scaling watches for); bf16 keeps it.
  const float big = 70000.0f, one = 1.0f;
  float c = 0;
  k.set_precision(Precision::F16);
  k.gemm(false, false, 1, 1, 1, 1.0f, &big, 1, &one, 1, 0.0f, &c, 1);
  REQUIRE(std::isinf(c));
  k.set_precision(Precision::BF16);
  k.gemm(false, false, 1, 1, 1, 1.0f, &big, 1, &one, 1, 0.0f, &c, 1);
  REQUIRE(c == 70144.0f);  // 70000 to bf16's 8 significant bits
  k.set_precision(Precision::F32);
  // Transposed operands take the same path: (A^T)^T B with A stored transposed.
  const float at[2] = {1.0f + 0x1p-10f, 1.0f + 0x1p-12f};
  k.set_precision(Precision::BF16);
  k.gemm(true, false, 1, 1, 2, 1.0f, at, 1, b, 1, 0.0f, &c, 1);
  k.set_precision(Precision::F32);
  REQUIRE(c == 2.0f);
}

namespace {

// A root over two Linears whose backward runs only the first (as if the loss never reached the second), on bf16
// activations: fresh grads (Model::zero_grad leaving the gradients to the next backward) must still give the second
// zero gradients, as zeroing them would.
class FirstOnly final : public Module {
 public:
  FirstOnly() {
    a_ = add("a", std::make_unique<Linear>(8, 8));
    b_ = add("b", std::make_unique<Linear>(8, 8));
  }
  std::string kind() const override { return "FirstOnly"; }
  bool supports_bf16_activations() const override { return true; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override {
    b_->forward(x, k);
    return a_->forward(x, k);
  }
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override { return a_->backward(dy, k); }

 private:
  Linear *a_, *b_;
};

}  // namespace

TEST_CASE("fresh grads: a module whose backward did not run ends with zero gradients, not the buffer's old values",
          "[bf16act]") {
  std::mt19937_64 rng(5);
  Model fresh(std::make_unique<FirstOnly>(), "first-only", Device::cpu());
  Model zeroed(std::make_unique<FirstOnly>(), "first-only", Device::cpu());
  fresh.init(3);
  zeroed.init(3);
  zeroed.set_fresh_grads_allowed(false);
  Tensor x = Tensor::empty({4, 8}, DType::BF16), dy = Tensor::empty({4, 8}, DType::BF16);
  to_bfloat16(random_tensor({4, 8}, rng, 1.0f), x);
  to_bfloat16(random_tensor({4, 8}, rng, 1.0f), dy);
  for (Model* m : {&fresh, &zeroed}) {
    m->set_bf16_activations(true);
    std::fill_n(m->grads().data<float>(), m->grads().numel(), std::numeric_limits<float>::quiet_NaN());
    m->zero_grad();
    m->forward(x);
    m->backward(dy);
  }
  size_t differ = 0;
  for (size_t i = 0; i < fresh.grads().numel(); ++i)
    differ += !(fresh.grads().data<float>()[i] == zeroed.grads().data<float>()[i]);
  CHECK(differ == 0);
  // The second Linear's gradients (its weight and bias, after the first's 72) are all zero.
  for (size_t i = 72; i < fresh.grads().numel(); ++i) CHECK(fresh.grads().data<float>()[i] == 0.0f);
}
