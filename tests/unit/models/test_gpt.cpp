// tests/unit/models/test_gpt.cpp: the GPT's layers and the whole model on the CPU kernel set: LayerNorm, GELU,
// causal self-attention, blocks and the tied-head GPT against central finite differences; LayerNorm, GELU and
// the causal softmax against closed forms; causality; nanoGPT's names, shapes, counts and initialisation; the
// config.json Hugging Face's GPT2LMHeadModel reads, both ways (gpt_hf_config_json, parse_hf_gpt2_config).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>

#include "model_testing.h"
#include "models/gpt/gpt.h"
#include "models/gpt/weights.h"
#include "models/kernels/factory.h"

using namespace dpt;
using namespace dpt::models;
using dpt::test::check_gradients;
using dpt::test::random_tensor;
using dpt::test::random_tokens;
using dpt::test::scaled;
using dpt::test::wrap;

namespace {

GptOptions tiny(int64_t n_layer = 2) {
  GptOptions o;
  o.n_layer = n_layer;
  o.n_head = 2;
  o.n_embd = 8;
  o.vocab_size = 11;
  o.block_size = 6;
  return o;
}

}  // namespace

TEST_CASE("LayerNorm: zero mean and unit variance per row, then the affine map, and GELU: the tanh formula",
          "[models][gpt]") {
  std::mt19937_64 rng(1);
  Kernels& k = kernels_for(Device::cpu());
  const int64_t rows = 3, c = 7;
  Tensor x = random_tensor({rows, c}, rng, 3.0f), g = random_tensor({c}, rng), b = random_tensor({c}, rng);
  Tensor y = Tensor::empty({rows, c}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  k.layernorm_forward(x.data<float>(), g.data<float>(), b.data<float>(), y.data<float>(), mean.data<float>(),
                      rstd.data<float>(), rows, c, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < c; ++i) m += x.data<float>()[r * c + i];
    m /= c;
    for (int64_t i = 0; i < c; ++i) v += std::pow(x.data<float>()[r * c + i] - m, 2);
    v /= c;  // biased, as nn.LayerNorm
    REQUIRE(mean.data<float>()[r] == Approx(m).margin(1e-6));
    REQUIRE(rstd.data<float>()[r] == Approx(1.0 / std::sqrt(v + 1e-5)).epsilon(1e-5));
    for (int64_t i = 0; i < c; ++i) {
      const double want = (x.data<float>()[r * c + i] - m) / std::sqrt(v + 1e-5) * g.data<float>()[i] + b.data<float>()[i];
      REQUIRE(y.data<float>()[r * c + i] == Approx(want).epsilon(1e-5).margin(1e-6));
    }
  }
  // GELU(tanh) and its derivative against the formula in double over [-10, 10] (oneDNN's vectorised kernel on
  // most CPUs), in place too.
  const int64_t n = 4001;
  Tensor gx = Tensor::empty({n}), gy = Tensor::empty({n}), gdy = Tensor::empty({n}), gdx = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) {
    gx.data<float>()[i] = -10.0f + 20.0f * static_cast<float>(i) / static_cast<float>(n - 1);
    gdy.data<float>()[i] = 1.0f - 0.25f * static_cast<float>(i % 7);
  }
  k.gelu_forward(gx.data<float>(), gy.data<float>(), n);
  k.gelu_backward(gx.data<float>(), gdy.data<float>(), gdx.data<float>(), n);
  const double a = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t i = 0; i < n; ++i) {
    const double v = gx.data<float>()[i], u = a * (v + 0.044715 * v * v * v), t = std::tanh(u);
    const double grad = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * a * (1.0 + 3.0 * 0.044715 * v * v);
    REQUIRE(gy.data<float>()[i] == Approx(0.5 * v * (1.0 + t)).epsilon(1e-6).margin(1e-6));
    REQUIRE(gdx.data<float>()[i] == Approx(gdy.data<float>()[i] * grad).epsilon(1e-5).margin(1e-6));
  }
  Tensor same = Tensor::empty({n});
  same.copy_from(gx);
  k.gelu_forward(same.data<float>(), same.data<float>(), n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(same.data<float>()[i] == gy.data<float>()[i]);
  k.gelu_backward(gx.data<float>(), gdy.data<float>(), gdy.data<float>(), n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(gdy.data<float>()[i] == gdx.data<float>()[i]);
}

TEST_CASE("GELU on the CPU: any length and offset gives each element the same bits (oneDNN's chunk and padded "
          "tail)", "[models][gpt]") {
  Kernels& k = kernels_for(Device::cpu());
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-6, 6);
  const size_t n = 40001;  // two chunks of 16384 in one call, and a tail of 7233 padded to 8192
  std::vector<float> x(n), dy(n), y(n), dx(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = u(rng);
    dy[i] = u(rng);
  }
  k.gelu_forward(x.data(), y.data(), n);
  k.gelu_backward(x.data(), dy.data(), dx.data(), n);
  for (const size_t len : {size_t{1}, size_t{255}, size_t{257}, size_t{8191}, size_t{16384}, size_t{17385}})
    for (const size_t off : {size_t{0}, size_t{3}, n - len}) {
      CAPTURE(len, off);
      std::vector<float> ys(len, NAN), dxs(len, NAN);
      k.gelu_forward(x.data() + off, ys.data(), len);
      k.gelu_backward(x.data() + off, dy.data() + off, dxs.data(), len);
      CHECK(std::memcmp(ys.data(), y.data() + off, len * sizeof(float)) == 0);
      CHECK(std::memcmp(dxs.data(), dx.data() + off, len * sizeof(float)) == 0);
    }
}

