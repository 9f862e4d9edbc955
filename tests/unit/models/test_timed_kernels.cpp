// tests/unit/models/test_timed_kernels.cpp: models::TimedKernels, the kernel set dpt-model-bench --kernel-steps
// clocks every call of: a model switched to it (Model::set_kernels) computes the plain set's bits; each call is
// counted under its operation and shape (a GPT's matmuls: 4 per layer and the head forward, twice as many
// backward); the calls and the time between them add up to the span; and it overrides every operation of the
// Kernels interface (a new one left out would run the base's default, untimed or throwing). The CUDA set through it:
// tests/unit/gpu/test_fast_path.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "model_testing.h"
#include "models/gpt/gpt.h"
#include "models/kernels/factory.h"
#include "models/kernels/timed_kernels.h"
#include "models/layers.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;
namespace fs = std::filesystem;

namespace {

GptOptions tiny() {
  GptOptions o;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = 32;
  o.vocab_size = 100;
  o.block_size = 16;
  return o;
}

std::map<std::string, int64_t> calls_by_op(const TimedKernels& t) {
  std::map<std::string, int64_t> by;
  for (const auto& r : t.rows()) by[r.op] += r.calls;
  return by;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("TimedKernels: a GPT step through it gives the plain set's bits and counts each call", "[timed_kernels]") {
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    auto plain = make_gpt(tiny()), timed_model = make_gpt(tiny());
    plain->init(5);
    timed_model->init(5);
    if (bf16) {
      plain->set_bf16_activations(true);
      timed_model->set_bf16_activations(true);
    }
    TimedKernels timed(timed_model->kernels());
    timed_model->set_kernels(timed);
    REQUIRE(&timed_model->kernels() == &timed);
    std::mt19937_64 rng(9);
    const Tensor tokens = test::random_tokens(3, 16, 100, rng);
    Tensor targets = Tensor::empty({48}, DType::I32);
    for (size_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
    for (int step = 0; step < 2; ++step) {
      const test::LmStep want = test::lm_step(*plain, tokens, targets);
      const test::LmStep got = test::lm_step(*timed_model, tokens, targets);
      CHECK(got.loss == want.loss);
      CHECK(same_bits(got.logits, want.logits));
      CHECK(same_bits(got.grads, want.grads));
      timed.collect();
    }
    CHECK(timed.collections() == 2);
    const auto by = calls_by_op(timed);
    const int64_t L = tiny().n_layer, steps = 2;
    if (bf16) {
      // Forward: qkv, the attention's projection, c_fc, c_proj per layer and the head; backward: two products each.
      CHECK(by.at("matmul_bf16") == steps * 3 * (4 * L + 1));
      CHECK(by.at("attention_forward") == steps * L);
      CHECK(by.at("attention_backward") == steps * L);
      CHECK(by.at("classifier_bf16") == steps);
      CHECK(by.at("layernorm_forward_bf16") == steps * (2 * L + 1));
      CHECK(by.at("layernorm_backward_bf16") == steps * (2 * L + 1));
      CHECK(by.count("gemm") == 0);
    } else {
      CHECK(by.at("layernorm_forward") == steps * (2 * L + 1));
      CHECK(by.at("softmax_xent") == steps);
      CHECK(by.count("matmul_bf16") == 0);
    }
    CHECK(by.at("embedding_forward") == steps);
    CHECK(by.at("embedding_backward") == steps);
    // The span is the calls and the gaps between them, to the clock's rounding.
    double in_calls = 0;
    for (const auto& r : timed.rows()) {
      CHECK(r.ms >= 0);
      CHECK(!r.shape.empty());
      in_calls += r.ms;
    }
    CHECK(timed.total_ms() > 0);
    CHECK(timed.between_ms() > 0);  // the clock reads between calls take time of their own
    CHECK(std::abs(in_calls + timed.between_ms() - timed.total_ms()) <= 1e-9 + 1e-9 * timed.total_ms());
    // Most time first.
    const auto rows = timed.rows();
    for (size_t i = 1; i < rows.size(); ++i) CHECK(rows[i - 1].ms >= rows[i].ms);
    timed.reset();
    CHECK(timed.rows().empty());
    CHECK(timed.total_ms() == 0);
    // Back to the device's own set.
    timed_model->set_kernels(kernels_for(Device::cpu()));
    CHECK(&timed_model->kernels() == &kernels_for(Device::cpu()));
  }
}

TEST_CASE("TimedKernels: the optimizer's and a classifier's operations, by shape", "[timed_kernels]") {
  std::mt19937_64 rng(3);
  TimedKernels timed(kernels_for(Device::cpu()));
  // Two shapes of one operation are two rows; the same shape twice is one row of two calls.
  Tensor a = Tensor::empty({6, 4}), b = Tensor::empty({4, 5}), c = Tensor::zeros({6, 5}), c2 = Tensor::zeros({6, 5});
  for (Tensor* t : {&a, &b})
    for (size_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = uniform(rng, -1, 1);
  timed.gemm(false, false, 6, 5, 4, 1.0f, a.data<float>(), 4, b.data<float>(), 5, 0.0f, c.data<float>(), 5);
  kernels_for(Device::cpu()).gemm(false, false, 6, 5, 4, 1.0f, a.data<float>(), 4, b.data<float>(), 5, 0.0f,
                                  c2.data<float>(), 5);
  CHECK(same_bits(c, c2));
  timed.gemm(false, false, 6, 5, 4, 1.0f, a.data<float>(), 4, b.data<float>(), 5, 1.0f, c.data<float>(), 5);
  timed.gemm(false, false, 6, 5, 4, 1.0f, a.data<float>(), 4, b.data<float>(), 5, 1.0f, c.data<float>(), 5);
  timed.gemm(false, false, 3, 5, 4, 1.0f, a.data<float>(), 4, b.data<float>(), 5, 0.0f, c.data<float>(), 5);
  const double ss = timed.sum_squares(a.data<float>(), a.numel());
  CHECK(ss == kernels_for(Device::cpu()).sum_squares(a.data<float>(), a.numel()));
  timed.collect();
  std::map<std::string, int64_t> by_shape;
  for (const auto& r : timed.rows()) by_shape[r.op + ": " + r.shape] = r.calls;
  CHECK(by_shape == std::map<std::string, int64_t>{{"gemm: M 6 N 5 K 4", 1},
                                                   {"gemm: M 6 N 5 K 4, +=", 2},
                                                   {"gemm: M 3 N 5 K 4", 1},
                                                   {"sum_squares: n 24", 1}});
  // The optimizers' updates: the same bits as the plain set's.
  const size_t n = 1000;
  std::vector<float> p1(n), g(n), m1(n), v1(n);
  for (size_t i = 0; i < n; ++i) {
    p1[i] = uniform(rng, -1, 1);
    g[i] = uniform(rng, -1, 1);
    m1[i] = uniform(rng, -0.1f, 0.1f);
    v1[i] = uniform(rng, 0, 0.01f);
  }
  auto p2 = p1, m2 = m1, v2 = v1;
  std::vector<BFloat16> h1(n), h2(n);
  const uint64_t edges[] = {100, 700};
  const double grad_ss = 4.0e3;  // a norm of about 63: clipped to 1 below
  AdamWParams ap;
  ap.step = 3;
  timed.adamw_fused(p1.data(), h1.data(), g.data(), m1.data(), v1.data(), n, ap, edges, 2, &grad_ss, 1.0);
  kernels_for(Device::cpu()).adamw_fused(p2.data(), h2.data(), g.data(), m2.data(), v2.data(), n, ap, edges, 2,
                                         &grad_ss, 1.0);
  CHECK(p1 == p2);
  CHECK(m1 == m2);
  CHECK(v1 == v2);
  CHECK(std::memcmp(h1.data(), h2.data(), n * sizeof(BFloat16)) == 0);
  SgdParams sp;
  sp.momentum = 0.9f;
  sp.weight_decay = 0.01f;
  timed.sgd_update(p1.data(), g.data(), m1.data(), n, sp);
  kernels_for(Device::cpu()).sgd_update(p2.data(), g.data(), m2.data(), n, sp);
  CHECK(p1 == p2);
  CHECK(m1 == m2);
  timed.collect();
  CHECK(timed.rows().size() == 6);

  // begin_step: the span from its mark to collect(), what lies outside the calls counted as such.
  timed.reset();
  timed.begin_step();
  volatile double spin = 0;
  for (int i = 0; i < 200000; ++i) spin = spin + 1e-9 * i;  // work before the first call
  timed.scale(p1.data(), n, 0.5f);
  timed.scale(p1.data(), n, 2.0f);
  timed.collect();
  REQUIRE(timed.rows().size() == 1);
  CHECK(timed.rows()[0].calls == 2);
  CHECK(timed.between_ms() > 0);
  CHECK(std::abs(timed.rows()[0].ms + timed.between_ms() - timed.total_ms()) <= 1e-9 + 1e-9 * timed.total_ms());
  CHECK(timed.total_ms() > timed.rows()[0].ms);
  // A step's start after calls of it were made is a caller's bug.
  timed.scale(p1.data(), n, 1.0f);
  CHECK_THROWS(timed.begin_step());
  timed.collect();

  // A matmul's description names its epilogue, operand order and output.
  MatmulShape s;
  s.M = 16384;
  s.N = 2304;
  s.K = 768;
  s.trans_b = true;
  s.epilogue = MatmulEpilogue::Bias;
  CHECK(describe_matmul(s) == "M 16384 N 2304 K 768 B^T, bias, bf16 D");
  s.trans_b = false;
  s.trans_a = true;
  s.d_f32 = true;
  s.accumulate = true;
  s.epilogue = MatmulEpilogue::BiasGrad;
  CHECK(describe_matmul(s) == "M 16384 N 2304 K 768 A^T, bias grad, f32 D +=");
}

TEST_CASE("TimedKernels: each call's work and floor, in closed form", "[timed_kernels]") {
  // A matmul: 2 M N K FLOPs on tensor cores; A, B and D in their dtypes, and what the epilogue reads or writes.
  MatmulShape s{.trans_b = true, .M = 16384, .N = 2304, .K = 768, .epilogue = MatmulEpilogue::Bias};
  const double M = 16384, N = 2304, K = 768;
  Work w = matmul_work(s, false);
  CHECK(w.flops == 2 * M * N * K);
  CHECK(w.bytes == 2 * M * K + 2 * K * N + 2 * M * N + 2 * N);
  CHECK(w.tensor);
  s.epilogue = MatmulEpilogue::BiasGelu;
  // With the pre-activation kept (aux written).
  CHECK(matmul_work(s, true).bytes == 2 * M * K + 2 * K * N + 2 * M * N + 2 * N + 2 * M * N);
  CHECK(matmul_work(s, false).bytes == 2 * M * K + 2 * K * N + 2 * M * N + 2 * N);
  s.epilogue = MatmulEpilogue::DGelu;
  CHECK(matmul_work(s, false).bytes == 2 * M * K + 2 * K * N + 2 * M * N + 2 * M * N);  // reads the pre-activation
  s = {.trans_a = true, .M = 768, .N = 2304, .K = 16384, .d_f32 = true, .accumulate = true,
       .epilogue = MatmulEpilogue::BiasGrad};
  w = matmul_work(s, false);
  CHECK(w.flops == 2 * 768.0 * 2304 * 16384);
  // D and the bias gradient read and written.
  CHECK(w.bytes == 2 * 768.0 * 16384 + 2 * 16384.0 * 2304 + 4 * 768.0 * 2304 * 2 + 8 * 768.0);
  s.K = 0;
  CHECK(matmul_work(s, false).flops == 0);

  // Causal attention: the (query, key) pairs a brute count gives, 2 head_size FLOPs a pair and product, 2 products
  // forward and 4 backward; qkv (with its grouped key/value heads), out and the statistics moved once.
  for (const int64_t kv : {int64_t{0}, int64_t{1}}) {
    CAPTURE(kv);
    const AttentionShape a{.b = 2, .t = 5, .n_head = 3, .head_size = 8, .n_kv_head = kv};
    double pairs = 0;
    for (int64_t i = 0; i < a.t; ++i)
      for (int64_t j = 0; j <= i; ++j) pairs += 1;
    const double heads = 2 * 3, width = (3 + 2 * (kv ? 1 : 3)) * 8.0;
    const double qkv = 2.0 * 2 * 5 * width, out = 2.0 * 2 * 5 * 3 * 8, stats = 4.0 * heads * 5;
    const Work f = attention_work(a, false), b = attention_work(a, true);
    CHECK(f.flops == 2 * 2 * 8 * pairs * heads);
    CHECK(b.flops == 2 * f.flops);
    CHECK(f.bytes == qkv + out + stats);
    CHECK(b.bytes == 2 * qkv + 2 * out + stats);
    CHECK((f.tensor && b.tensor));
  }

  // The fused AdamW over n parameters: the float32 parameter, m and v read and written, the gradient read, and the
  // bf16 copy written when asked for.
  {
    TimedKernels t(kernels_for(Device::cpu()));
    const size_t n = 64;
    std::vector<float> p(n, 0.5f), g(n, 0.1f), m(n, 0.0f), v(n, 0.0f);
    std::vector<BFloat16> h(n);
    AdamWParams ap;
    ap.step = 1;
    t.adamw_fused(p.data(), h.data(), g.data(), m.data(), v.data(), n, ap, nullptr, 0, nullptr, 0.0);
    t.adamw_fused(p.data(), nullptr, g.data(), m.data(), v.data(), n, ap, nullptr, 0, nullptr, 0.0);
    t.collect();
    std::map<std::string, double> by;
    for (const auto& r : t.rows()) by[r.shape] = r.bytes;
    CHECK(by.at("n 64, bf16 copy") == n * (2 * 4 + 4 + 2 * 4 + 2 * 4 + 2));
    CHECK(by.at("n 64") == n * (2 * 4 + 4 + 2 * 4 + 2 * 4));
  }

  // The floor: the larger of the products' time at the tensor-core peak and the bytes' at the memory's bandwidth.
  using Row = TimedKernels::Row;
  const Row compute{.op = "matmul_bf16", .calls = 2, .ms = 5, .flops = 2e12, .bytes = 1e9, .tensor = true};
  const Row memory{.op = "add_bf16", .calls = 1, .ms = 1, .bytes = 3e9};
  const Row float32{.op = "gemm", .calls = 1, .ms = 1, .flops = 1e9, .bytes = 1e6};
  CHECK(TimedKernels::floor_ms(compute, 1e12, 1e12) == Approx(2000));
  CHECK(TimedKernels::floor_ms(compute, 1e15, 1e11) == Approx(10));  // memory-bound on this device
  CHECK(TimedKernels::floor_ms(memory, 0, 1e12) == Approx(3));       // no FLOPs: the tensor peak not needed
  CHECK(TimedKernels::floor_ms(compute, 0, 1e12) < 0);               // FLOPs without their peak
  CHECK(TimedKernels::floor_ms(float32, 1e15, 1e12) < 0);            // a float32 product's peak is not in the table
  CHECK(TimedKernels::floor_ms(memory, 1e15, 0) < 0);                // no bandwidth (the CPU)
}

TEST_CASE("TimedKernels: a GPT step's FLOPs by operation are the model's, in closed form", "[timed_kernels]") {
  // Per token, 6 FLOPs per weight of a product (2 forward, 4 backward): per layer 12 C^2 (qkv 3 C^2, the projection
  // C^2, the MLP 8 C^2) and the tied head C V. Attention on float32 activations multiplies whole T x T score
  // matrices: 12 L T C per token (PaLM's count, models::gpt_flops_per_token's); the fast path's causal attention
  // only the pairs at or below the diagonal, T (T + 1) / 2 of T^2.
  const GptOptions o = tiny();
  const double L = o.n_layer, C = o.n_embd, T = o.block_size, B = 3, tokens = B * T;
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    auto model = make_gpt(o);
    model->init(5);
    if (bf16) model->set_bf16_activations(true);
    TimedKernels timed(model->kernels());
    model->set_kernels(timed);
    std::mt19937_64 rng(4);
    const Tensor tokens_in = test::random_tokens(3, 16, 100, rng);
    Tensor targets = Tensor::empty({48}, DType::I32);
    for (size_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
    (void)test::lm_step(*model, tokens_in, targets);
    timed.collect();
    std::map<std::string, double> flops;
    bool products_on_tensor_cores = true;
    for (const auto& r : timed.rows()) {
      flops[r.op] += r.flops;
      if (r.flops > 0) products_on_tensor_cores = products_on_tensor_cores && r.tensor;
      CHECK(r.bytes > 0);
    }
    const double layers = 6 * 12 * C * C * L * tokens;
    if (bf16) {
      const double head = 6 * C * static_cast<double>(padded_vocab(o)) * tokens;  // over the padded vocabulary
      CHECK(flops["matmul_bf16"] == Approx(layers + head).epsilon(1e-12));
      CHECK(flops["attention_forward"] + flops["attention_backward"] ==
            Approx(6 * L * B * C * T * (T + 1)).epsilon(1e-12));
      CHECK(flops["attention_backward"] == Approx(2 * flops["attention_forward"]).epsilon(1e-12));
      CHECK(products_on_tensor_cores);
    } else {
      const double head = 6 * C * o.vocab_size * tokens;
      CHECK(flops["gemm"] + flops["gemm_strided_batched"] ==
            Approx(layers + head + 12 * L * T * C * tokens).epsilon(1e-12));
      CHECK(!products_on_tensor_cores);
    }
    if (bf16) {
      // The memory-bound operations' bytes, tensor by tensor (bf16 activations 2 bytes, float32 4): the residual adds
      // read two and write one rows x C each, 2 per layer forward, each inside the next LayerNorm's forward (ln_2's,
      // and the next block's ln_1 or ln_f: the residual hand-off), which reads the addend and writes the sum besides,
      // so no add_bf16 call is left (backward's adds are inside the blocks' LayerNorms);
      // LayerNorm forward reads x, gamma, beta and writes y, mean, rstd; backward reads dy, x, gamma, mean, rstd,
      // writes dx and adds into dgamma, dbeta, and in the blocks (2 per layer, not ln_f) reads the residual's gradient;
      // the classifier reads and writes every padded column (the loss hands it the padded logits, whose padding the
      // head's -inf bias keeps out of the softmax) and reads the labels.
      std::map<std::string, double> bytes;
      std::map<std::string, int64_t> calls;
      for (const auto& r : timed.rows()) {
        bytes[r.op] += r.bytes;
        calls[r.op] += r.calls;
      }
      const double rows = tokens, rc = rows * C, act = 2, f32 = 4;
      const double Vp = static_cast<double>(padded_vocab(o));
      CHECK(calls["add_bf16"] == 0);
      const double ln = 2 * L + 1;
      CHECK(calls["layernorm_forward_bf16"] == 2 * o.n_layer + 1);
      CHECK(bytes["layernorm_forward_bf16"] ==
            Approx(ln * (act * rc + 2 * f32 * C + act * rc + 2 * f32 * rows) + 2 * L * 2 * act * rc).epsilon(1e-12));
      CHECK(bytes["layernorm_backward_bf16"] ==
            Approx(ln * (2 * act * rc + f32 * C + 2 * f32 * rows + act * rc + 2 * (2 * f32 * C)) + 2 * L * act * rc)
                .epsilon(1e-12));
      CHECK(bytes["classifier_bf16"] == Approx(2 * act * rows * Vp + 4 * rows).epsilon(1e-12));
      // The embedding: the tokens, a wte row per token, wpe's T rows, the float32 output; backward reads dy and adds
      // into a dwte row per token and dwpe's T rows.
      CHECK(bytes["embedding_forward"] == Approx(4 * rows + f32 * rc + f32 * T * C + f32 * rc).epsilon(1e-12));
      CHECK(bytes["embedding_backward"] ==
            Approx(4 * rows + f32 * rc + 2 * f32 * rc + 2 * f32 * T * C).epsilon(1e-12));
    }
    double total = 0;
    for (const auto& [op, f] : flops) total += f;
    CHECK(total == Approx(flops[bf16 ? "matmul_bf16" : "gemm"] + flops["gemm_strided_batched"] +
                          flops["attention_forward"] + flops["attention_backward"]));  // no other operation has FLOPs
  }
}

// The source tree: $DPT_SOURCE_DIR or the folder above it (scripts/gpu-check.sh points it at the bundle inside the
// working tree), else the tree this was built from; empty when none has the headers (a copied test program).
fs::path kernel_headers() {
  const char* env = std::getenv("DPT_SOURCE_DIR");
  const fs::path from_env(env && *env ? env : "");
  for (const fs::path& dir : {from_env, from_env.empty() ? fs::path() : from_env.parent_path(), fs::path(DPT_SOURCE_DIR)})
    if (!dir.empty() && fs::is_regular_file(dir / "models/kernels/timed_kernels.h")) return dir / "models/kernels";
  return {};
}

TEST_CASE("TimedKernels overrides every operation of the Kernels interface", "[timed_kernels]") {
  const fs::path dir = kernel_headers();
  if (dir.empty()) {
    WARN("not checked: no models/kernels/ headers under $DPT_SOURCE_DIR, its parent or " << DPT_SOURCE_DIR);
    return;
  }
  const std::string iface = slurp((dir / "kernels.h").string());
  const std::string timed = slurp((dir / "timed_kernels.h").string());
  const std::regex virtual_fn(R"(virtual\s+[\w:<>,\s\*&]*?\b(\w+)\s*\()");
  size_t seen = 0;
  for (auto it = std::sregex_iterator(iface.begin(), iface.end(), virtual_fn); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    if (name == "Kernels") continue;  // the destructor (~Kernels)
    ++seen;
    const std::regex overridden("\\b" + name + R"(\s*\([^;{]*\)\s*(const\s*)?override\b)");
    INFO(name << " is a virtual of Kernels that TimedKernels does not override");
    CHECK(std::regex_search(timed, overridden));
  }
  CHECK(seen > 60);  // the regex found the interface
}
