// trainer/build_model.h: the model a config asks for (model.name = mlp | resnet), sized from the data set,
// and starting weights from a safetensors file (model.init_from).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "trainer/config.h"

namespace dpt::trainer {

// `sample_shape` is one example's shape as the data set gives it ({C, H, W} for images, {F} for vectors);
// model.in_channels / model.num_classes of 0 take the data set's. Throws ConfigError when the model cannot
// take the data (a ResNet on flat vectors, a channel count that differs from the data's).
std::unique_ptr<models::Model> build_model(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                           int64_t data_classes, Device device);

// Loads parameters and buffers named as the model's (torchvision's names for a ResNet) from a safetensors
// file. Every tensor of the model must be there with its exact shape, except that a classifier head
// (fc.weight / fc.bias, or the MLP's last layer) whose class count differs keeps its fresh initialisation,
// as fine-tuning needs; the returned note says so (empty when everything loaded). Tensors of the file that
// the model lacks are an error too (strict, as load_state_dict). Throws ConfigError naming the key.
// A GPT takes nanoGPT's layout or Hugging Face's GPT2LMHeadModel layout (with or without the "transformer."
// prefix, Conv1D projection weights transposed, mask buffers ignored; lm_head.weight must equal the token
// embedding, the tie); the note names the layout.
// wte may have vocab_size rows (Hugging Face's 50257) or the padded count (models::padded_vocab): padding
// rows are filled with 0.
std::string load_pretrained(models::Model& model, const std::string& path);

// Training FLOPs (forward and backward) per loss row for the progress line's MFU: a GPT's per token at
// block_size (models::gpt_flops_per_token); 0 for a model without an estimate.
double train_flops_per_row(const models::Model& model);

// Layouts a GPT's weights can be written in for other programs (gpt_export_weights).
enum class GptLayout {
  NanoGpt,      // nanoGPT's state_dict: transformer.* names, nn.Linear [out, in], lm_head.weight (a copy of wte)
  HuggingFace,  // the hub's GPT-2 model.safetensors: no "transformer." prefix, Conv1D weights [in, out], no lm_head
};
GptLayout parse_gpt_layout(const std::string& name);  // "nanogpt" | "hf"; ConfigError otherwise
// A GPT's weights (host tensors, float32) in `layout`, wte cut to the real vocabulary (vocab_size rows): loads
// into nanoGPT's GPT(strict) or transformers' GPT2LMHeadModel.from_pretrained, and back through
// load_pretrained. ConfigError when `model` is not a GPT.
std::vector<NamedTensor> gpt_export_weights(const models::Model& model, GptLayout layout);

// train.precision (fp32 | bf16 | fp16) as the models' Precision.
models::Precision parse_precision(const std::string& p);

}  // namespace dpt::trainer