TEST_CASE("LayerNorm::forward_add: the norm of a + b with the sum kept, as the add and then the norm, bit for bit",
          "[models][gpt]") {
  std::mt19937_64 rng(21);
  auto ln = std::make_unique<LayerNorm>(24);
  LayerNorm& norm = *ln;
  auto model = wrap(std::move(ln));
  for (size_t i = 0; i < model->num_params(); ++i) model->params().data<float>()[i] = models::uniform(rng, 0.5f, 1.5f);
  dpt::test::check_forward_add(*model, norm, 5, 24, rng);
}

TEST_CASE("causal softmax: each row sums to one over j <= i, zero above the diagonal", "[models][gpt]") {
  std::mt19937_64 rng(2);
  Kernels& k = kernels_for(Device::cpu());
  const int64_t count = 2, t = 5;
  const float scale = 0.5f;
  Tensor s = random_tensor({count, t, t}, rng, 4.0f);
  Tensor ref = Tensor::empty(s.shape());
  ref.copy_from(s);
  k.causal_softmax_forward(s.data<float>(), count, t, t, scale);
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < t; ++i) {
      const float* in = ref.data<float>() + (m * t + i) * t;
      const float* out = s.data<float>() + (m * t + i) * t;
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) z += std::exp(scale * in[j]);
      for (int64_t j = 0; j < t; ++j) REQUIRE(out[j] == Approx(j <= i ? std::exp(scale * in[j]) / z : 0.0).margin(1e-6));
    }
}

TEST_CASE("causal softmax over several of the CPU kernel's row blocks: exact to float rounding, a KV cache's last "
          "rows the same bits as the square one's", "[models][gpt]") {
  // 100 columns: blocks of 163 rows, so the blocks' edges fall inside the matrices.
  std::mt19937_64 rng(3);
  Kernels& k = kernels_for(Device::cpu());
  const int64_t count = 4, t = 100, rows = 37;
  const float scale = 0.3f;
  Tensor s = random_tensor({count, t, t}, rng, 6.0f);
  Tensor ref = Tensor::empty(s.shape());
  ref.copy_from(s);
  Tensor tail = Tensor::empty({count, rows, t});
  for (int64_t m = 0; m < count; ++m)
    std::copy_n(s.data<float>() + (m * t + t - rows) * t, rows * t, tail.data<float>() + m * rows * t);
  k.causal_softmax_forward(s.data<float>(), count, t, t, scale);
  k.causal_softmax_forward(tail.data<float>(), count, rows, t, scale);
  double worst = 0;
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < t; ++i) {
      const float* in = ref.data<float>() + (m * t + i) * t;
      const float* out = s.data<float>() + (m * t + i) * t;
      double mx = -INFINITY, z = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, double(scale * in[j]));
      for (int64_t j = 0; j <= i; ++j) z += std::exp(scale * in[j] - mx);
      for (int64_t j = 0; j < t; ++j) {
        const double want = j <= i ? std::exp(scale * in[j] - mx) / z : 0.0;
        const double err = std::abs(out[j] - want) / (want + 1e-30);
        worst = std::max(worst, j <= i ? err : std::abs(out[j]));
        if (!(j <= i ? err < 1e-5 : out[j] == 0.0f)) FAIL_CHECK("[" << m << ", " << i << ", " << j << "] = " << out[j]
                                                                    << ", exactly " << want);
      }
    }
  INFO("worst relative error " << worst);
  CHECK(worst < 1e-5);
  for (int64_t m = 0; m < count; ++m)
    REQUIRE(std::memcmp(tail.data<float>() + m * rows * t, s.data<float>() + (m * t + t - rows) * t,
                        rows * t * sizeof(float)) == 0);
}

