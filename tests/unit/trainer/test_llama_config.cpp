// tests/unit/trainer/test_llama_config.cpp: the Llama family's entry in the model registry: its model.* keys, a Hugging
// Face config.json read into them (resolve_model_config: from model.hf_config or model.init_from's folder), the
// keys of config.json that are refused by name, the config.json an export writes (read back to the same options), and
// reading a sharded Hugging Face folder (read_weights); and the GPT's entry reading a GPT-2 config.json.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/safetensors.h"
#include "models/gpt/weights.h"
#include "models/llama/hf.h"
#include "models/llama/llama.h"
#include "trainer/build_model.h"
#include "trainer/config.h"
#include "trainer/model_registry.h"

using namespace dpt;
using namespace dpt::trainer;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A fresh folder under the temp directory.
fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("dpt_llama_config_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// SmolLM-135M's config.json, as the hub has it (sizes, ids, dtypes, the harmless keys).
json smollm() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02,
    "intermediate_size": 1536, "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": true, "vocab_size": 49152})");
}

ModelConfig llama_keys() {
  ModelConfig m;
  m.name = "llama";
  m.block_size = 64;
  return m;
}

}  // namespace

TEST_CASE("llama: built from its model.* keys, with the defaults they leave", "[trainer][registry][llama]") {
  ModelConfig m = llama_keys();
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.n_embd = 32;
  m.vocab_size = 50;
  const models::LlamaOptions o = llama_options(m);
  CHECK(o.head_dim == 8);
  CHECK(o.intermediate_size == default_intermediate_size(32));
  CHECK(default_intermediate_size(32) == 128);   // 8/3 x 32 = 85.3, up to 128
  CHECK(default_intermediate_size(128) == 384);  // 341.3, up to 384
  CHECK(o.max_positions == 64);
  CHECK_FALSE(o.qkv_bias);
  const ModelFamily& llama = model_family("llama");
  CHECK(llama.input == ModelInput::tokens);
  CHECK(llama.decay_matrices_only);
  CHECK(llama.generates);
  auto model = build_model(m, {65}, 0, Device::cpu());
  CHECK(model->summary().starts_with("llama L2 H4/2 C32 I128 V50 T64"));
  CHECK(static_cast<int64_t>(model->num_params()) == models::llama_num_params(o));
  CHECK(train_flops_per_row(m) == models::llama_flops_per_token(o, 64));
  m.attention_bias = "qkv";
  CHECK(llama_options(m).qkv_bias);
  CHECK_FALSE(llama_options(m).o_bias);
  m.attention_bias = "all";
  CHECK(llama_options(m).o_bias);
  CHECK(resolve_model_config(m).empty());  // no config.json anywhere: the keys stand as given
  m.max_position_embeddings = 32;
  CHECK_THROWS_WITH(build_model(m, {65}, 0, Device::cpu()), Catch::Contains("longer than model.max_position_embeddings"));
}

