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
    t.optimizer = "adamw";
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