TEST_CASE("causal softmax of the last rows (a KV cache's queries) equals those rows of the square one", "[models][gpt]") {
  std::mt19937_64 rng(12);
  Kernels& k = kernels_for(Device::cpu());
  const int64_t count = 3, t = 6, rows = 2;
  Tensor sq = random_tensor({count, t, t}, rng, 3.0f);
  Tensor tail = Tensor::empty({count, rows, t});
  for (int64_t m = 0; m < count; ++m)
    std::copy_n(sq.data<float>() + (m * t + t - rows) * t, rows * t, tail.data<float>() + m * rows * t);
  k.causal_softmax_forward(sq.data<float>(), count, t, t, 0.7f);
  k.causal_softmax_forward(tail.data<float>(), count, rows, t, 0.7f);
  for (int64_t m = 0; m < count; ++m)
    for (int64_t i = 0; i < rows * t; ++i)
      REQUIRE(tail.data<float>()[m * rows * t + i] == sq.data<float>()[(m * t + t - rows) * t + i]);
  REQUIRE_THROWS(k.causal_softmax_forward(tail.data<float>(), 1, 3, 2, 1.0f));
}

TEST_CASE("strided batched gemm equals one gemm per matrix", "[models][gpt]") {
  std::mt19937_64 rng(13);
  Kernels& k = kernels_for(Device::cpu());
  // Three heads' [4, 2] slices of a [4, 9] matrix (column stride 3 between heads), times [2, 5] matrices.
  Tensor a = random_tensor({4, 9}, rng, 1.0f), b = random_tensor({3, 2, 5}, rng, 1.0f);
  Tensor c = Tensor::zeros({3, 4, 5}), want = Tensor::zeros({3, 4, 5});
  k.gemm_strided_batched(false, false, 4, 5, 2, 1.0f, a.data<float>(), 9, 3, b.data<float>(), 5, 10, 0.0f,
                         c.data<float>(), 5, 20, 3);
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < 2; ++l) acc += a.data<float>()[i * 9 + h * 3 + l] * b.data<float>()[h * 10 + l * 5 + j];
        REQUIRE(c.data<float>()[h * 20 + i * 5 + j] == Approx(acc).margin(1e-5));
      }
}