TEST_CASE("llama: a Hugging Face config.json gives the model.* keys", "[trainer][registry][llama]") {
  const fs::path dir = fresh_dir("resolve");
  write(dir / "config.json", smollm().dump());
  ModelConfig m = llama_keys();
  m.init_from = dir.string();  // a model folder: its config.json is read
  const std::string line = resolve_model_config(m);
  CHECK_THAT(line, Catch::Contains("config.json (llama): llama L30 H9/3 C576 I1536 V49152 T64 tied"));
  CHECK(m.n_layer == 30);
  CHECK(m.n_head == 9);
  CHECK(m.n_kv_head == 3);
  CHECK(m.n_embd == 576);
  CHECK(m.head_dim == 64);
  CHECK(m.vocab_size == 49152);
  CHECK(m.rms_norm_eps == 1e-5);
  CHECK(m.tie_embeddings);
  CHECK(m.max_position_embeddings == 2048);
  CHECK(resolve_model_config(m) == line);  // again (a restart): the same keys, no conflict
  CHECK(models::llama_num_params(llama_options(m)) == 134515008);  // SmolLM-135M's count
  // SmolLM2's config.json (nanotron's converter) adds is_llama_config and rope_interleaved = false: the same model.
  json smollm2 = smollm();
  smollm2["is_llama_config"] = true;
  smollm2["rope_interleaved"] = false;
  const models::HfLlamaConfig two = models::parse_hf_llama_config(smollm2.dump(), "smollm2.json");
  CHECK(models::llama_shape_name(two.options) ==
        models::llama_shape_name(models::parse_hf_llama_config(smollm().dump(), "c.json").options));

  // model.hf_config names the file (or its folder); a key the config sets otherwise is an error naming both.
  ModelConfig other = llama_keys();
  other.hf_config = (dir / "config.json").string();
  other.n_layer = 12;
  other.given.insert("n_layer");
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("model.n_layer = 12, but") &&
                                                  Catch::Contains("num_hidden_layers = 30"));
  // A key set to its default value is set all the same: config.json may not overrule it (through the config's own
  // parser, which records what the file and the overrides set).
  const Config given = parse_config(fmt::format("[model]\nname = \"llama\"\nhf_config = \"{}\"\ntie_embeddings = false\n"
                                                "[data]\ndataset = \"tokens\"\n", dir.string()), "t.toml");
  CHECK(given.model.given.count("tie_embeddings"));
  ModelConfig untie = given.model;
  CHECK_THROWS_WITH(resolve_model_config(untie), Catch::Contains("model.tie_embeddings = false, but") &&
                                                  Catch::Contains("tie_word_embeddings = true"));
  other = llama_keys();
  other.hf_config = dir.string();
  other.block_size = 4096;
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("longer than the 2048 positions"));
  other = llama_keys();
  other.hf_config = (dir / "missing.json").string();
  CHECK_THROWS_AS(resolve_model_config(other), ConfigError);

  // Llama 3's rope scaling and Qwen2's biases.
  json l3 = smollm();
  l3["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  l3["eos_token_id"] = {128001, 128008};
  write(dir / "config.json", l3.dump());
  m = llama_keys();
  m.hf_config = dir.string();
  resolve_model_config(m);
  CHECK(m.rope_scaling == "llama3");
  CHECK(m.rope_factor == 32.0);
  json qwen = smollm();
  qwen["model_type"] = "qwen2";
  qwen.erase("attention_bias");
  qwen["use_sliding_window"] = false;
  qwen["sliding_window"] = 4096;
  qwen["max_window_layers"] = 21;
  write(dir / "config.json", qwen.dump());
  m = llama_keys();
  m.hf_config = dir.string();
  resolve_model_config(m);
  CHECK(m.attention_bias == "qkv");
}

TEST_CASE("llama: config.json keys that would change the arithmetic are refused by name", "[trainer][registry][llama]") {
  const auto refused = [](json j, const std::string& why) {
    INFO(j.dump());
    CHECK_THROWS_WITH(models::parse_hf_llama_config(j.dump(), "c.json"), Catch::Contains(why));
  };
  json j = smollm();
  j["use_qk_norm"] = true;
  refused(j, "key 'use_qk_norm' = true is not one dptrain reads");
  j = smollm();
  j["hidden_act"] = "gelu";
  refused(j, "hidden_act = \"gelu\"");
  j = smollm();
  j["attention_dropout"] = 0.1;
  refused(j, "attention_dropout = 0.1");
  j = smollm();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  refused(j, "rope_scaling type 'yarn'");
  j = smollm();
  j["model_type"] = "gemma";
  refused(j, "model_type 'gemma'");
  j["model_type"] = "gpt2";  // model.name = llama given a GPT-2 folder: says which model.name reads it
  refused(j, "model_type 'gpt2' is GPT-2, not a model of the Llama family: set model.name = gpt");
  j = smollm();
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  refused(j, "use_sliding_window = true");
  j = smollm();
  j["model_type"] = "mistral";
  j["sliding_window"] = 1024;
  refused(j, "sliding_window = 1024");
  j["sliding_window"] = nullptr;  // Mistral v0.3: no window
  CHECK(models::parse_hf_llama_config(j.dump(), "c.json").model_type == "mistral");
  j = smollm();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};  // transformers: KeyError, not defaults
  refused(j, "rope_scaling of type llama3 lacks low_freq_factor");
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  refused(j, "lacks original_max_position_embeddings");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  refused(j, "lacks factor");
  j["rope_scaling"]["factor"] = 8.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
  refused(j, "original_max_position_embeddings = 8192.5 must be a positive integer");
  j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "default"}, {"factor", 2.0}};  // transformers 4.45: linear
  refused(j, "rope_scaling has rope_type \"default\" and type \"linear\", which disagree");
  j["rope_scaling"] = {{"type", "llama3"}, {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};  // both, agreeing
  CHECK(models::parse_hf_llama_config(j.dump(), "c.json").options.rope_scaling.type == "llama3");
  j = smollm();
  j["rope_interleaved"] = true;  // nanotron's key: adjacent pairs rotated, not HF's halves
  refused(j, "rope_interleaved = true");
  j = smollm();
  j["quantization_config"] = {{"quant_method", "gptq"}};
  refused(j, "quantization_config");
  j = smollm();
  j["auto_map"] = {{"AutoModelForCausalLM", "modeling.Model"}};
  refused(j, "auto_map");
  j = smollm();
  j.erase("hidden_size");
  refused(j, "hidden_size is missing");
  j = smollm();
  j["num_key_value_heads"] = 4;
  refused(j, "not a multiple of n_kv_head 4");
  refused(json::array(), "holds an object");
  CHECK_THROWS_WITH(models::parse_hf_llama_config("{", "c.json"), Catch::Contains("not valid JSON"));
}

