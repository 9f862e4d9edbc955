// trainer/model_config.h: the model.* keys of the configuration (trainer/config.h holds the rest, and the schema
// that reads and checks them all), and what a model family trains on; beside them so that the model registry
// (trainer/model_registry.h) and the tasks can use them without the whole configuration.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "models/resnet.h"
#include "trainer/choice.h"

namespace dpt::trainer {

// What a model family trains on, and so its task and what `predict` feeds it: examples of an image or vector data
// set (classification; predict: images) or windows of tokens (data.dataset = tokens: language modelling; predict:
// prompts).
enum class ModelInput { examples, tokens };

// model.stem: a ResNet's first layers: torchvision's (7x7 stride-2 conv + max pool) or small images' (3x3 stride 1).
enum class ResNetStem { imagenet, small };
template <> struct ChoiceNames<ResNetStem> { static constexpr std::array<std::string_view, 2> names{"imagenet", "small"}; };
// model.block: the models' ResNetBlock as a config writes it.
template <> struct ChoiceNames<models::ResNetBlock> {
  static constexpr std::array<std::string_view, 2> names{"basic", "bottleneck"};
};

struct ModelConfig {
  std::string name = "mlp";                  // a model family of trainer/model_registry.h
  std::vector<int64_t> hidden = {512, 512};  // mlp
  int64_t depth = 18;                        // resnet: 18 | 34 | 50 (torchvision's block counts)
  std::vector<int64_t> blocks = {};          // resnet: blocks per stage, overriding depth
  models::ResNetBlock block = models::ResNetBlock::basic;  // resnet with blocks
  std::vector<int64_t> widths = {64, 128, 256, 512};  // resnet: planes per stage
  ResNetStem stem = ResNetStem::imagenet;    // resnet
  // gpt: its sizes are taken from a Hugging Face GPT-2 config.json when there is one (hf_config, or the folder
  // init_from names: resolve_model_config).
  int64_t n_layer = 4;                       // gpt: blocks
  int64_t n_head = 4;                        // gpt: attention heads
  int64_t n_embd = 128;                      // gpt: width
  int64_t vocab_size = 256;                  // gpt: vocabulary (256: byte-level tokens)
  int64_t block_size = 64;                   // gpt: context length
  bool recompute = false;                    // gpt: recompute attention probabilities and GELU in backward
  // llama (models/llama/llama.h), with n_layer, n_head, n_embd, vocab_size and block_size above; all of them taken from
  // a Hugging Face config.json when there is one (hf_config, or the folder init_from names: resolve_model_config).
  int64_t n_kv_head = 0;                     // 0: n_head (multi-head attention)
  int64_t head_dim = 0;                      // 0: n_embd / n_head
  int64_t intermediate_size = 0;             // 0: default_intermediate_size(n_embd)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::string rope_scaling = "";             // "" | "llama3"
  double rope_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;  // llama3's
  int64_t rope_original_max_positions = 8192;                                         // llama3's
  int64_t max_position_embeddings = 0;       // what config.json says the model takes (0: block_size)
  bool tie_embeddings = false;
  std::string attention_bias = "none";       // none | qkv (Qwen2) | all (Llama's attention_bias: q, k, v and o)
  bool mlp_bias = false;
  std::string hf_config = "";                // gpt, llama: a Hugging Face config.json, or a folder holding one
  // The model.* keys (without "model.") the config file or an override set, whatever their value: a family's resolve
  // (trainer/model_registry.h) takes the others from elsewhere and refuses to contradict these. Not a key itself.
  std::set<std::string> given;
  int64_t in_channels = 0;                   // 0: the data set's
  int64_t num_classes = 0;                   // 0: the data set's
  bool sync_bn = false;                      // SyncBatchNorm across ranks
  std::string init_from = "";                // safetensors file of weights (torchvision names) to start from
};

}  // namespace dpt::trainer
