// trainer/build_model.h: the model a config asks for (model.name: a family of trainer/model_registry.h), sized from
// the data set, and starting weights from a safetensors file (model.init_from) in the layouts its family reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "models/model.h"
#include "trainer/config.h"

namespace dpt::trainer {

// `sample_shape` is one example's shape as the data set gives it ({C, H, W} for images, {F} for vectors);
// model.in_channels / model.num_classes of 0 take the data set's. Throws ConfigError when the model cannot
// take the data (a ResNet on flat vectors, a channel count or a classifier's class count that differs from the
// data's).
std::unique_ptr<models::Model> build_model(const ModelConfig& m, const std::vector<int64_t>& sample_shape,
                                           int64_t data_classes, Device device);

// Loads parameters and buffers named as the model's (torchvision's names for a ResNet) from a safetensors
// file. Every tensor of the model must be there with its exact shape, except that a classifier head
// (fc.weight / fc.bias, or the MLP's last layer) whose class count differs keeps its fresh initialisation,
// as fine-tuning needs (a family with reinit_head); the returned note says so (empty when everything loaded).
// Tensors of the file that the model lacks are an error too (strict, as load_state_dict). Throws ConfigError
// naming the key. `m` (the model's keys) names its family, whose import_weights reads other layouts first: a GPT
// takes nanoGPT's layout or Hugging Face's GPT2LMHeadModel layout (models/gpt/weights.h: gpt_import_weights: with
// or without the "transformer." prefix, Conv1D projection weights transposed, mask buffers ignored; lm_head.weight
// must equal the token embedding, the tie); the note names the layout. wte may have vocab_size rows (Hugging
// Face's 50257) or the padded count (models::padded_vocab): padding rows are filled with 0. The "_orig_mod." prefix
// torch.compile's wrapper puts on every name (nanoGPT's compiled ckpt.pt) is removed first, and so is the "module."
// DistributedDataParallel's wrapper puts there (a state dict saved from the wrapper) when every name has it;
// BatchNorm's num_batches_tracked, when the file lacks it (torchvision's downloads before 0.4.1), is 0, as PyTorch
// loads it. The note says so.
std::string load_pretrained(models::Model& model, const ModelConfig& m, const std::string& path);

// The weights model.init_from names: a file (safetensors, or torch.save's zip), or a Hugging Face model folder, in
// transformers' order: its model.safetensors, else model.safetensors.index.json and the shards it names, else
// pytorch_model.bin, else pytorch_model.bin.index.json and its shards. IoError naming what is missing or inconsistent.
SafetensorsFile read_weights(const std::string& path);

// Training FLOPs (forward and backward) per loss row for the progress line's MFU: the family's estimate (a GPT's
// per token at block_size, models::gpt_flops_per_token); 0 for a family without one.
double train_flops_per_row(const ModelConfig& m);

}  // namespace dpt::trainer