TEST_CASE("llama: the config.json an export writes reads back to the same model", "[trainer][registry][llama]") {
  for (const std::string bias : {"none", "qkv", "all"}) {
    ModelConfig m = llama_keys();
    m.n_layer = 2;
    m.n_head = 4;
    m.n_kv_head = 1;
    m.n_embd = 16;
    m.vocab_size = 40;
    m.rms_norm_eps = 1e-5;
    m.rope_theta = 500000.0;
    m.attention_bias = bias;
    m.tie_embeddings = bias == "qkv";
    if (bias != "none") {  // Llama's and Qwen2's both: transformers 4.45's Qwen2 reads rope_scaling too
      m.rope_scaling = "llama3";
      m.rope_factor = 8;
      m.rope_original_max_positions = 32;
    }
    const models::LlamaOptions o = llama_options(m);
    auto model = build_model(m, {65}, 0, Device::cpu());
    model->init(3);
    const ExportedWeights w = model_family("llama").export_weights(*model, m, "hf");
    INFO(w.config_json);
    CHECK(w.layout == (bias == "qkv" ? "Hugging Face's Qwen2" : "Hugging Face's Llama"));
    const models::HfLlamaConfig back = models::parse_hf_llama_config(w.config_json, "exported");
    CHECK(back.model_type == (bias == "qkv" ? "qwen2" : "llama"));
    CHECK(models::llama_shape_name(back.options) == models::llama_shape_name(o));
    CHECK(back.options.max_positions == 64);
    CHECK(back.options.qkv_bias == o.qkv_bias);
    CHECK(back.options.o_bias == o.o_bias);
    CHECK(back.options.rope_theta == o.rope_theta);
    CHECK(back.options.rms_norm_eps == o.rms_norm_eps);
    CHECK(back.options.rope_scaling.type == o.rope_scaling.type);
    CHECK(back.options.rope_scaling.original_max_position_embeddings ==
          o.rope_scaling.original_max_position_embeddings);
    CHECK(back.options.rope_scaling.factor == o.rope_scaling.factor);
    size_t heads = 0;
    for (const auto& nt : w.tensors) heads += nt.name == "lm_head.weight";
    CHECK(heads == (m.tie_embeddings ? 0u : 1u));  // save_pretrained leaves a tied head out
    CHECK_THROWS_AS(model_family("llama").export_weights(*model, m, "nanogpt"), ConfigError);
  }
  // Qwen2's biases with a head_dim other than hidden / heads: neither class builds it, and the error says why.
  ModelConfig m = llama_keys();
  m.n_head = 4;
  m.n_embd = 16;
  m.head_dim = 8;
  m.attention_bias = "qkv";
  auto model = build_model(m, {65}, 0, Device::cpu());
  CHECK_THROWS_WITH(model_family("llama").export_weights(*model, m, "hf"),
                    Catch::Contains("biases on q, k, v but not on o_proj, head_dim 8 x 4 heads != hidden_size 16"));
}

