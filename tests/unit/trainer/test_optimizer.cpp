// tests/unit/trainer/test_optimizer.cpp: which parameters weight decay reaches. With zero gradients, one
// AdamW step only decays: p -> p (1 - lr wd) where it applies, p unchanged elsewhere (closed form). A sharded
// optimizer against the whole one. AdamW writing the fast path's bf16 copy in its pass: the same training, bit for
// bit, as the forward's own rounding pass, which then runs once.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "../models/model_testing.h"
#include "models/gpt/gpt.h"
#include "trainer/optimizer.h"
#include "trainer/schedule.h"

using namespace dpt;
using namespace dpt::trainer;

TEST_CASE("weight decay on every parameter, or on matrices only (nanoGPT's rule)", "[trainer][optimizer]") {
  models::GptOptions o{.n_layer = 1, .n_head = 2, .n_embd = 4, .vocab_size = 7, .block_size = 3};
  for (const bool matrices_only : {false, true}) {
    INFO("matrices only: " << matrices_only);
    auto model = models::make_gpt(o);
    model->init(3);
    const std::vector<float> before(model->params().data<float>(), model->params().data<float>() + model->num_params());
    model->zero_grad();
    TrainConfig t;
    t.optimizer = OptimizerKind::adamw;
    t.weight_decay = 0.5;
    Optimizer opt(t, *model, matrices_only);
    opt.step(0.1);
    size_t decayed = 0, kept = 0;
    for (const auto& np : model->named_params()) {
      const bool decays = !matrices_only || np.param.ndim() >= 2;
      for (size_t i = 0; i < np.param.numel(); ++i) {
        const float was = before[np.offset + i];
        REQUIRE(np.param.data<float>()[i] == Approx(decays ? was * 0.95f : was).margin(1e-7));
      }
      (decays ? decayed : kept) += 1;
    }
    if (matrices_only) {
      REQUIRE(kept == 2 + 1 * 8);  // ln_f weight/bias, and per block: ln_1, ln_2 (2 each) and 4 biases
      REQUIRE(decayed == 2 + 1 * 4);  // wte, wpe, and per block c_attn, attn.c_proj, c_fc, mlp.c_proj
    } else {
      REQUIRE(kept == 0);
    }
  }
}

TEST_CASE("a sharded optimizer updates its pieces exactly as the whole one does, and nothing else",
          "[trainer][optimizer][zero]") {
  models::GptOptions o{.n_layer = 1, .n_head = 2, .n_embd = 4, .vocab_size = 7, .block_size = 3};
  const OptimizerKind kind = GENERATE(OptimizerKind::adamw, OptimizerKind::sgd);
  INFO(choice_name(kind));
  TrainConfig t;
  t.optimizer = kind;
  t.momentum = 0.9;
  t.weight_decay = 0.1;
  auto whole = models::make_gpt(o), sharded = models::make_gpt(o);
  whole->init(5);
  sharded->init(5);
  const size_t n = whole->num_params();
  // Pieces cutting through parameters, with gaps between them (what other ranks own).
  const std::vector<FlatRange> pieces{{3, 10}, {20, 41}, {n - 30, 25}};
  Optimizer a(t, *whole, /*decay_matrices_only=*/true), b(t, *sharded, true, pieces);
  CHECK_FALSE(a.sharded());
  CHECK(b.sharded());
  CHECK(b.state_bytes() * n == a.state_bytes() * (10 + 41 + 25));
  const std::vector<float> start(sharded->params().data<float>(), sharded->params().data<float>() + n);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < n; ++i)
      whole->grads().data<float>()[i] = sharded->grads().data<float>()[i] = std::sin(static_cast<float>(i + 7 * step));
    a.step(0.01);
    b.step(0.01);
  }
  std::vector<bool> in_piece(n, false);
  for (const auto& r : pieces)
    for (size_t i = r.offset; i < r.offset + r.count; ++i) in_piece[i] = true;
  for (size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(sharded->params().data<float>()[i] == (in_piece[i] ? whole->params().data<float>()[i] : start[i]));
  }
  // The shard's state is the whole state's pieces, back to back.
  const OptimizerShard sa = a.shard(), sb = b.shard();
  REQUIRE(sa.ranges == std::vector<FlatRange>{{0, n}});
  REQUIRE(sb.ranges == pieces);
  REQUIRE(sb.slots.size() == sa.slots.size());
  for (size_t s = 0; s < sa.slots.size(); ++s) {
    size_t at = 0;
    for (const auto& r : pieces)
      for (size_t i = 0; i < r.count; ++i, ++at)
        REQUIRE(sb.slots[s].tensor.data<float>()[at] == sa.slots[s].tensor.data<float>()[r.offset + i]);
  }
}

