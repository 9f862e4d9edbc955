// tests/unit/models/model_testing.h: helpers shared by the model tests.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/bfloat16_convert.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/module.h"

namespace dpt::test {

// A host float tensor of `shape`, uniform in [-scale, scale) from `rng`.
inline Tensor random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape));
  for (size_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = models::uniform(rng, -scale, scale);
  return t;
}

// L = sum(y * r): a loss whose d/dy is r.
// Outputs that are infinite whatever the parameters (a GPT's -inf logits for its vocabulary padding) are left
// out: constants, with no gradient.
inline double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (size_t i = 0; i < y.numel(); ++i)
    if (!std::isinf(y.data<float>()[i])) s += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
  return s;
}

// Checks d L / d input and d L / d parameters of `model` at x against central differences, for every input
// element and parameter when there are at most `max_checked` of them, else an evenly spread sample.
// With check_input false, only the parameters (a model whose input is not differentiable: tokens).
inline void check_gradients(models::Model& model, Tensor x, uint64_t seed, float eps = 1e-2f, double rel = 2e-2,
                            double abs = 2e-3, size_t max_checked = 400, bool check_input = true) {
  std::mt19937_64 rng(seed);
  const Tensor& y0 = model.forward(x);
  Tensor r = random_tensor(y0.shape(), rng);
  model.zero_grad();
  model.forward(x);
  const Tensor& dx_ref = model.backward(r);
  REQUIRE(dx_ref.defined() == check_input);
  Tensor dx_copy;
  if (check_input) {
    const Tensor dx = dx_ref.to(Device::cpu());
    dx_copy = Tensor::empty(dx.shape());
    dx_copy.copy_from(dx);
  }
  std::vector<float> dp(model.grads().data<float>(), model.grads().data<float>() + model.num_params());

  auto check = [&](float* v, size_t n, const float* analytic, const char* what) {
    const size_t stride = n > max_checked ? n / max_checked : 1;
    for (size_t i = 0; i < n; i += stride) {
      const float saved = v[i];
      v[i] = saved + eps;
      const double lp = weighted_sum(model.forward(x), r);
      v[i] = saved - eps;
      const double lm = weighted_sum(model.forward(x), r);
      v[i] = saved;
      const double numeric = (lp - lm) / (2.0 * eps);
      INFO(what << " " << i << " of " << n << ": analytic " << analytic[i] << " numeric " << numeric);
      REQUIRE(analytic[i] == Approx(numeric).epsilon(rel).margin(abs));
    }
  };
  if (check_input) check(x.data<float>(), x.numel(), dx_copy.data<float>(), "input");
  check(model.params().data<float>(), model.num_params(), dp.data(), "parameter");
}

