// tests/unit/models/test_llama.cpp: the Llama family on the CPU kernel set (models/llama/llama.h): RMSNorm, the
// attention (MHA and grouped-query, with and without biases), the SwiGLU MLP, blocks and the whole model (untied and
// tied heads) against central finite differences; causality and RoPE's relative positions; LlamaForCausalLM's names,
// shapes, parameter count and initialisation; Linear without bias. Parity with transformers' LlamaForCausalLM is
// integration.llama_hf_parity.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <map>

#include "model_testing.h"
#include "models/kernels/cpu/cpu_kernels.h"
#include "models/generate.h"
#include "models/llama/llama.h"

using namespace dpt;
using namespace dpt::models;
using dpt::test::check_gradients;
using dpt::test::random_tensor;
using dpt::test::random_tokens;
using dpt::test::scaled;
using dpt::test::wrap;

namespace {

LlamaOptions tiny(int64_t n_head = 4, int64_t n_kv_head = 2) {
  LlamaOptions o;
  o.n_layer = 2;
  o.n_head = n_head;
  o.n_kv_head = n_kv_head;
  o.n_embd = 8;
  o.head_dim = 4;
  o.intermediate_size = 12;
  o.vocab_size = 11;
  o.max_positions = 8;
  o.rope_theta = 100.0;  // angles that turn visibly over a few positions
  return o;
}

// The RoPE tables of `o`, as LlamaModel builds them for its layers.
std::unique_ptr<RopeTables> tables(const LlamaOptions& o) {
  auto r = std::make_unique<RopeTables>();
  rope_tables(o.max_positions, o.head_dim, o.rope_theta, o.rope_scaling, r->cos_host, r->sin_host);
  return r;
}

}  // namespace

TEST_CASE("Linear without bias: the weight alone, y = x W^T, gradients match finite differences", "[models][llama]") {
  std::mt19937_64 rng(1);
  auto m = wrap(std::make_unique<Linear>(5, 3, false, false));
  REQUIRE(m->named_params().size() == 1);
  REQUIRE(m->named_params()[0].name == "weight");
  REQUIRE(m->num_params() == 15);
  const Tensor x = random_tensor({2, 5}, rng);
  const Tensor& y = m->forward(x);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t o = 0; o < 3; ++o) {
      double want = 0;
      for (int64_t i = 0; i < 5; ++i)
        want += static_cast<double>(x.data<float>()[r * 5 + i]) * m->params().data<float>()[o * 5 + i];
      REQUIRE(y.data<float>()[r * 3 + o] == Approx(want).margin(1e-6));
    }
  check_gradients(*m, random_tensor({4, 5}, rng), 2, 1e-2f);
  REQUIRE_THROWS_AS(Linear(4, 4, /*relu=*/true, /*bias=*/false), InternalError);  // the ReLU runs in the bias pass
}

