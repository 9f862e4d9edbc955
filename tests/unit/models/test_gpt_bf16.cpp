// tests/unit/models/test_gpt_bf16.cpp: the GPT's transformer fast path (Model::set_bf16_activations) on the CPU
// kernel set, against the same model's float32 path from the same parameters: one training forward and backward
// (loss, every parameter's gradient, within what bf16 activations cost: a relative L2 of a few 2^-8); evaluation
// still the float32 path bit for bit; bf16 activations only in training mode; the gradient scale the trainer
// passes; reruns giving the same bits; what the fast path refuses. The CUDA set runs the same step in
// tests/unit/gpu/test_fast_path.cpp against this one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "model_testing.h"
#include "models/gpt/gpt.h"
#include "models/kernels/factory.h"
#include "models/layers.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;

namespace {

GptOptions small() {
  GptOptions o;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = 32;  // head size 16: cuDNN's fused attention takes it (a multiple of 8)
  o.vocab_size = 100;  // padded to 128: the padding columns are exercised
  o.block_size = 16;
  return o;
}

struct Fixture {
  std::unique_ptr<Model> fp32 = make_gpt(small()), bf16 = make_gpt(small());
  Tensor tokens = Tensor::empty({3, 16}, DType::I32), targets = Tensor::empty({48}, DType::I32);
  Fixture() {
    fp32->init(7);
    bf16->init(7);
    bf16->set_bf16_activations(true);
    std::mt19937 rng(3);
    for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
    for (size_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
  }
};

}  // namespace

TEST_CASE("gpt with bf16 activations: the float32 path's loss and gradients within bf16's rounding", "[gpt][bf16act]") {
  Fixture f;
  const test::LmStep want = test::lm_step(*f.fp32, f.tokens, f.targets);
  const test::LmStep got = test::lm_step(*f.bf16, f.tokens, f.targets);
  CAPTURE(want.loss, got.loss);
  CHECK(std::isfinite(got.loss));
  CHECK(std::abs(got.loss - want.loss) <= 1e-2 * std::abs(want.loss));
  // The logits over the vocabulary; the padding is -inf on both paths.
  const int64_t vp = padded_vocab(small());
  double d = 0, w = 0;
  size_t padding_bad = 0;
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t c = 0; c < vp; ++c) {
      const float g = got.logits.data<float>()[r * vp + c], x = want.logits.data<float>()[r * vp + c];
      if (c >= small().vocab_size) {
        padding_bad += !(std::isinf(g) && g < 0);
        continue;
      }
      d += (g - x) * (g - x);
      w += static_cast<double>(x) * x;
    }
  CHECK(padding_bad == 0);
  CHECK(std::sqrt(d / w) < 2e-2);
  // Every parameter's gradient: bf16 activations through two layers cost a few 2^-8 of relative L2.
  for (const NamedParam& p : f.fp32->named_params()) {
    const double e =
        test::rel_l2(got.grads.data<float>() + p.offset, want.grads.data<float>() + p.offset, p.param.numel());
    INFO(p.name << ": relative L2 " << e);
    CHECK(e < 3e-2);
  }
  CHECK(test::rel_l2(got.grads.data<float>(), want.grads.data<float>(), got.grads.numel()) < 1.5e-2);
  // The head's backward runs over the padded vocabulary: wte's padding rows get exactly no gradient.
  size_t wte_rows = 0, padding_grads = 0;
  for (const NamedParam& p : f.bf16->named_params()) {
    if (p.name.find("wte") == std::string::npos) continue;
    wte_rows += static_cast<size_t>(p.param.dim(0));
    for (size_t i = static_cast<size_t>(small().vocab_size * small().n_embd); i < p.param.numel(); ++i)
      padding_grads += got.grads.data<float>()[p.offset + i] != 0.0f;
  }
  CHECK(wte_rows == static_cast<size_t>(vp));
  CHECK(padding_grads == 0);
}