namespace {

// GPT's fast path on the CPU, two layers, with tokens and targets of its vocabulary.
struct FastGpt {
  models::GptOptions o{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 100, .block_size = 16};
  std::unique_ptr<models::Model> model = models::make_gpt(o);
  Tensor tokens = Tensor::empty({2, 16}, DType::I32), targets = Tensor::empty({32}, DType::I32);
  FastGpt() {
    model->init(11);
    model->set_bf16_activations(true);
    std::mt19937 rng(4);
    for (size_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
    for (size_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
  }
  // How many elements of the bf16 copy are not bf16(params()) (read through the const accessor: no invalidation).
  size_t stale() const {
    const models::Model& m = *model;
    size_t bad = 0;
    for (size_t i = 0; i < m.num_params(); ++i)
      bad += m.params16().data<BFloat16>()[i].bits != to_bfloat16(m.params().data<float>()[i]).bits;
    return bad;
  }
};

}  // namespace

TEST_CASE("AdamW writes the fast path's bf16 copy in its pass: the same training, one rounding pass",
          "[trainer][optimizer][bf16act]") {
  TrainConfig t;
  t.optimizer = OptimizerKind::adamw;
  t.weight_decay = 0.1;
  FastGpt fused, rounded;  // `rounded`: mutable params() before each forward, so that forward rounds (as before)
  Optimizer a(t, *fused.model, /*decay_matrices_only=*/true), b(t, *rounded.model, true);
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    (void)rounded.model->params();
    CHECK_FALSE(rounded.model->params16_current());
    const test::LmStep x = test::lm_step(*fused.model, fused.tokens, fused.targets);
    const test::LmStep y = test::lm_step(*rounded.model, rounded.tokens, rounded.targets);
    CHECK(x.loss == y.loss);
    REQUIRE(std::memcmp(x.grads.raw(), y.grads.raw(), x.grads.bytes()) == 0);
    a.step(1e-2, nullptr, 0.0);
    b.step(1e-2, nullptr, 0.0);
    CHECK(fused.model->params16_current());
    CHECK(fused.stale() == 0);  // the update's copy: every element bf16 of its updated parameter
    const models::Model &fm = *fused.model, &rm = *rounded.model;  // const: reading does not drop the copy
    REQUIRE(std::memcmp(fm.params().raw(), rm.params().raw(), fm.params().bytes()) == 0);
  }
  CHECK(fused.model->params16_roundings() == 1);  // the first forward's only
  CHECK(rounded.model->params16_roundings() == 3);
  // The update's copy serves one forward: a second before the next update rounds (gradient accumulation's micro-steps).
  (void)test::lm_step(*fused.model, fused.tokens, fused.targets);
  CHECK(fused.model->params16_roundings() == 1);
  CHECK_FALSE(fused.model->params16_current());
  (void)test::lm_step(*fused.model, fused.tokens, fused.targets);
  CHECK(fused.model->params16_roundings() == 2);
  // Anything writing the parameters outside the update: the next forward rounds afresh, and reads the new values.
  a.step(1e-2, nullptr, 0.0);
  CHECK(fused.model->params16_current());
  fused.model->params().data<float>()[0] += 1.0f;
  CHECK_FALSE(fused.model->params16_current());
  (void)test::lm_step(*fused.model, fused.tokens, fused.targets);
  CHECK(fused.model->params16_roundings() == 3);
  CHECK(fused.stale() == 0);
  a.step(1e-2, nullptr, 0.0);
  fused.model->params_written();  // a write through views taken earlier (ZeRO's gathers, the start's broadcast)
  CHECK_FALSE(fused.model->params16_current());
  a.step(1e-2, nullptr, 0.0);
  const std::vector<NamedTensor> state = fused.model->state();
  const std::vector<Tensor> copies = [&] {
    std::vector<Tensor> c;
    for (const NamedTensor& nt : state) {
      c.push_back(Tensor::empty(nt.tensor.shape(), nt.tensor.dtype()));
      c.back().copy_from(nt.tensor);
    }
    return c;
  }();
  fused.model->load_state(
      [&](const std::string& name) -> const Tensor* {
        for (size_t i = 0; i < state.size(); ++i)
          if (state[i].name == name) return &copies[i];
        return nullptr;
      },
      "test");
  CHECK_FALSE(fused.model->params16_current());
}

TEST_CASE("a sharded or SGD update leaves the fast path's bf16 copy to the forward", "[trainer][optimizer][bf16act]") {
  const OptimizerKind kind = GENERATE(OptimizerKind::adamw, OptimizerKind::sgd);
  INFO(choice_name(kind));
  TrainConfig t;
  t.optimizer = kind;
  FastGpt g;
  const size_t n = g.model->num_params();
  Optimizer whole(t, *g.model, true), pieces(t, *g.model, true, {{0, n / 2}, {n / 2, n - n / 2}});
  for (Optimizer* opt : {&whole, &pieces}) {
    if (opt == &whole && kind == OptimizerKind::adamw) continue;  // the case above
    const int64_t before = g.model->params16_roundings();
    (void)test::lm_step(*g.model, g.tokens, g.targets);
    opt->step(1e-2, nullptr, 0.0);
    CHECK_FALSE(g.model->params16_current());
    (void)test::lm_step(*g.model, g.tokens, g.targets);
    CHECK(g.model->params16_roundings() == before + 2);
    CHECK(g.stale() == 0);
  }
}

// train.cuda_graph's update: the constants staged (Optimizer::stage) and read by the kernels when they run, against
// step(): the same bits, step after step, with the schedule's changing learning rate and the clipping active.
TEST_CASE("AdamW staged for a CUDA graph gives step()'s bits with a changing lr and clipping",
          "[trainer][optimizer][bf16act][cuda_graph]") {
  TrainConfig t;
  t.optimizer = OptimizerKind::adamw;
  t.lr = 3e-2;
  t.weight_decay = 0.1;
  t.warmup_steps = 2;
  t.min_lr = 1e-3;
  FastGpt eager, staged;
  Optimizer a(t, *eager.model, /*decay_matrices_only=*/true), b(t, *staged.model, true);
  REQUIRE(b.can_stage());
  Tensor ss_a = Tensor::zeros({1}, DType::F64), ss_b = Tensor::zeros({1}, DType::F64);
  const double max_norm = 0.05;
  constexpr int64_t kSteps = 5;
  std::vector<double> lrs;
  for (int64_t step = 1; step <= kSteps; ++step) {
    CAPTURE(step);
    const double lr = lr_at(t, step - 1, kSteps, kSteps);  // the Trainer's schedule: warm-up, then cosine
    lrs.push_back(lr);
    (void)test::lm_step(*eager.model, eager.tokens, eager.targets);
    (void)test::lm_step(*staged.model, staged.tokens, staged.targets);
    eager.model->kernels().sum_squares_to(eager.model->grads().data<float>(), eager.model->num_params(),
                                          ss_a.data<double>());
    staged.model->kernels().sum_squares_to(staged.model->grads().data<float>(), staged.model->num_params(),
                                           ss_b.data<double>());
    REQUIRE(ss_a.data<double>()[0] == ss_b.data<double>()[0]);
    CHECK(models::elementwise::clip_factor(ss_a.data<double>(), max_norm) < 1.0f);  // the clipping acts
    a.step(lr, ss_a.data<double>(), max_norm);
    b.stage(lr, nullptr);
    // The block: step()'s constants for this lr and step count, with and without the decay, as the kernels read it.
    models::AdamWParams want{.lr = static_cast<float>(lr), .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .step = step};
    const models::elementwise::AdamWSteps ws = models::elementwise::adamw_steps(want);
    REQUIRE(b.staged().size() == 1);  // one piece: the whole buffer
    CHECK(std::memcmp(&b.staged()[0], &ws, sizeof ws) == 0);
    REQUIRE(b.staged_block().bytes() == sizeof ws);
    CHECK(std::memcmp(b.staged_block().raw(), &ws, sizeof ws) == 0);
    CHECK(b.staged()[0].with_decay.decay == 1.0f - want.lr * 0.1f);
    CHECK(b.staged()[0].without_decay.decay == 1.0f);
    CHECK(b.steps() == step - 1);  // staging counts nothing
    b.step_staged(ss_b.data<double>(), max_norm);
    CHECK(b.steps() == step - 1);  // nor does the device work (a graph's launch runs it without the host)
    b.staged_done();
    CHECK(b.steps() == step);
    CHECK(staged.model->params16_current());
    CHECK(staged.stale() == 0);
    const models::Model &em = *eager.model, &sm = *staged.model;
    REQUIRE(std::memcmp(em.params().raw(), sm.params().raw(), em.params().bytes()) == 0);
    REQUIRE(std::memcmp(em.params16().raw(), sm.params16().raw(), em.params16().bytes()) == 0);
    const OptimizerShard sa = a.shard(), sb = b.shard();
    for (size_t i = 0; i < sa.slots.size(); ++i)
      REQUIRE(std::memcmp(sa.slots[i].tensor.raw(), sb.slots[i].tensor.raw(), sa.slots[i].tensor.bytes()) == 0);
  }
  CHECK(lrs[0] < lrs[1]);  // warming up
  CHECK(lrs[4] < lrs[2]);  // decaying
}

TEST_CASE("only AdamW over the whole buffer stages its update", "[trainer][optimizer][cuda_graph]") {
  TrainConfig t;
  t.optimizer = OptimizerKind::sgd;
  FastGpt g;
  const size_t n = g.model->num_params();
  CHECK_FALSE(Optimizer(t, *g.model).can_stage());
  t.optimizer = OptimizerKind::adamw;
  CHECK(Optimizer(t, *g.model).can_stage());
  Optimizer pieces(t, *g.model, true, {{0, n / 2}, {n / 2, n - n / 2}});
  CHECK_FALSE(pieces.can_stage());
  CHECK_THROWS_WITH(pieces.stage(1e-3, nullptr), Catch::Contains("only AdamW over the whole parameter buffer"));
  Optimizer whole(t, *g.model);
  CHECK_THROWS_WITH(whole.step_staged(nullptr, 0.0), Catch::Contains("before stage()"));
}