TEST_CASE("llama: a sharded Hugging Face folder reads as one set of weights", "[trainer][registry][llama]") {
  const fs::path dir = fresh_dir("shards");
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4}), c = Tensor::zeros({1});
  a.data<float>()[1] = 1.5f;
  b.data<float>()[3] = -2.0f;
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"x.weight", a}, {"y.bias", b}});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {{"z", c}});
  write(dir / "model.safetensors.index.json",
        R"({"metadata": {"total_size": 44}, "weight_map": {"x.weight": "model-00001-of-00002.safetensors",
            "y.bias": "model-00001-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}})");
  const SafetensorsFile all = read_weights(dir.string());
  REQUIRE(all.tensors.size() == 3);
  REQUIRE(all.find("x.weight")->data<float>()[1] == 1.5f);
  REQUIRE(all.find("y.bias")->data<float>()[3] == -2.0f);
  REQUIRE(all.find("z"));
  write(dir / "model.safetensors.index.json",
        R"({"weight_map": {"x.weight": "model-00002-of-00002.safetensors"}})");
  CHECK_THROWS_WITH(read_weights(dir.string()), Catch::Contains("puts x.weight in model-00002-of-00002.safetensors"));
  write(dir / "model.safetensors.index.json", R"({"weight_map": {"x.weight": "../elsewhere.safetensors"}})");
  CHECK_THROWS_WITH(read_weights(dir.string()), Catch::Contains("not a file name beside the index"));
  // transformers' order: a whole model.safetensors first, even beside an index (here a .bin index whose shards were
  // never downloaded).
  write(dir / "pytorch_model.bin.index.json", R"({"weight_map": {"x.weight": "pytorch_model-00001-of-00002.bin"}})");
  write_safetensors((dir / "model.safetensors").string(), {{"whole", c}});
  const SafetensorsFile whole = read_weights(dir.string());
  REQUIRE(whole.tensors.size() == 1);
  REQUIRE(whole.find("whole"));
  const fs::path empty = fresh_dir("empty");
  CHECK_THROWS_WITH(read_weights(empty.string()), Catch::Contains("a folder without weights"));
  fs::remove_all(dir);
  fs::remove_all(empty);
}

TEST_CASE("gpt: a Hugging Face GPT-2 config.json gives the model.* keys, or none when there is none",
          "[trainer][registry][gpt]") {
  const fs::path dir = fresh_dir("gpt");
  ModelConfig m;
  m.name = "gpt";
  m.init_from = (dir / "model.safetensors").string();  // a file, not a folder: nanoGPT's, a state dict
  CHECK(resolve_model_config(m).empty());
  m.init_from = dir.string();  // a folder without config.json: the keys stand as given
  CHECK(resolve_model_config(m).empty());
  CHECK(m.n_head == 4);

  json c = json::parse(models::gpt_hf_config_json({.n_layer = 2, .n_head = 8, .n_embd = 64, .vocab_size = 300,
                                                    .block_size = 32}));
  write(dir / "config.json", c.dump());
  const std::string line = resolve_model_config(m);
  CHECK_THAT(line, Catch::Contains("config.json (gpt2): gpt L2 H8 C64 V300 T32"));
  CHECK(m.n_layer == 2);
  CHECK(m.n_head == 8);
  CHECK(m.n_embd == 64);
  CHECK(m.vocab_size == 300);
  CHECK(m.block_size == 32);
  CHECK(resolve_model_config(m) == line);  // again (a restart): the same keys, no conflict

  // A key the config sets to another value than config.json's is an error naming both, even at its default value.
  const Config given = parse_config(fmt::format("[model]\nname = \"gpt\"\ninit_from = \"{}\"\nn_head = 4\n"
                                                "[data]\ndataset = \"tokens\"\n", dir.string()), "t.toml");
  ModelConfig other = given.model;
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("model.n_head = 4, but") &&
                                                  Catch::Contains("says n_head = 8"));
  other = given.model;
  other.given = {"block_size"};
  other.block_size = 64;
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("model.block_size = 64, but") &&
                                                  Catch::Contains("n_positions = 32") &&
                                                  Catch::Contains("give model.block_size <= 32"));
  // A shorter context crops the model (nanoGPT's crop_block_size): model.block_size stands, the line says so.
  other.block_size = 16;
  CHECK_THAT(resolve_model_config(other), Catch::Contains("gpt L2 H8 C64 V300 T16 (n_positions 32 cropped"));
  CHECK(other.block_size == 16);
  CHECK(other.n_head == 8);
  // model.hf_config names it (or its folder) for weights from elsewhere; refused keys are refused by name.
  other = ModelConfig{};
  other.name = "gpt";
  c["scale_attn_by_inverse_layer_idx"] = true;
  write(dir / "other.json", c.dump());
  other.hf_config = (dir / "other.json").string();
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("scale_attn_by_inverse_layer_idx = true"));

  // A Llama's folder under model.name = gpt says which model.name reads it.
  write(dir / "config.json", smollm().dump());
  other = ModelConfig{};
  other.name = "gpt";
  other.init_from = dir.string();
  CHECK_THROWS_WITH(resolve_model_config(other), Catch::Contains("model_type 'llama'") &&
                                                  Catch::Contains("model.name = llama"));

  // Without a config.json, the tensor names tell: a Llama's under model.name = gpt, GPT-2's under model.name = llama.
  const Tensor w = Tensor::zeros({4, 2});
  std::string layout;
  CHECK_THROWS_WITH(models::gpt_import_weights({{"model.embed_tokens.weight", w}}, "f", {}, &layout),
                    Catch::Contains("model.embed_tokens.weight is the token embedding of a Llama family's model") &&
                    Catch::Contains("set model.name = llama"));
  for (const char* name : {"wte.weight", "transformer.wte.weight"})
    CHECK_THROWS_WITH(models::llama_import_weights({{name, w}}, "f", {}, &layout),
                      Catch::Contains(fmt::format("{} is GPT-2's token embedding", name)) &&
                      Catch::Contains("set model.name = gpt"));
}