TEST_CASE("GPT layers: gradients match finite differences", "[models][gpt]") {
  std::mt19937_64 rng(3);
  SECTION("LayerNorm") { auto m = wrap(std::make_unique<LayerNorm>(6)); check_gradients(*m, random_tensor({4, 6}, rng, 2.0f), 50, 1e-2f, 3e-2, 3e-3); }
  SECTION("GELU") { auto m = wrap(std::make_unique<Gelu>()); check_gradients(*m, random_tensor({3, 7}, rng, 3.0f), 51, 1e-3f); }
  // Weights 25x GPT-2's (std 0.5): attention scores of order 1, so the softmax's gradient matters.
  SECTION("causal self-attention, 2 heads, T 5") {
    auto m = scaled(wrap(std::make_unique<CausalSelfAttention>(8, 2, 1)), 25.0f);
    check_gradients(*m, random_tensor({2, 5, 8}, rng), 52, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("causal self-attention, 1 head, T 1") {
    auto m = scaled(wrap(std::make_unique<CausalSelfAttention>(4, 1, 1)), 25.0f);
    check_gradients(*m, random_tensor({3, 1, 4}, rng), 53, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("MLP") { auto m = scaled(wrap(std::make_unique<GptMlp>(4, 1)), 25.0f); check_gradients(*m, random_tensor({2, 3, 4}, rng), 54, 1e-3f, 3e-2, 3e-3); }
  // Margin 1e-2, not 3e-3: the block's float32 forward rounds differently with each OpenBLAS kernel set, and with the
  // Prescott and Sandybridge kernels (what OpenBLAS runs on CPUs it does not know) that rounding alone moved one
  // central difference by 3.6e-3 (analytic -0.0827, numeric -0.0862). A larger eps is no way out: at 3e-3 the
  // truncation error of the 10x-scaled weights moves the large gradients by 4%.
  SECTION("block") { auto m = scaled(wrap(std::make_unique<GptBlock>(8, 2, 2)), 10.0f); check_gradients(*m, random_tensor({2, 4, 8}, rng), 55, 1e-3f, 3e-2, 1e-2); }
}

TEST_CASE("GPT: every parameter's gradient (tied head included) matches finite differences", "[models][gpt]") {
  std::mt19937_64 rng(4);
  GptOptions o = tiny();
  auto model = make_gpt(o);
  model->init(7);
  // Larger weights than GPT-2's 0.02 so that every path (attention, MLP) carries a gradient well above the noise.
  // eps 1e-3: at 1e-2 the curvature shows (errors of 4%), at 3e-4 float32 rounding in the logits does.
  model = scaled(std::move(model), 4.0f);
  check_gradients(*model, random_tokens(2, 5, o.vocab_size, rng), 56, 1e-3f, 3e-2, 3e-3, 1500, false);
}

TEST_CASE("GPT: gradients split into released storages, held through the hooks, equal the flat buffer's (tied head)",
          "[models][gpt][zero]") {
  // ZeRO stage 2's use of Model::split_grads: every parameter's gradient in a storage of its own, released between
  // steps; the before_backward hook makes each resident (zeroed) before its first write. The tied LM head writes wte's gradient
  // inside Gpt's backward, before the transformer's own: without Gpt::uses_params_of() it would write released memory.
  std::mt19937_64 rng(9);
  GptOptions o = tiny();
  auto flat = make_gpt(o), split = make_gpt(o);
  flat->init(11);
  split->init(11);
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t p = 0; p < split->named_params().size(); ++p) ranges.emplace_back(p, p + 1);
  std::vector<Tensor> parts = split->split_grads(ranges);
  REQUIRE(parts.size() == ranges.size());
  REQUIRE(split->grads_split());
  REQUIRE_FALSE(split->grads().defined());
  std::vector<int> held(parts.size(), 0);
  split->set_param_hooks({.before_backward = [&](size_t first, size_t end) {
    for (size_t p = first; p < end; ++p) {
      if (parts[p].storage().resident()) continue;
      parts[p].storage().reserve();
      parts[p].zero_();
      ++held[p];
    }
  }});
  for (int step = 0; step < 2; ++step) {
    for (Tensor& part : parts) part.storage().release();
    flat->zero_grad();
    split->zero_grad();  // nothing resident: nothing to zero
    for (int micro = 0; micro < 2; ++micro) {  // accumulation: the storages stay resident over micro-batches
      const Tensor x = random_tokens(2, 5, o.vocab_size, rng);
      const Tensor r = random_tensor({10, padded_vocab(o)}, rng);  // d(loss)/d(logits), [B * T, V]
      flat->forward(x);
      flat->backward(r);
      split->forward(x);
      split->backward(r);
    }
    for (size_t p = 0; p < parts.size(); ++p) {
      INFO(split->named_params()[p].name);
      REQUIRE(parts[p].storage().resident());
      REQUIRE(held[p] == step + 1);  // reserved once per step, before its first write
      const Tensor& want = flat->named_params()[p].grad;
      REQUIRE(split->named_params()[p].grad.raw() == parts[p].raw());
      for (size_t i = 0; i < want.numel(); ++i) REQUIRE(parts[p].data<float>()[i] == want.data<float>()[i]);
    }
  }
  REQUIRE_THROWS_AS(split->split_grads(ranges), InternalError);
  auto other = make_gpt(o);
  REQUIRE_THROWS_AS(other->split_grads({{0, 1}}), InternalError);  // must cover every parameter once
}

TEST_CASE("GPT: causal (a later token never changes an earlier position's logits) and length-agnostic",
          "[models][gpt]") {
  std::mt19937_64 rng(5);
  GptOptions o = tiny();
  auto model = make_gpt(o);
  model->init(8);
  Tensor x = random_tokens(1, 6, o.vocab_size, rng);
  const Tensor before = model->forward(x).to(Device::cpu());
  Tensor before_copy = Tensor::empty(before.shape());
  before_copy.copy_from(before);
  x.data<int32_t>()[4] = (x.data<int32_t>()[4] + 1) % static_cast<int32_t>(o.vocab_size);
  const Tensor& after = model->forward(x);
  const int64_t v = padded_vocab(o);  // the row stride of the logits
  REQUIRE(v == 128);
  for (int64_t i = 0; i < 4 * v; ++i) REQUIRE(after.data<float>()[i] == before_copy.data<float>()[i]);
  bool changed = false;
  for (int64_t i = 4 * v; i < 6 * v; ++i) changed |= after.data<float>()[i] != before_copy.data<float>()[i];
  REQUIRE(changed);
  // The first 3 tokens alone give the first 3 rows of the same logits.
  Tensor prefix = Tensor::empty({1, 3}, DType::I32);
  for (int i = 0; i < 3; ++i) prefix.data<int32_t>()[i] = x.data<int32_t>()[i];
  const Tensor& short_logits = model->forward(prefix);
  REQUIRE(short_logits.shape() == std::vector<int64_t>{3, v});
  for (int64_t i = 0; i < 3 * v; ++i) REQUIRE(short_logits.data<float>()[i] == Approx(before_copy.data<float>()[i]).margin(1e-5));
}

TEST_CASE("GPT: nanoGPT's names, shapes and parameter count, and GPT-2's initialisation", "[models][gpt]") {
  GptOptions o;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_embd = 32;
  o.vocab_size = 100;
  o.block_size = 16;
  auto model = make_gpt(o);
  model->init(9);
  const auto& p = model->named_params();
  REQUIRE(p.front().name == "transformer.wte.weight");
  REQUIRE(p.front().param.shape() == std::vector<int64_t>{128, 32});  // the vocabulary padded to 128
  REQUIRE(p[1].name == "transformer.wpe.weight");
  REQUIRE(p[2].name == "transformer.h.0.ln_1.weight");
  REQUIRE(p[4].name == "transformer.h.0.attn.c_attn.weight");
  REQUIRE(p[4].param.shape() == std::vector<int64_t>{96, 32});  // nn.Linear's [out, in]
  REQUIRE(p[6].name == "transformer.h.0.attn.c_proj.weight");
  REQUIRE(p[10].name == "transformer.h.0.mlp.c_fc.weight");
  REQUIRE(p[12].name == "transformer.h.0.mlp.c_proj.weight");
  REQUIRE(p.back().name == "transformer.ln_f.bias");
  // nanoGPT's count (the tied head counted once): V C + T C + L (12 C^2 + 13 C) + 2 C, V padded.
  const int64_t c = 32;
  REQUIRE(model->num_params() == static_cast<size_t>(128 * c + 16 * c + 3 * (12 * c * c + 13 * c) + 2 * c));
  REQUIRE(gpt_num_params(o) == static_cast<int64_t>(model->num_params()));
  REQUIRE(gpt_num_params(o, false) == static_cast<int64_t>(model->num_params()) - 16 * c);
  REQUIRE(gpt_flops_per_token(o, 16) == 6.0 * static_cast<double>(gpt_num_params(o, false)) + 12.0 * 3 * 16 * c);
  for (int64_t i = 100 * c; i < 128 * c; ++i) REQUIRE(p.front().param.data<float>()[i] == 0.0f);  // padding rows
  // GPT-2 124M with the vocabulary padded to 50304: llm.c's count, 124475904.
  REQUIRE(gpt_num_params(GptOptions{}) == 124475904);
  REQUIRE(padded_vocab(GptOptions{}) == 50304);
  auto stddev = [&](const std::string& name) {
    for (const auto& np : p)
      if (np.name == name) {
        double s = 0, s2 = 0;
        const float* v = np.param.data<float>();
        const size_t count = name == "transformer.wte.weight" ? 100 * c : np.param.numel();  // without the padding
        for (size_t i = 0; i < count; ++i) s += v[i], s2 += double(v[i]) * v[i];
        const double n = static_cast<double>(count);
        REQUIRE(std::abs(s / n) < 0.004);
        return std::sqrt(s2 / n - (s / n) * (s / n));
      }
    FAIL("no parameter " << name);
    return 0.0;
  };
  REQUIRE(stddev("transformer.wte.weight") == Approx(0.02).epsilon(0.1));
  REQUIRE(stddev("transformer.h.1.attn.c_attn.weight") == Approx(0.02).epsilon(0.1));
  REQUIRE(stddev("transformer.h.1.mlp.c_proj.weight") == Approx(0.02 / std::sqrt(6.0)).epsilon(0.1));
  for (const auto& np : p)
    if (np.name.ends_with("ln_1.weight")) REQUIRE(np.param.data<float>()[5] == 1.0f);
  o.n_head = 5;
  REQUIRE_THROWS_AS(make_gpt(o), ConfigError);
  Tensor too_long = Tensor::zeros({1, 17}, DType::I32);
  REQUIRE_THROWS_AS(model->forward(too_long), ConfigError);
  Tensor bad_token = Tensor::zeros({1, 2}, DType::I32);
  bad_token.data<int32_t>()[1] = 100;
  REQUIRE_THROWS_WITH(model->forward(bad_token), Catch::Contains("token 100 at position 1"));
}

TEST_CASE("GPT with a KV cache: token by token gives the whole sequence's logits", "[models][gpt]") {
  std::mt19937_64 rng(14);
  GptOptions o = tiny(3);
  auto model = make_gpt(o);
  model->init(15);
  model->set_training(false);
  auto& gpt = dynamic_cast<Gpt&>(model->root());
  const int64_t b = 2, t = o.block_size, vp = padded_vocab(o);
  Tensor x = random_tokens(b, t, o.vocab_size, rng);
  const Tensor full = model->forward(x).to(Device::cpu());
  Tensor want = Tensor::empty(full.shape());
  want.copy_from(full);
  gpt.begin_kv_cache(b, Device::cpu());
  // A prompt of 2 positions, then one at a time, then the cache is full.
  int64_t pos = 0;
  for (int64_t n : {2, 1, 1, 1, 1}) {
    Tensor step = Tensor::empty({b, n}, DType::I32);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < n; ++j) step.data<int32_t>()[i * n + j] = x.data<int32_t>()[i * t + pos + j];
    const Tensor& got = model->forward(step);
    REQUIRE(got.shape() == std::vector<int64_t>{b * n, vp});
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t v = 0; v < vp; ++v) {
          const float g = got.data<float>()[(i * n + j) * vp + v], w = want.data<float>()[(i * t + pos + j) * vp + v];
          if (v >= o.vocab_size) REQUIRE(g == w);  // -inf
          else REQUIRE(g == Approx(w).margin(1e-5));
        }
    pos += n;
    REQUIRE(gpt.kv_cache_len() == pos);
  }
  Tensor one = Tensor::zeros({b, 1}, DType::I32);
  REQUIRE_THROWS_WITH(model->forward(one), Catch::Contains("block_size is 6"));  // 7 positions
  gpt.end_kv_cache();
  REQUIRE(model->forward(x).shape() == want.shape());  // whole sequences again
  REQUIRE(model->forward(x).data<float>()[7] == Approx(want.data<float>()[7]).margin(1e-6));
}

TEST_CASE("GPT with model.recompute: the same logits and gradients, bit for bit, from shared activation buffers", "[models][gpt]") {
  std::mt19937_64 rng(16);
  GptOptions o = tiny(3);
  auto plain = make_gpt(o);
  o.recompute = true;
  auto recomputing = make_gpt(o);
  plain->init(17);
  recomputing->init(17);
  for (int step = 0; step < 2; ++step) {  // twice: the second pass reuses every buffer
    Tensor x = random_tokens(2, o.block_size, o.vocab_size, rng);
    const Tensor r = dpt::test::random_tensor({2 * o.block_size, padded_vocab(o)}, rng);
    plain->zero_grad();
    recomputing->zero_grad();
    const Tensor& a = plain->forward(x);
    const Tensor& b = recomputing->forward(x);
    REQUIRE(std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);
    plain->backward(r);
    recomputing->backward(r);
    REQUIRE(std::memcmp(plain->grads().raw(), recomputing->grads().raw(), plain->grads().bytes()) == 0);
  }
}

TEST_CASE("GPT: Hugging Face's config.json (GPT2Config) says this GPT's sizes, GELU(tanh) and LayerNorm epsilon",
          "[models][gpt]") {
  GptOptions o;  // GPT-2 124M: its vocabulary ends in <|endoftext|>
  auto c = nlohmann::json::parse(gpt_hf_config_json(o));
  REQUIRE(c.at("model_type") == "gpt2");
  REQUIRE(c.at("architectures") == nlohmann::json::array({"GPT2LMHeadModel"}));
  REQUIRE(c.at("n_layer") == 12);
  REQUIRE(c.at("n_head") == 12);
  REQUIRE(c.at("n_embd") == 768);
  REQUIRE(c.at("vocab_size") == 50257);  // the real vocabulary, as exported, not padded_vocab's 50304
  REQUIRE(c.at("n_positions") == 1024);
  REQUIRE(c.at("n_ctx") == 1024);
  REQUIRE(c.at("n_inner").is_null());  // 4 n_embd
  REQUIRE(c.at("activation_function") == "gelu_new");  // GELU(tanh): transformers' "gelu" is GELU(erf)
  REQUIRE(c.at("layer_norm_epsilon").get<double>() == 1e-5);
  REQUIRE(static_cast<float>(c.at("layer_norm_epsilon").get<double>()) == kGptLayerNormEps);
  REQUIRE(c.at("tie_word_embeddings") == true);
  for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) REQUIRE(c.at(p) == 0.0);
  REQUIRE(c.at("bos_token_id") == 50256);
  REQUIRE(c.at("eos_token_id") == 50256);

  o = {.n_layer = 2, .n_head = 2, .n_embd = 64, .vocab_size = 256, .block_size = 32};  // byte-level tokens
  c = nlohmann::json::parse(gpt_hf_config_json(o));
  REQUIRE(c.at("n_layer") == 2);
  REQUIRE(c.at("n_head") == 2);
  REQUIRE(c.at("n_embd") == 64);
  REQUIRE(c.at("vocab_size") == 256);
  REQUIRE(c.at("n_positions") == 32);
  REQUIRE(c.at("bos_token_id").is_null());  // no <|endoftext|> among 256 bytes
  REQUIRE(c.at("eos_token_id").is_null());
}

