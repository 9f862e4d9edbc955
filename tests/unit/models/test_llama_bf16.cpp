// tests/unit/models/test_llama_bf16.cpp: the Llama family's transformer fast path (Model::set_bf16_activations) on the
// CPU kernel set, against the same model's float32 path from the same parameters, as test_gpt_bf16.cpp does for the
// GPT: one training forward and backward (loss, logits, every parameter's gradient within what bf16 activations
// cost) for grouped-query attention with an untied head, and for multi-head attention with a tied head and every
// bias (Llama's attention_bias and mlp_bias, Qwen2's q/k/v biases) over a vocabulary that is not a multiple of 8,
// and Qwen2's shape (grouped-query with q/k/v biases, tied);
// the same bits again; evaluation the float32 path bit for bit; Linear's packed bf16 output (the q, k and v
// projections side by side) equal to its own output. The CUDA set runs the same step in
// tests/unit/gpu/test_fast_path.cpp against this one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "core/bfloat16_convert.h"
#include "model_testing.h"
#include "models/kernels/factory.h"
#include "models/kernels/timed_kernels.h"
#include "models/layers.h"
#include "models/llama/llama.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;

namespace {

// Grouped-query attention (4 query heads over 2 key/value heads), untied head, no biases: Llama 3's and SmolLM's shape.
LlamaOptions gqa() {
  LlamaOptions o;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_kv_head = 2;
  o.n_embd = 32;
  o.head_dim = 16;  // cuDNN's fused attention takes it (a multiple of 8)
  o.intermediate_size = 64;
  o.vocab_size = 96;
  o.max_positions = 16;
  o.rope_theta = 500.0;
  return o;
}

// Multi-head, tied head, biases everywhere, vocabulary 101 (not a multiple of 8: the logits' row stride is odd).
LlamaOptions mha_tied_biases() {
  LlamaOptions o = gqa();
  o.n_kv_head = 4;
  o.vocab_size = 101;
  o.tie_embeddings = true;
  o.qkv_bias = o.o_bias = o.mlp_bias = true;
  return o;
}

// Qwen2's shape: grouped-query attention with biases on q, k and v (none on o_proj), tied.
LlamaOptions qwen2() {
  LlamaOptions o = gqa();
  o.qkv_bias = true;
  o.tie_embeddings = true;
  return o;
}

struct Fixture {
  LlamaOptions o;
  std::unique_ptr<Model> fp32, bf16;
  Tensor tokens = Tensor::empty({3, 16}, DType::I32), targets = Tensor::empty({48}, DType::I32);
  explicit Fixture(const LlamaOptions& opts) : o(opts), fp32(make_llama(opts)), bf16(make_llama(opts)) {
    fp32->init(7);
    // Weights 4x the initialisation's, biases and norm weights away from 0 and 1: attention scores of order 1 and
    // every bias and gain visible in the gradients.
    std::mt19937_64 rng(11);
    for (const NamedParam& p : fp32->named_params()) {
      float* v = p.param.data<float>();
      const bool vector = p.param.ndim() == 1;
      for (size_t i = 0; i < p.param.numel(); ++i) v[i] = vector ? 1.0f + uniform(rng, -0.3f, 0.3f) : 4.0f * v[i];
      if (p.name.ends_with(".bias"))
        for (size_t i = 0; i < p.param.numel(); ++i) v[i] -= 1.0f;
    }
    bf16->params().copy_from(fp32->params());
    bf16->set_bf16_activations(true);
    std::mt19937 r(3);
    for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(r() % o.vocab_size);
    for (size_t i = 0; i < targets.numel(); ++i)  // every fifth target masked (a prompt's token)
      targets.data<int32_t>()[i] = i % 5 == 4 ? kIgnoreLabel : static_cast<int32_t>(r() % o.vocab_size);
  }
};

// The first attention layer of a Llama model.
const LlamaAttention& first_attention(const Model& m) {
  const Module* at = &m.root();
  for (const char* name : {"model", "layers", "0", "self_attn"}) {
    const auto& kids = at->children();
    const auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& c) { return c.first == name; });
    REQUIRE(it != kids.end());
    at = it->second;
  }
  return dynamic_cast<const LlamaAttention&>(*at);
}

void check_against_float32(const LlamaOptions& o) {
  Fixture f(o);
  // Which input-gradient path q, k and v take: one matmul over their adjacent weights without biases, else three.
  CHECK(first_attention(*f.bf16).qkv_weights_adjacent() == !o.qkv_bias);
  CHECK_FALSE(first_attention(*f.fp32).qkv_weights_adjacent());  // no bf16 copy at all
  const test::LmStep want = test::lm_step(*f.fp32, f.tokens, f.targets);
  const test::LmStep got = test::lm_step(*f.bf16, f.tokens, f.targets);
  REQUIRE(got.logits.shape() == want.logits.shape());
  REQUIRE(got.logits.dim(1) == o.vocab_size);  // no padding: Hugging Face's vocabulary as it is
  CAPTURE(want.loss, got.loss);
  CHECK(std::isfinite(got.loss));
  CHECK(std::abs(got.loss - want.loss) <= 1e-2 * std::abs(want.loss));
  CHECK(test::rel_l2(got.logits.data<float>(), want.logits.data<float>(), got.logits.numel()) < 2e-2);
  for (const NamedParam& p : f.fp32->named_params()) {
    const double e =
        test::rel_l2(got.grads.data<float>() + p.offset, want.grads.data<float>() + p.offset, p.param.numel());
    INFO(p.name << ": relative L2 " << e);
    CHECK(e < 4e-2);
  }
  CHECK(test::rel_l2(got.grads.data<float>(), want.grads.data<float>(), got.grads.numel()) < 2e-2);
}

}  // namespace