// Tokens [b, t] drawn uniformly from [0, vocab) by `rng`.
inline Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, std::mt19937_64& rng) {
  Tensor x = Tensor::empty({b, t}, DType::I32);
  for (size_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  return x;
}

// Every parameter of `m` multiplied by `factor` (weights larger than an initialisation's, so that every path carries a
// gradient well above the finite differences' noise).
inline std::unique_ptr<models::Model> scaled(std::unique_ptr<models::Model> m, float factor) {
  for (size_t i = 0; i < m->num_params(); ++i) m->params().data<float>()[i] *= factor;
  return m;
}

// A module as a whole Model on the CPU, initialised from `seed`.
template <class M>
std::unique_ptr<models::Model> wrap(std::unique_ptr<M> m, uint64_t seed = 3) {
  auto model = std::make_unique<models::Model>(std::move(m), "test", Device::cpu());
  model->init(seed);
  return model;
}

// One training step's forward and backward of a language model (the trainer's loss call) on the host: its loss (the
// mean over the counted targets), a host copy of the flat gradients and of the logits (float32; bf16 widened). The
// fast-path tests compare a model with bf16 activations against its float32 path with it.
struct LmStep {
  double loss = 0;
  Tensor grads;
  Tensor logits;
};

inline LmStep lm_step(models::Model& m, const Tensor& tokens, const Tensor& targets, double grad_scale = 1.0) {
  models::Kernels& k = m.kernels();
  models::SoftmaxCrossEntropy loss;
  Tensor stats = Tensor::zeros({3}, DType::F64);
  m.zero_grad();
  const Tensor& logits = m.forward(tokens);
  LmStep s;
  s.logits = Tensor::empty(logits.shape());
  for (size_t i = 0; i < logits.numel(); ++i)
    s.logits.data<float>()[i] =
        logits.dtype() == DType::BF16 ? to_float(logits.data<BFloat16>()[i]) : logits.data<float>()[i];
  loss.accumulate(logits, targets, k, stats, /*backward=*/true, grad_scale);
  m.backward(loss.grad());
  s.loss = stats.data<double>()[0] / stats.data<double>()[2];
  s.grads = Tensor::empty(m.grads().shape());
  s.grads.copy_from(m.grads());
  return s;
}

// A steady training step (zero_grad, forward, loss, backward) of `m` allocates no tensor memory once two steps have
// run: every buffer it uses stays at its address from step to step, which a CUDA graph of the step needs (it replays
// the addresses it captured; dpt-model-bench --cuda-graph, tests/unit/gpu's [cuda_graph] case on the GPU's own
// kernels). Each step ends with the fused AdamW writing the fast path's bf16 copy (params16_written), as dptrain's
// optimizer does, so the steps after the first read that copy: the forward's path a graph captures. Counted on this
// thread (core/memory.h): any allocation or release in the step shows, one freed and made again at its size too (it
// nets nothing, but its address may change).
inline void check_steady_step_allocates_nothing(models::Model& m, const Tensor& tokens, const Tensor& targets) {
  models::SoftmaxCrossEntropy loss;
  Tensor stats = Tensor::zeros({3}, DType::F64);
  const size_t n = m.grads().numel();
  Tensor adam_m = Tensor::zeros({static_cast<int64_t>(n)}), adam_v = Tensor::zeros({static_cast<int64_t>(n)});
  int64_t t = 0;
  const auto step = [&] {
    m.zero_grad();
    loss.accumulate(m.forward(tokens), targets, m.kernels(), stats, /*backward=*/true);
    m.backward(loss.grad());
    const models::AdamWParams ap{.lr = 1e-3f, .weight_decay = 0.1f, .step = ++t};
    m.kernels().adamw_fused(m.params().data<float>(), m.params16_data(), m.grads().data<float>(),
                            adam_m.data<float>(), adam_v.data<float>(), n, ap, nullptr, 0, nullptr, 0.0);
    m.params16_written();
  };
  step();
  step();
  REQUIRE(m.params16_current() == m.bf16_activations());  // the next forward reads the update's copy
  const int64_t roundings = m.params16_roundings();
  reset_thread_allocations(m.grads().device());
  step();
  const ThreadAllocations a = thread_allocations();
  stop_thread_allocations();
  CHECK(m.params16_roundings() == roundings);  // it did: no rounding pass
  CHECK(a.allocations == 0);
  CHECK(a.releases == 0);
  CHECK(a.net == 0);
  CHECK(std::isfinite(stats.data<double>()[0]));
}

// The fast path's residual hand-off (ResidualBlock, run_handing_off) against each block making its own output sum:
// `on` and `off` the same model with bf16 activations, `off` with the hand-off turned off. Two training steps (the
// second after an evaluation, which runs the float32 path and must find nothing handed off, and on the tokens
// reversed: a buffer left from the first would show), each the same loss, logits and gradients bit for bit, and the
// evaluation's logits too.
inline void check_residual_hand_off(models::Model& on, models::Model& off, const Tensor& tokens,
                                    const Tensor& targets) {
  Tensor reversed = Tensor::empty(tokens.shape(), tokens.dtype());
  std::reverse_copy(tokens.data<int32_t>(), tokens.data<int32_t>() + tokens.numel(), reversed.data<int32_t>());
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    const Tensor& x = round == 0 ? tokens : reversed;
    const LmStep a = lm_step(on, x, targets), b = lm_step(off, x, targets);
    CHECK(a.loss == b.loss);
    CHECK(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.bytes()) == 0);
    CHECK(std::memcmp(a.grads.raw(), b.grads.raw(), a.grads.bytes()) == 0);
    on.set_training(false);
    off.set_training(false);
    const Tensor e = on.forward(x).to(Device::cpu());
    const Tensor& f = off.forward(x);
    REQUIRE(e.dtype() == DType::F32);
    CHECK(std::memcmp(e.raw(), f.raw(), e.bytes()) == 0);
    on.set_training(true);
    off.set_training(true);
  }
}