TEST_CASE("GPT: a Hugging Face GPT-2 config.json gives the sizes, and what dptrain's GPT does not compute is "
          "refused by name", "[models][gpt]") {
  // The hub's gpt2/config.json, as it is (dropout 0.1, the summary_* keys of the double-heads model, n_ctx).
  const nlohmann::json hub = nlohmann::json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257})");
  GptOptions o = parse_hf_gpt2_config(hub.dump(), "c.json");
  CHECK(o.n_layer == 12);
  CHECK(o.n_head == 12);
  CHECK(o.n_embd == 768);
  CHECK(o.vocab_size == 50257);
  CHECK(o.block_size == 1024);
  // What an export writes reads back to the same sizes.
  const GptOptions small{.n_layer = 3, .n_head = 4, .n_embd = 32, .vocab_size = 300, .block_size = 48};
  o = parse_hf_gpt2_config(gpt_hf_config_json(small), "exported");
  CHECK(o.n_layer == 3);
  CHECK(o.n_head == 4);
  CHECK(o.n_embd == 32);
  CHECK(o.vocab_size == 300);
  CHECK(o.block_size == 48);
  nlohmann::json j = hub;
  j["activation_function"] = "gelu_pytorch_tanh";  // GELU(tanh) too
  j["layer_norm_epsilon"] = 9.999999747378752e-06;  // 1e-5f widened: the same float
  j["n_inner"] = 3072;
  CHECK(parse_hf_gpt2_config(j.dump(), "c.json").n_embd == 768);

  const auto refused = [&](const char* key, const nlohmann::json& value, const std::string& why) {
    nlohmann::json bad = hub;
    bad[key] = value;
    INFO(bad.dump());
    CHECK_THROWS_WITH(parse_hf_gpt2_config(bad.dump(), "c.json"), Catch::Contains(why));
  };
  refused("activation_function", "gelu", "activation_function = \"gelu\"");
  refused("activation_function", "relu", "activation_function = \"relu\"");
  refused("layer_norm_epsilon", 0.5, "layer_norm_epsilon = 0.5");
  refused("layer_norm_epsilon", 1e-6, "layer_norm_epsilon = 1e-06");
  refused("scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx = true");
  refused("reorder_and_upcast_attn", true, "reorder_and_upcast_attn = true");
  refused("scale_attn_weights", false, "scale_attn_weights = false");
  refused("tie_word_embeddings", false, "tie_word_embeddings = false");
  refused("n_inner", 1000, "n_inner = 1000");
  refused("n_head", 7, "not a multiple of n_head 7");
  refused("n_layer", 0, "n_layer = 0 must be a positive integer");
  refused("use_fancy_attention", true, "key 'use_fancy_attention' = true is not one dptrain reads");
  refused("quantization_config", {{"quant_method", "gptq"}}, "quantization_config");
  refused("model_type", "llama",
          "model_type 'llama' is a model of the Llama family, not GPT-2: set model.name = llama");
  refused("model_type", "qwen2", "set model.name = llama");
  refused("model_type", "bert", "model_type 'bert' is not GPT-2");
  CHECK_THROWS_WITH(parse_hf_gpt2_config("[1]", "c.json"), Catch::Contains("holds an object"));
}