TEST_CASE("Llama layers: gradients match finite differences", "[models][llama]") {
  std::mt19937_64 rng(3);
  SECTION("RMSNorm") {
    auto m = wrap(std::make_unique<RmsNorm>(6, 1e-6f));
    for (size_t i = 0; i < 6; ++i) m->params().data<float>()[i] = 0.5f + 0.1f * static_cast<float>(i);
    check_gradients(*m, random_tensor({4, 6}, rng, 2.0f), 50, 1e-2f, 3e-2, 3e-3);
  }
  // Weights 25x the initialisation's (std 0.5): attention scores of order 1, so the softmax's gradient matters.
  SECTION("attention, multi-head (4 query and 4 key/value heads)") {
    const LlamaOptions o = tiny(4, 4);
    const auto rope = tables(o);
    auto m = scaled(wrap(std::make_unique<LlamaAttention>(o, rope.get())), 25.0f);
    check_gradients(*m, random_tensor({2, 5, 8}, rng), 51, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("attention, grouped-query (4 query heads over 2 key/value heads), biases on q, k, v and o") {
    LlamaOptions o = tiny(4, 2);
    o.qkv_bias = o.o_bias = true;
    const auto rope = tables(o);
    auto m = scaled(wrap(std::make_unique<LlamaAttention>(o, rope.get())), 25.0f);
    check_gradients(*m, random_tensor({2, 6, 8}, rng), 52, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("attention, multi-query (4 query heads over 1), T 1") {
    const LlamaOptions o = tiny(4, 1);
    const auto rope = tables(o);
    auto m = scaled(wrap(std::make_unique<LlamaAttention>(o, rope.get())), 25.0f);
    check_gradients(*m, random_tensor({3, 1, 8}, rng), 53, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("SwiGLU MLP, with biases") {
    LlamaOptions o = tiny();
    o.mlp_bias = true;
    auto m = scaled(wrap(std::make_unique<LlamaMlp>(o)), 25.0f);
    check_gradients(*m, random_tensor({2, 3, 8}, rng), 54, 1e-3f, 3e-2, 3e-3);
  }
  SECTION("block") {
    const LlamaOptions o = tiny();
    const auto rope = tables(o);
    auto m = scaled(wrap(std::make_unique<LlamaBlock>(o, rope.get())), 5.0f);
    check_gradients(*m, random_tensor({2, 4, 8}, rng), 55, 1e-3f, 3e-2, 3e-3);
  }
}

TEST_CASE("RmsNorm::forward_add: the norm of a + b with the sum kept, as the add and then the norm, bit for bit",
          "[models][llama]") {
  std::mt19937_64 rng(22);
  auto rms = std::make_unique<RmsNorm>(24, 1e-6f);
  RmsNorm& norm = *rms;
  auto model = wrap(std::move(rms));
  for (size_t i = 0; i < model->num_params(); ++i) model->params().data<float>()[i] = models::uniform(rng, 0.5f, 1.5f);
  dpt::test::check_forward_add(*model, norm, 5, 24, rng);
}

TEST_CASE("Llama: every parameter's gradient matches finite differences, untied and tied heads", "[models][llama]") {
  std::mt19937_64 rng(4);
  for (const bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    LlamaOptions o = tiny();
    o.tie_embeddings = tied;
    o.qkv_bias = tied;  // Qwen2's biases in one of the two
    auto model = make_llama(o);
    model->init(7);
    model = scaled(std::move(model), 4.0f);
    check_gradients(*model, random_tokens(2, 5, o.vocab_size, rng), 56, 1e-3f, 3e-2, 3e-3, 1500, false);
  }
}

TEST_CASE("Llama: causal, and RoPE makes attention depend on relative positions only", "[models][llama]") {
  std::mt19937_64 rng(5);
  const LlamaOptions o = tiny();
  auto model = make_llama(o);
  model->init(8);
  model = scaled(std::move(model), 4.0f);
  Tensor x = random_tokens(1, 6, o.vocab_size, rng);
  const Tensor before = model->forward(x).to(Device::cpu());
  Tensor keep = Tensor::empty(before.shape());
  keep.copy_from(before);
  const int64_t v = o.vocab_size;
  REQUIRE(before.shape() == std::vector<int64_t>{6, v});
  x.data<int32_t>()[4] = (x.data<int32_t>()[4] + 1) % static_cast<int32_t>(v);
  const Tensor& after = model->forward(x);
  for (int64_t i = 0; i < 4 * v; ++i) REQUIRE(after.data<float>()[i] == keep.data<float>()[i]);
  bool changed = false;
  for (int64_t i = 4 * v; i < 6 * v; ++i) changed |= after.data<float>()[i] != keep.data<float>()[i];
  REQUIRE(changed);
  // No position table: a sequence of one repeated token gives the same logits at every position (the values are all
  // equal, whatever the attention weights: this shows the absence of a position embedding, not RoPE, which the
  // relative-position check below and integration.llama_hf_parity test).
  Tensor same = Tensor::empty({1, 5}, DType::I32);
  for (int i = 0; i < 5; ++i) same.data<int32_t>()[i] = 3;
  const Tensor& s = model->forward(same);
  for (int64_t t = 1; t < 5; ++t)
    for (int64_t j = 0; j < v; ++j) REQUIRE(s.data<float>()[t * v + j] == Approx(s.data<float>()[j]).margin(1e-5));
  // Relative positions: the score of a query at position i and a key at j depends on i - j only. Checked on the
  // rotation itself: the same q at p + 3 and k at p give the same dot product for every p.
  auto rope = tables(o);
  CpuKernels k;
  const Tensor qv = random_tensor({1, o.head_dim}, rng), kv = random_tensor({1, o.head_dim}, rng);
  double first = 0;
  for (int64_t p = 0; p + 3 < o.max_positions; ++p) {
    Tensor q = Tensor::empty({1, o.head_dim}), kk = Tensor::empty({1, o.head_dim});
    q.copy_from(qv);
    kk.copy_from(kv);
    k.rope(q.data<float>(), rope->cos_host.data(), rope->sin_host.data(), 1, 1, p + 3, 1, o.head_dim, o.head_dim, false);
    k.rope(kk.data<float>(), rope->cos_host.data(), rope->sin_host.data(), 1, 1, p, 1, o.head_dim, o.head_dim, false);
    double dot = 0;
    for (int64_t i = 0; i < o.head_dim; ++i) dot += static_cast<double>(q.data<float>()[i]) * kk.data<float>()[i];
    if (p == 0) first = dot;
    REQUIRE(dot == Approx(first).margin(1e-5));
  }
}

TEST_CASE("Llama: LlamaForCausalLM's names, shapes and parameter count, and its initialisation", "[models][llama]") {
  LlamaOptions o = tiny(4, 2);
  o.n_layer = 3;
  o.qkv_bias = true;  // Qwen2's
  auto model = make_llama(o);
  model->init(1);
  REQUIRE(model->summary().starts_with("llama L3 H4/2 C8 I12 V11 T8"));
  std::map<std::string, std::vector<int64_t>> want{
      {"model.embed_tokens.weight", {11, 8}}, {"model.norm.weight", {8}}, {"lm_head.weight", {11, 8}}};
  for (int l = 0; l < 3; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    want[p + "input_layernorm.weight"] = {8};
    want[p + "post_attention_layernorm.weight"] = {8};
    want[p + "self_attn.q_proj.weight"] = {16, 8};
    want[p + "self_attn.q_proj.bias"] = {16};
    want[p + "self_attn.k_proj.weight"] = {8, 8};
    want[p + "self_attn.k_proj.bias"] = {8};
    want[p + "self_attn.v_proj.weight"] = {8, 8};
    want[p + "self_attn.v_proj.bias"] = {8};
    want[p + "self_attn.o_proj.weight"] = {8, 16};
    want[p + "mlp.gate_proj.weight"] = {12, 8};
    want[p + "mlp.up_proj.weight"] = {12, 8};
    want[p + "mlp.down_proj.weight"] = {8, 12};
  }
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& p : model->named_params()) got[p.name] = p.param.shape();
  REQUIRE(got == want);
  REQUIRE(static_cast<int64_t>(model->num_params()) == llama_num_params(o));
  for (const auto& p : model->named_params()) {
    INFO(p.name);
    const float* v = p.param.data<float>();
    if (p.name.ends_with("norm.weight")) {
      for (size_t i = 0; i < p.param.numel(); ++i) REQUIRE(v[i] == 1.0f);
    } else if (p.name.ends_with(".bias")) {
      for (size_t i = 0; i < p.param.numel(); ++i) REQUIRE(v[i] == 0.0f);
    } else {  // N(0, 0.02): the sample's standard deviation within a loose band, the values not all equal
      double ss = 0;
      for (size_t i = 0; i < p.param.numel(); ++i) ss += static_cast<double>(v[i]) * v[i];
      const double sd = std::sqrt(ss / static_cast<double>(p.param.numel()));
      REQUIRE(sd > 0.01);
      REQUIRE(sd < 0.03);
    }
  }
  o.tie_embeddings = true;
  auto tied = make_llama(o);
  for (const auto& p : tied->named_params()) REQUIRE(p.name != "lm_head.weight");
  REQUIRE(static_cast<int64_t>(tied->num_params()) == llama_num_params(o));
  REQUIRE(llama_flops_per_token(o, 8) ==
          6.0 * static_cast<double>(llama_num_params(o)) + 12.0 * 3 * 8 * 4 * 4);
}

TEST_CASE("Llama: options that cannot build a model are refused by name", "[models][llama]") {
  LlamaOptions o = tiny(4, 3);
  REQUIRE_THROWS_WITH(make_llama(o), Catch::Contains("not a multiple of n_kv_head 3"));
  o = tiny();
  o.head_dim = 5;
  REQUIRE_THROWS_WITH(make_llama(o), Catch::Contains("even head_dim"));
  o = tiny();
  o.rope_scaling.type = "yarn";
  REQUIRE_THROWS_WITH(make_llama(o), Catch::Contains("'yarn'"));
  o = tiny();
  auto model = make_llama(o);
  model->init(1);
  std::mt19937_64 rng(2);
  REQUIRE_THROWS_WITH(model->forward(random_tokens(1, 9, o.vocab_size, rng)), Catch::Contains("at most 8"));
}

TEST_CASE("Llama with a KV cache: token by token gives the whole sequence's logits (GQA, tied, biases)",
          "[models][llama]") {
  std::mt19937_64 rng(14);
  LlamaOptions o = tiny(4, 2);
  o.tie_embeddings = true;
  o.qkv_bias = true;
  auto model = make_llama(o);
  model->init(15);
  model = scaled(std::move(model), 4.0f);
  model->set_training(false);
  auto& llama = dynamic_cast<Llama&>(model->root());
  const int64_t b = 2, t = o.max_positions, v = o.vocab_size;
  Tensor x = random_tokens(b, t, v, rng);
  const Tensor full = model->forward(x).to(Device::cpu());
  Tensor want = Tensor::empty(full.shape());
  want.copy_from(full);
  llama.begin_kv_cache(b, Device::cpu());
  // A prompt of 3 positions, then one at a time, then two, until the cache is full.
  int64_t pos = 0;
  for (int64_t n : {3, 1, 1, 2, 1}) {
    Tensor step = Tensor::empty({b, n}, DType::I32);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < n; ++j) step.data<int32_t>()[i * n + j] = x.data<int32_t>()[i * t + pos + j];
    const Tensor& got = model->forward(step);
    REQUIRE(got.shape() == std::vector<int64_t>{b * n, v});
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < v; ++c)
          REQUIRE(got.data<float>()[(i * n + j) * v + c] == Approx(want.data<float>()[(i * t + pos + j) * v + c]).margin(1e-5));
    pos += n;
    REQUIRE(llama.kv_cache_len() == pos);
  }
  Tensor one = Tensor::zeros({b, 1}, DType::I32);
  REQUIRE_THROWS_WITH(model->forward(one), Catch::Contains("at most 8"));  // 9 positions
  llama.end_kv_cache();
  REQUIRE(model->forward(x).shape() == want.shape());  // whole sequences again
}

TEST_CASE("Llama generates: greedy with and without the KV cache agree, and sampling is seeded", "[models][llama]") {
  LlamaOptions o = tiny(4, 1);
  o.vocab_size = 40;
  o.max_positions = 16;
  auto model = make_llama(o);
  model->init(21);
  model = scaled(std::move(model), 4.0f);
  const std::vector<int32_t> prompt{3, 1, 4};
  const SampleOptions greedy{.top_k = 1};
  const auto cached = generate(*model, o.max_positions, prompt, 10, greedy, 1);
  const auto window = generate(*model, o.max_positions, prompt, 10, greedy, 1, /*kv_cache=*/false);
  REQUIRE(cached.size() == 13);
  REQUIRE(cached == window);
  REQUIRE(std::vector<int32_t>(cached.begin(), cached.begin() + 3) == prompt);
  const SampleOptions sample{.temperature = 1.0};
  REQUIRE(generate(*model, o.max_positions, prompt, 10, sample, 7) == generate(*model, o.max_positions, prompt, 10, sample, 7));
  REQUIRE(dynamic_cast<Llama&>(model->root()).kv_cache_len() == 0);  // ended
  // Past the 16 positions the cache starts again from the last half window (positions from 0 again), twice here: the
  // text goes on, and its first 13 tokens are those above.
  const auto longer = generate(*model, o.max_positions, prompt, 40, greedy, 1);
  REQUIRE(longer.size() == 43);
  REQUIRE(std::vector<int32_t>(longer.begin(), longer.begin() + 13) == cached);
  for (const int32_t t : longer) REQUIRE((t >= 0 && t < o.vocab_size));
}