// Model::zero_grad leaving the gradients to the next backward (fresh grads, Module::set_fresh_grads) against zeroing
// them: `fresh` and `zeroed` the same model with bf16 activations, `zeroed` with set_fresh_grads_allowed(false). Two
// steps, each: zero_grad, then `fresh`'s gradients poisoned with NaN (whatever they hold must never be read), then
// two micro-batches (the second, on the tokens reversed, adds onto the first, as gradient accumulation does). The
// same losses, and the same gradients as floats (a -0 written where 0 + -0 gave +0 matches).
inline void check_fresh_grads(models::Model& fresh, models::Model& zeroed, const Tensor& tokens,
                              const Tensor& targets) {
  Tensor reversed = Tensor::empty(tokens.shape(), tokens.dtype());
  std::reverse_copy(tokens.data<int32_t>(), tokens.data<int32_t>() + tokens.numel(), reversed.data<int32_t>());
  zeroed.set_fresh_grads_allowed(false);
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    double losses[2][2] = {};
    int m = 0;
    for (models::Model* model : {&fresh, &zeroed}) {
      model->zero_grad();
      CHECK(model->fresh_grads_pending() == (model == &fresh));
      if (model == &fresh)
        std::fill_n(model->grads().data<float>(), model->grads().numel(), std::numeric_limits<float>::quiet_NaN());
      for (int micro = 0; micro < 2; ++micro) {
        models::Kernels& k = model->kernels();
        models::SoftmaxCrossEntropy loss;
        Tensor stats = Tensor::zeros({3}, DType::F64);
        loss.accumulate(model->forward(micro == 0 ? tokens : reversed), targets, k, stats, /*backward=*/true, 0.5);
        model->backward(loss.grad());
        CHECK(!model->fresh_grads_pending());
        losses[m][micro] = stats.data<double>()[0];
      }
      ++m;
    }
    CHECK(losses[0][0] == losses[1][0]);
    CHECK(losses[0][1] == losses[1][1]);
    const float* a = fresh.grads().data<float>();
    const float* b = zeroed.grads().data<float>();
    size_t differ = 0, nonfinite = 0;
    for (size_t i = 0; i < fresh.grads().numel(); ++i) {
      differ += !(a[i] == b[i]);
      nonfinite += !std::isfinite(a[i]);
    }
    CHECK(nonfinite == 0);
    CHECK(differ == 0);
  }
}