TEST_CASE("GPT: weights of a longer context load cropped to block_size (nanoGPT's crop_block_size), the rest as is",
          "[models][gpt]") {
  const GptOptions o = tiny();  // block_size 6, n_embd 8
  std::mt19937_64 rng(7);
  const Tensor wpe = random_tensor({10, o.n_embd}, rng);
  const Tensor wte = random_tensor({o.vocab_size, o.n_embd}, rng);
  std::string layout;
  const auto out = gpt_import_weights({{"wpe.weight", wpe}, {"wte.weight", wte}}, "f", o, &layout);
  REQUIRE(out.size() == 2);
  CHECK(out[0].name == "transformer.wpe.weight");
  REQUIRE(out[0].tensor.shape() == std::vector<int64_t>{o.block_size, o.n_embd});
  CHECK(std::memcmp(out[0].tensor.data<float>(), wpe.data<float>(), o.block_size * o.n_embd * sizeof(float)) == 0);
  CHECK(layout == "nanoGPT layout, wpe.weight cropped to its first 6 of 10 positions (model.block_size)");
  // As many positions as the model, or fewer (a load error names the shape later): untouched, no note.
  const auto same = gpt_import_weights({{"transformer.wpe.weight", out[0].tensor}}, "f", o, &layout);
  CHECK(same[0].tensor.shape() == out[0].tensor.shape());
  CHECK(layout == "nanoGPT layout");
}

