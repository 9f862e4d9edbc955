// tests/unit/trainer/test_task.cpp: the tasks between the loader's batches and the model: classification
// folds features to the sample shape and takes the labels; language modelling splits token windows into
// inputs and next tokens (closed form), also for a short last batch; a GPT config needs token shards.
#include <catch2/catch.hpp>

#include <vector>

#include "core/check.h"
#include "data/token_shards.h"
#include "models/kernels/elementwise.h"
#include "trainer/config.h"
#include "trainer/task.h"

using namespace dpt;
using namespace dpt::trainer;

namespace {

data::Batch batch_of(int64_t n, int64_t f) {
  data::Batch b;
  b.features = Tensor::empty({n, f});
  b.labels = Tensor::zeros({n}, DType::I32);
  b.size = static_cast<size_t>(n);
  for (int64_t i = 0; i < n * f; ++i) b.features.data<float>()[i] = static_cast<float>(100 + i);
  return b;
}

}  // namespace

TEST_CASE("classification task: features folded to the sample shape, the labels as targets", "[trainer][task]") {
  auto task = make_classification_task({2, 3, 2});
  data::Batch b = batch_of(4, 12);
  b.labels.data<int32_t>()[2] = 7;
  task->prepare(b);
  REQUIRE(task->input().shape() == std::vector<int64_t>{4, 2, 3, 2});
  REQUIRE(task->input().data<float>() == b.features.data<float>());  // a view, no copy
  REQUIRE(task->targets().data<int32_t>()[2] == 7);
  REQUIRE(task->rows() == 4);
  REQUIRE(std::string(task->unit()) == "samples");
}

TEST_CASE("language-model task: windows of T + 1 tokens become inputs B x T and next tokens B * T",
          "[trainer][task]") {
  auto task = make_language_model_task(4, Device::cpu());
  for (const int64_t n : {3, 1, 3}) {  // a full batch, a short last one, a full one again
    INFO("batch of " << n);
    data::Batch b = batch_of(n, 5);
    task->prepare(b);
    REQUIRE(task->input().dtype() == DType::I32);
    REQUIRE(task->input().shape() == std::vector<int64_t>{n, 4});
    REQUIRE(task->targets().shape() == std::vector<int64_t>{n * 4});
    REQUIRE(task->rows() == n * 4);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t t = 0; t < 4; ++t) {
        REQUIRE(task->input().data<int32_t>()[r * 4 + t] == 100 + r * 5 + t);
        REQUIRE(task->targets().data<int32_t>()[r * 4 + t] == 100 + r * 5 + t + 1);
      }
  }
  REQUIRE(std::string(task->unit()) == "tokens");
  data::Batch wrong = batch_of(2, 4);  // windows of 4, not T + 1 = 5
  REQUIRE_THROWS_AS(task->prepare(wrong), InternalError);
}

TEST_CASE("language-model task: a token stored as -(t + 1) is input t and an ignored target", "[trainer][task]") {
  auto task = make_language_model_task(4, Device::cpu());
  data::Batch b = batch_of(2, 5);
  // Window 0: tokens 100..104, 102 and 104 masked as targets; window 1 (105..109): 105 masked, which is only
  // an input (a window's first token is no target), so nothing of it is ignored.
  float* w = b.features.data<float>();
  w[2] = models::elementwise::masked_window_token(102);
  w[4] = models::elementwise::masked_window_token(104);
  w[5] = models::elementwise::masked_window_token(105);
  task->prepare(b);
  REQUIRE(models::elementwise::masked_window_token(102) == data::masked_window_value(102));  // one convention
  const int32_t* in = task->input().data<int32_t>();
  const int32_t* next = task->targets().data<int32_t>();
  CHECK(std::vector<int32_t>(in, in + 8) == std::vector<int32_t>{100, 101, 102, 103, 105, 106, 107, 108});
  CHECK(std::vector<int32_t>(next, next + 8) ==
        std::vector<int32_t>{101, models::kIgnoreLabel, 103, models::kIgnoreLabel, 106, 107, 108, 109});
}

TEST_CASE("a GPT needs token shards and token shards need a GPT", "[trainer][task]") {
  REQUIRE_THROWS_WITH(parse_config("[model]\nname = \"gpt\"\n", "t.toml"),
                      Catch::Contains("model.name = gpt or llama goes with data.dataset = tokens"));
  REQUIRE_THROWS_AS(parse_config("[data]\ndataset = \"tokens\"\n", "t.toml"), ConfigError);
  const Config c = parse_config("[model]\nname = \"gpt\"\nn_embd = 48\n[data]\ndataset = \"tokens\"\ndir = \"x\"\n", "t.toml");
  REQUIRE(c.model.n_embd == 48);
  REQUIRE(c.model.vocab_size == 256);
  REQUIRE_NOTHROW(parse_config("[model]\nname = \"gpt\"\nvocab_size = 128256\n[data]\ndataset = \"tokens\"\n", "t.toml"));
  REQUIRE_THROWS_WITH(parse_config("[model]\nname = \"gpt\"\nvocab_size = 16777217\n[data]\ndataset = \"tokens\"\n", "t.toml"),
                      Catch::Contains("16777216"));
}