// Fresh grads on a float32 pass: `bf16` (bf16 activations, training) told to leave its gradients to the next backward
// (zero_grad), its gradients then poisoned with NaN and the fast path turned off: every module's float32 backward
// must write its gradients too, the same as `fp32`'s (the same parameters, float32 path, zeroed) as floats.
inline void check_fresh_grads_float32(models::Model& bf16, models::Model& fp32, const Tensor& tokens,
                                      const Tensor& targets) {
  bf16.zero_grad();
  REQUIRE(bf16.fresh_grads_pending());
  std::fill_n(bf16.grads().data<float>(), bf16.grads().numel(), std::numeric_limits<float>::quiet_NaN());
  bf16.set_bf16_activations(false);
  const LmStep want = lm_step(fp32, tokens, targets);
  models::SoftmaxCrossEntropy loss;
  Tensor stats = Tensor::zeros({3}, DType::F64);
  loss.accumulate(bf16.forward(tokens), targets, bf16.kernels(), stats, /*backward=*/true, 1.0);
  bf16.backward(loss.grad());
  size_t differ = 0;
  const float* got = bf16.grads().data<float>();
  for (size_t i = 0; i < want.grads.numel(); ++i) differ += !(got[i] == want.grads.data<float>()[i]);
  CHECK(differ == 0);
}

// ||got - want|| / ||want|| (||got - want|| when want is 0).
inline double rel_l2(const float* got, const float* want, size_t n) {
  double d = 0, w = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w += static_cast<double>(want[i]) * want[i];
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

// ResidualNorm::forward_add(a, b, sum) against the kernel set's add then forward(sum), on `norm` (a module of `model`,
// on the CPU), rows x c, in float32 and with bf16 activations: the same sum and output, then (backward after each)
// the same input gradient and parameter gradients, bit for bit; the second path's sum kept as the norm's input.
inline void check_forward_add(models::Model& model, models::ResidualNorm& norm, int64_t rows, int64_t c,
                              std::mt19937_64& rng) {
  models::Kernels& k = model.kernels();
  for (const DType dt : {DType::F32, DType::BF16}) {
    CAPTURE(dtype_name(dt));
    const auto input = [&](float scale) {
      const Tensor f = random_tensor({rows, c}, rng, scale);
      if (dt == DType::F32) return f;
      Tensor h = Tensor::empty({rows, c}, DType::BF16);
      to_bfloat16(f, h);
      return h;
    };
    const Tensor a = input(2.0f), b = input(1.0f), dy = input(1.0f);
    const auto bytes_of = [](const Tensor& t) {
      return std::vector<unsigned char>(static_cast<const unsigned char*>(t.raw()),
                                        static_cast<const unsigned char*>(t.raw()) + t.bytes());
    };
    Tensor sum1 = Tensor::empty({rows, c}, dt), sum2;
    if (dt == DType::F32)
      k.add(a.data<float>(), b.data<float>(), sum1.data<float>(), a.numel(), false);
    else
      k.add_bf16(a.data<BFloat16>(), b.data<BFloat16>(), sum1.data<BFloat16>(), a.numel());
    model.zero_grad();
    const auto y1 = bytes_of(norm.forward(sum1, k));
    const auto dx1 = bytes_of(norm.backward(dy, k));
    const auto g1 = bytes_of(model.grads());
    model.zero_grad();
    const auto y2 = bytes_of(norm.forward_add(a, b, sum2, k));
    const auto dx2 = bytes_of(norm.backward(dy, k));
    const auto g2 = bytes_of(model.grads());
    REQUIRE(sum2.shape() == sum1.shape());
    REQUIRE(sum2.dtype() == dt);
    CHECK(bytes_of(sum2) == bytes_of(sum1));
    CHECK(y2 == y1);
    CHECK(dx2 == dx1);
    CHECK(g2 == g1);
    // The pending add is gone afterwards: a plain forward normalises its own input again.
    CHECK(bytes_of(norm.forward(sum1, k)) == y1);
    // The addend of another shape: refused before anything runs; summands the norm refuses (another width): the
    // pending add is cleared on the way out, and a plain forward is the norm of its input again.
    const Tensor odd = Tensor::zeros({rows, c + 1}, dt);
    CHECK_THROWS(norm.forward_add(a, odd, sum2, k));
    Tensor odd_sum;
    CHECK_THROWS(norm.forward_add(odd, odd, odd_sum, k));
    CHECK(bytes_of(norm.forward(sum1, k)) == y1);
  }
}

}  // namespace dpt::test
