// tests/unit/trainer/test_model_registry.cpp: the model families (trainer/model_registry.h): their names as the
// config lists them, what each builds and trains on, its weight-decay grouping, its fine-tuning head, its FLOPs,
// and the errors for a name no family has.
#include <catch2/catch.hpp>

#include "core/check.h"
#include "models/gpt/gpt.h"
#include "trainer/build_model.h"
#include "trainer/config.h"
#include "trainer/model_registry.h"
#include "trainer/task.h"

using namespace dpt;
using namespace dpt::trainer;

TEST_CASE("model families: names, help and lookup", "[trainer][registry]") {
  CHECK(model_names() == std::vector<std::string>{"mlp", "resnet", "gpt", "llama"});
  CHECK(model_names(ModelInput::tokens) == std::vector<std::string>{"gpt", "llama"});
  CHECK(model_names(ModelInput::examples) == std::vector<std::string>{"mlp", "resnet"});
  // model.name's help: each name followed by its family's note.
  CHECK(model_name_help().starts_with("mlp | resnet | gpt (GPT-2 as nanoGPT: needs data.dataset = tokens; its GPU "
                                      "kernels passed their tests on an H200) | llama (Hugging Face's "
                                      "LlamaForCausalLM"));
  for (const std::string& name : model_names()) CHECK(model_family(name).name == name);
  // train.weight_decay_params' help names the families whose auto grouping decays matrices only (it once said gpt
  // alone, while the llama's auto decayed matrices only too).
  CHECK_THAT(config_keys_help(), Catch::Contains("auto (matrices for gpt and llama, all otherwise"));
  CHECK_THROWS_WITH(model_family("mamba"), Catch::Contains("model.name = 'mamba': must be one of: mlp, resnet, gpt, llama"));
  CHECK_THROWS_AS(model_family("mamba"), ConfigError);
  CHECK_THROWS_WITH(parse_config("[model]\nname = \"mamba\"\n", "t.toml"), Catch::Contains("must be one of: mlp, resnet, gpt, llama"));
}

TEST_CASE("model families: what each builds, trains on and how it groups weight decay", "[trainer][registry]") {
  ModelConfig m;
  m.hidden = {8};
  m.widths = {4, 8};
  m.blocks = {1, 1};
  m.stem = ResNetStem::small;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 8;
  m.vocab_size = 16;
  m.block_size = 4;

  m.name = "mlp";
  const ModelFamily& mlp = model_family("mlp");
  CHECK(mlp.input == ModelInput::examples);
  CHECK_FALSE(mlp.decay_matrices_only);
  CHECK(mlp.reinit_head);
  CHECK_FALSE(mlp.generates);
  CHECK_FALSE(mlp.import_weights);
  CHECK(build_model(m, {1, 6, 6}, 3, Device::cpu())->num_params() == 36 * 8 + 8 + 8 * 3 + 3);
  CHECK(train_flops_per_row(m) == 0.0);
  CHECK(std::string(make_task(mlp.input, m.block_size, {1, 6, 6}, Device::cpu())->unit()) == "samples");

  m.name = "resnet";
  const ModelFamily& resnet = model_family("resnet");
  CHECK(resnet.input == ModelInput::examples);
  CHECK_FALSE(resnet.decay_matrices_only);
  CHECK(resnet.reinit_head);
  CHECK(build_model(m, {1, 8, 8}, 3, Device::cpu())->summary().starts_with("resnet basic [1, 1] x [4, 8] (small stem)"));
  CHECK_THROWS_WITH(build_model(m, {64}, 3, Device::cpu()), Catch::Contains("needs images [C, H, W]"));

  m.name = "gpt";
  const ModelFamily& gpt = model_family("gpt");
  CHECK(gpt.input == ModelInput::tokens);
  CHECK(gpt.decay_matrices_only);
  CHECK_FALSE(gpt.reinit_head);
  CHECK(gpt.generates);
  CHECK(gpt.import_weights);
  const auto model = build_model(m, {m.block_size + 1}, 0, Device::cpu());
  CHECK(model->num_params() == static_cast<size_t>(models::gpt_num_params(gpt_options(m), /*with_wpe=*/true)));
  CHECK(train_flops_per_row(m) == models::gpt_flops_per_token(gpt_options(m), m.block_size));
  CHECK(train_flops_per_row(m) > 0.0);
  CHECK(std::string(make_task(gpt.input, m.block_size, {m.block_size + 1}, Device::cpu())->unit()) == "tokens");

  // Layouts out: only the GPT has them; Hugging Face's comes with its config.json, nanoGPT's alone.
  CHECK(exporting_model_names() == std::vector<std::string>{"gpt", "llama"});
  CHECK_FALSE(mlp.export_weights);
  CHECK_FALSE(resnet.export_weights);
  REQUIRE(gpt.export_weights);
  model->init(1);
  const ExportedWeights hf = gpt.export_weights(*model, m, "hf");
  CHECK(hf.layout == "Hugging Face's GPT-2");
  CHECK(hf.config_json.find("\"n_positions\": 4") != std::string::npos);
  CHECK_FALSE(hf.tensors.empty());
  const ExportedWeights nano = gpt.export_weights(*model, m, "nanogpt");
  CHECK(nano.config_json.empty());
  CHECK(nano.tensors.size() == hf.tensors.size() + 1);  // nanoGPT's lm_head.weight, HF's tie has none
  CHECK_THROWS_AS(gpt.export_weights(*model, m, "onnx"), ConfigError);
}

TEST_CASE("model families: model.num_classes must be the data's class count, or 0", "[trainer][registry]") {
  ModelConfig m;
  m.hidden = {8};
  m.widths = {4, 8};
  m.blocks = {1, 1};
  m.stem = ResNetStem::small;
  for (const char* name : {"mlp", "resnet"}) {
    INFO(name);
    m.name = name;
    m.num_classes = 0;  // the data's: 3 outputs
    CHECK(build_model(m, {1, 8, 8}, 3, Device::cpu())->named_params().back().param.dim(0) == 3);
    m.num_classes = 3;  // the same count, given
    CHECK(build_model(m, {1, 8, 8}, 3, Device::cpu())->named_params().back().param.dim(0) == 3);
    // More outputs than classes (the extra ones never a label, nor a class name to predict), or fewer (labels
    // without an output): a config error naming both counts, before anything trains.
    for (int64_t n : {5, 2}) {
      m.num_classes = n;
      CHECK_THROWS_AS(build_model(m, {1, 8, 8}, 3, Device::cpu()), ConfigError);
      CHECK_THROWS_WITH(build_model(m, {1, 8, 8}, 3, Device::cpu()),
                        Catch::Contains(fmt::format("model.num_classes = {}, but the data has 3 classes", n)));
    }
  }
}