TEST_CASE("llama with bf16 activations, grouped-query and untied: the float32 path's loss and gradients within "
          "bf16's rounding", "[llama][bf16act]") {
  check_against_float32(gqa());
}

TEST_CASE("llama with bf16 activations, multi-head, tied and with every bias, vocabulary 101: the float32 path's "
          "loss and gradients within bf16's rounding", "[llama][bf16act]") {
  check_against_float32(mha_tied_biases());
}

TEST_CASE("llama with bf16 activations, Qwen2's shape (grouped-query, q/k/v biases, tied): the float32 path's loss and "
          "gradients within bf16's rounding", "[llama][bf16act]") {
  check_against_float32(qwen2());
}

TEST_CASE("llama with bf16 activations: the same bits again, evaluation the float32 path bit for bit, and training "
          "again after it", "[llama][bf16act]") {
  Fixture f(gqa());
  const test::LmStep a = test::lm_step(*f.bf16, f.tokens, f.targets);
  const test::LmStep b = test::lm_step(*f.bf16, f.tokens, f.targets);
  CHECK(std::memcmp(a.grads.raw(), b.grads.raw(), a.grads.bytes()) == 0);
  CHECK(a.loss == b.loss);
  f.fp32->set_training(false);
  f.bf16->set_training(false);
  const Tensor want = f.fp32->forward(f.tokens).to(Device::cpu());
  const Tensor& got = f.bf16->forward(f.tokens);
  REQUIRE(got.dtype() == DType::F32);
  CHECK(std::memcmp(got.raw(), want.raw(), want.bytes()) == 0);
  // Back to training after an evaluation (whose float32 buffers the layers now hold): the first step's bits again.
  f.bf16->set_training(true);
  CHECK(f.bf16->forward(f.tokens).dtype() == DType::BF16);
  const test::LmStep c = test::lm_step(*f.bf16, f.tokens, f.targets);
  CHECK(std::memcmp(a.grads.raw(), c.grads.raw(), a.grads.bytes()) == 0);
  CHECK(a.loss == c.loss);
}

TEST_CASE("llama with bf16 activations: zero_grad leaves the gradients to the next backward, which writes them all "
          "(untied and tied heads, q/k/v biases)", "[llama][bf16act]") {
  for (const LlamaOptions& o : {gqa(), mha_tied_biases(), qwen2()}) {
    Fixture f(o);
    auto zeroed = make_llama(o);
    zeroed->params().copy_from(f.fp32->params());
    zeroed->set_bf16_activations(true);
    test::check_fresh_grads(*f.bf16, *zeroed, f.tokens, f.targets);
    // Off the fast path, or in evaluation, zero_grad zeroes as before.
    f.fp32->zero_grad();
    CHECK(!f.fp32->fresh_grads_pending());
    f.bf16->set_training(false);
    f.bf16->zero_grad();
    CHECK(!f.bf16->fresh_grads_pending());
    // Fresh grads on a float32 pass (the fast path turned off after zero_grad): RmsNorm's, the lookup's, the tied
    // head's and the Linears' float32 backwards write every gradient too.
    f.bf16->set_training(true);
    test::check_fresh_grads_float32(*f.bf16, *f.fp32, f.tokens, f.targets);
  }
}

TEST_CASE("llama with bf16 activations: a steady training step allocates nothing (what a CUDA graph of it needs), "
          "grouped-query and Qwen2's shape", "[llama][bf16act]") {
  for (const LlamaOptions& o : {gqa(), qwen2()}) {
    Fixture f(o);
    test::check_steady_step_allocates_nothing(*f.bf16, f.tokens, f.targets);
  }
}