TEST_CASE("GPT: a Hugging Face Conv1D weight of another shape is refused in the file's names and [in, out] shape",
          "[models][gpt]") {
  const GptOptions o = tiny();  // n_embd 8
  const int64_t c = o.n_embd;
  std::mt19937_64 rng(5);
  std::string layout;
  // Layer 0's c_attn as Hugging Face's [in, out] makes the file Hugging Face's layout.
  const auto with = [&](const std::string& name, const Tensor& t) {
    return std::vector<NamedTensor>{{"h.0.attn.c_attn.weight", random_tensor({c, 3 * c}, rng)}, {name, t}};
  };
  const auto ok = gpt_import_weights(with("h.0.mlp.c_fc.weight", random_tensor({c, 4 * c}, rng)), "f", o, &layout);
  CHECK(layout == "Hugging Face layout");
  REQUIRE(ok[1].name == "transformer.h.0.mlp.c_fc.weight");
  CHECK(ok[1].tensor.shape() == std::vector<int64_t>{4 * c, c});  // nn.Linear's [out, in]
  // Another width: the file's name and shape, and the shape it should have, not the transposed ones ([100, 8]).
  CHECK_THROWS_WITH(gpt_import_weights(with("h.0.mlp.c_fc.weight", random_tensor({c, 100}, rng)), "f", o, &layout),
                    Catch::Contains("f: h.0.mlp.c_fc.weight is float32 [8, 100], this model expects float32 [8, 32]"));
  CHECK_THROWS_WITH(gpt_import_weights(with("h.0.mlp.c_proj.weight", random_tensor({c, 4 * c}, rng)), "f", o,
                                       &layout),
                    Catch::Contains("h.0.mlp.c_proj.weight is float32 [8, 32], this model expects float32 [32, 8]"));
  // Not a matrix: a config error naming it (it was an internal check's failure, exit 1).
  CHECK_THROWS_AS(gpt_import_weights(with("h.0.attn.c_proj.weight", random_tensor({c}, rng)), "f", o, &layout),
                  ConfigError);
  CHECK_THROWS_WITH(gpt_import_weights(with("h.0.attn.c_proj.weight", random_tensor({c}, rng)), "f", o, &layout),
                    Catch::Contains("h.0.attn.c_proj.weight is float32 [8], this model expects float32 [8, 8]"));
}

TEST_CASE("GPT: a token embedding of another vocabulary is refused in vocab_size's terms, not the padded shape's",
          "[models][gpt]") {
  GptOptions o = tiny();
  o.vocab_size = 100;  // padded to 128
  std::mt19937_64 rng(3);
  std::string layout;
  CHECK_THROWS_WITH(gpt_import_weights({{"wte.weight", random_tensor({90, o.n_embd}, rng)}}, "f", o, &layout),
                    Catch::Contains("wte.weight has 90 rows (tokens), but the model's vocab_size is 100"));
  // The real vocabulary is padded; the padded one is taken as it is.
  for (int64_t rows : {int64_t{100}, padded_vocab(o)}) {
    const auto out = gpt_import_weights({{"wte.weight", random_tensor({rows, o.n_embd}, rng)}}, "f", o, &layout);
    CHECK(out[0].tensor.dim(0) == padded_vocab(o));
  }
}