TEST_CASE("gpt: a Hugging Face GPT-2 file that lacks a tensor or holds a wrong one is told in the file's names",
          "[trainer][registry][gpt]") {
  // The hub's gpt2 model.safetensors names its tensors without "transformer." (h.0.ln_1.weight): an error naming
  // only dptrain's transformer.h.0.ln_1.weight sent the user looking for a name the file never had.
  const fs::path dir = fresh_dir("gpt_hf_names");
  ModelConfig m;
  m.name = "gpt";
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 16;
  m.vocab_size = 64;
  m.block_size = 8;
  const auto model = model_family("gpt").build(m, {m.block_size + 1}, 0, Device::cpu());
  model->init(3);
  std::vector<NamedTensor> hf = models::gpt_export_weights(*model, models::GptLayout::HuggingFace);
  REQUIRE(std::any_of(hf.begin(), hf.end(), [](const NamedTensor& nt) { return nt.name == "h.0.ln_1.weight"; }));
  const auto path = (dir / "model.safetensors").string();
  write_safetensors(path, hf);
  CHECK(load_pretrained(*model, m, path).find("Hugging Face layout") != std::string::npos);

  std::vector<NamedTensor> lacking;
  for (const auto& nt : hf)
    if (nt.name != "h.0.ln_1.weight") lacking.push_back(nt);
  write_safetensors(path, lacking);
  CHECK_THROWS_WITH(load_pretrained(*model, m, path),
                    Catch::Contains("no tensor named h.0.ln_1.weight (dptrain's transformer.h.0.ln_1.weight)"));
  for (auto& nt : hf)
    if (nt.name == "ln_f.bias") nt.tensor = Tensor::zeros({3});
  write_safetensors(path, hf);
  CHECK_THROWS_WITH(load_pretrained(*model, m, path),
                    Catch::Contains("ln_f.bias (dptrain's transformer.ln_f.bias) is float32 [3]"));

  // nanoGPT's names are dptrain's: said as they are.
  std::vector<NamedTensor> nano = models::gpt_export_weights(*model, models::GptLayout::NanoGpt);
  std::erase_if(nano, [](const NamedTensor& nt) { return nt.name == "transformer.h.0.ln_1.weight"; });
  write_safetensors(path, nano);
  CHECK_THROWS_WITH(load_pretrained(*model, m, path),
                    Catch::Contains("no tensor named transformer.h.0.ln_1.weight (this model"));
}
