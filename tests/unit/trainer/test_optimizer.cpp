// tests/unit/trainer/test_optimizer.cpp: which parameters weight decay reaches. With zero gradients, one
// AdamW step only decays: p -> p (1 - lr wd) where it applies, p unchanged elsewhere (closed form).
#include <catch2/catch.hpp>

#include <vector>

#include "models/gpt/gpt.h"
#include "trainer/optimizer.h"

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