TEST_CASE("llama with bf16 activations: the residual stream handed from layer to layer, the same bits as each "
          "layer's own sum", "[llama][bf16act]") {
  for (const LlamaOptions& o : {gqa(), mha_tied_biases()}) {
    Fixture f(o);
    auto off = make_llama(o);
    off->params().copy_from(f.fp32->params());
    off->set_bf16_activations(true);
    dynamic_cast<Llama&>(off->root()).set_residual_hand_off(false);
    test::check_residual_hand_off(*f.bf16, *off, f.tokens, f.targets);
    // The hand-off is on by default: a training step runs one add_bf16 a layer fewer than without it (the backward's
    // input-gradient sums remain), and every norm but the first adds before normalising.
    const auto count = [&](Model& m) {
      TimedKernels timed(m.kernels());
      m.set_kernels(timed);
      (void)test::lm_step(m, f.tokens, f.targets);
      timed.collect();
      m.set_kernels(kernels_for(Device::cpu()));
      std::map<std::string, int64_t> calls;
      for (const auto& r : timed.rows())
        calls[r.op + (r.shape.find("residual add before") != std::string::npos ? " (add)" : "")] += r.calls;
      return calls;
    };
    auto with = count(*f.bf16), without = count(*off);
    CHECK(with["matmul_bf16"] > 0);  // the step was timed
    CHECK(without["add_bf16"] - with["add_bf16"] == o.n_layer);
    CHECK(with["rmsnorm_forward_bf16 (add)"] == 2 * o.n_layer);
    CHECK(with["rmsnorm_forward_bf16"] == 1);
    CHECK(without["rmsnorm_forward_bf16 (add)"] == o.n_layer);
  }
}

TEST_CASE("Linear's packed bf16 output: its columns of the shared buffer, the same bits as its own output, and the "
          "same gradients from those columns", "[llama][bf16act]") {
  std::mt19937_64 rng(5);
  Kernels& k = kernels_for(Device::cpu());
  for (const bool bias : {false, true}) {
    CAPTURE(bias);
    // Two layers over the same weights (bf16 copies bound as Model::set_bf16_activations binds them), gradients
    // apart.
    Linear plain(8, 6, false, bias), lin(8, 6, false, bias);
    Tensor w = dpt::test::random_tensor({6, 8}, rng), b = dpt::test::random_tensor({6}, rng);
    Tensor w16 = Tensor::empty({6, 8}, DType::BF16), b16 = Tensor::empty({6}, DType::BF16);
    to_bfloat16(w, w16);
    to_bfloat16(b, b16);
    Tensor dw[2] = {Tensor::zeros({6, 8}), Tensor::zeros({6, 8})}, db[2] = {Tensor::zeros({6}), Tensor::zeros({6})};
    int i = 0;
    for (Linear* m : {&plain, &lin}) {
      m->bind(bias ? std::vector<Tensor>{w, b} : std::vector<Tensor>{w},
              bias ? std::vector<Tensor>{dw[i], db[i]} : std::vector<Tensor>{dw[i]}, {});
      m->bind_bf16(bias ? std::vector<Tensor>{w16, b16} : std::vector<Tensor>{w16});
      ++i;
    }
    Tensor packed = Tensor::empty({5, 16}, DType::BF16);
    for (size_t j = 0; j < packed.numel(); ++j) packed.data<BFloat16>()[j] = to_bfloat16(-7.0f);  // poison
    lin.pack_bf16_output(&packed, 4);  // columns 4..9 of 16
    Tensor x = Tensor::empty({5, 8}, DType::BF16);
    for (size_t j = 0; j < x.numel(); ++j) x.data<BFloat16>()[j] = to_bfloat16(uniform(rng, -1.0f, 1.0f));
    const Tensor want = plain.forward(x, k);
    const Tensor& got = lin.forward(x, k);
    REQUIRE(&got == &packed);
    size_t wrong = 0, touched = 0;
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 16; ++c) {
        const float g = to_float(packed.data<BFloat16>()[r * 16 + c]);
        if (c >= 4 && c < 10)
          wrong += g != to_float(want.data<BFloat16>()[r * 6 + c - 4]);
        else
          touched += g != -7.0f;
      }
    CHECK(wrong == 0);
    CHECK(touched == 0);
    // The gradient: random values in this layer's columns of a [5, 16] tensor, noise in the others.
    Tensor dpacked = Tensor::empty({5, 16}, DType::BF16), dy = Tensor::empty({5, 6}, DType::BF16);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 16; ++c) {
        const BFloat16 v = to_bfloat16(uniform(rng, -1.0f, 1.0f));
        dpacked.data<BFloat16>()[r * 16 + c] = v;
        if (c >= 4 && c < 10) dy.data<BFloat16>()[r * 6 + c - 4] = v;
      }
    plain.set_needs_input_grad(true);
    lin.set_needs_input_grad(true);
    const Tensor dx_want = plain.backward(dy, k);
    const Tensor& dx_got = lin.backward(dpacked, k);
    REQUIRE(dx_got.dtype() == DType::BF16);
    CHECK(std::memcmp(dx_got.raw(), dx_want.raw(), dx_want.bytes()) == 0);
    CHECK(std::memcmp(dw[0].raw(), dw[1].raw(), dw[0].bytes()) == 0);
    CHECK(std::memcmp(db[0].raw(), db[1].raw(), db[0].bytes()) == 0);
    double norm = 0;
    for (size_t j = 0; j < dw[1].numel(); ++j) norm += std::abs(dw[1].data<float>()[j]);
    CHECK(norm > 0);
  }
}