TEST_CASE("gpt with bf16 activations: the same bits again, grad_scale scales the gradient", "[gpt][bf16act]") {
  Fixture f;
  const test::LmStep a = test::lm_step(*f.bf16, f.tokens, f.targets);
  const test::LmStep b = test::lm_step(*f.bf16, f.tokens, f.targets);
  CHECK(std::memcmp(a.grads.raw(), b.grads.raw(), a.grads.bytes()) == 0);
  CHECK(a.loss == b.loss);
  // Half the gradient: the classifier's dscale (bf16 rounding of the half is exact: a power of two).
  const test::LmStep h = test::lm_step(*f.bf16, f.tokens, f.targets, 0.5);
  CHECK(test::rel_l2(h.grads.data<float>(), a.grads.data<float>(), a.grads.numel()) == Approx(0.5).margin(1e-2));
}

TEST_CASE("gpt with bf16 activations: zero_grad leaves the gradients to the next backward, which writes them all",
          "[gpt][bf16act]") {
  Fixture f;
  auto zeroed = make_gpt(small());
  zeroed->init(7);
  zeroed->set_bf16_activations(true);
  test::check_fresh_grads(*f.bf16, *zeroed, f.tokens, f.targets);
  // The float32 path, evaluation, and a model told not to: zero_grad zeroes.
  f.fp32->zero_grad();
  CHECK(!f.fp32->fresh_grads_pending());
  f.bf16->set_fresh_grads_allowed(false);
  f.bf16->zero_grad();
  CHECK(!f.bf16->fresh_grads_pending());
  f.bf16->set_fresh_grads_allowed(true);
  f.bf16->set_training(false);
  f.bf16->zero_grad();
  CHECK(!f.bf16->fresh_grads_pending());
  // Fresh grads on a float32 pass (the fast path turned off after zero_grad): Linear's product with beta 0, the norms'
  // and the embedding's gradients zeroed first, the head's.
  f.bf16->set_training(true);
  test::check_fresh_grads_float32(*f.bf16, *f.fp32, f.tokens, f.targets);
}

TEST_CASE("gpt with bf16 activations: a steady training step allocates nothing (what a CUDA graph of it needs)",
          "[gpt][bf16act]") {
  Fixture f;
  test::check_steady_step_allocates_nothing(*f.bf16, f.tokens, f.targets);
}

TEST_CASE("gpt with bf16 activations: the residual stream handed from block to block, the same bits as each block's "
          "own sum", "[gpt][bf16act]") {
  Fixture f;
  auto off = make_gpt(small());
  off->init(7);
  off->set_bf16_activations(true);
  dynamic_cast<Gpt&>(off->root()).set_residual_hand_off(false);
  test::check_residual_hand_off(*f.bf16, *off, f.tokens, f.targets);
}

TEST_CASE("gpt with bf16 activations evaluates in float32, bit for bit the float32 path", "[gpt][bf16act]") {
  Fixture f;
  // A training step first: its bf16 buffers must not leak into evaluation.
  (void)test::lm_step(*f.bf16, f.tokens, f.targets);
  f.fp32->set_training(false);
  f.bf16->set_training(false);
  const Tensor want = f.fp32->forward(f.tokens).to(Device::cpu());
  const Tensor& got = f.bf16->forward(f.tokens);
  REQUIRE(got.dtype() == DType::F32);
  CHECK(std::memcmp(got.raw(), want.raw(), want.bytes()) == 0);
  // And back to training: bf16 logits again.
  f.bf16->set_training(true);
  CHECK(f.bf16->forward(f.tokens).dtype() == DType::BF16);
}

TEST_CASE("bf16 activations: what the fast path refuses", "[gpt][bf16act]") {
  auto mlp = make_mlp(4, {8}, 3);
  CHECK_THROWS_AS(mlp->set_bf16_activations(true), UnsupportedError);
  auto gpt = make_gpt(small());
  gpt->init(1);
  gpt->set_bf16_activations(true);
  CHECK(gpt->params16().dtype() == DType::BF16);
  CHECK(gpt->params16().numel() == gpt->num_params());
  CHECK_THROWS_AS(gpt->split_params({{0, gpt->named_params().size()}}), UnsupportedError);
  gpt->set_bf16_activations(false);
  CHECK(!gpt->params16().defined());
}
