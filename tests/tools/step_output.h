// tests/tools/step_output.h: what the parity tools (dpt-model-io, dpt-gpt-io, dpt-llama-io) write after one training step,
// for the PyTorch side to compare: logits, the mean loss and grad.<param> (out.safetensors, plus any `extra`
// tensors), and the model's state (state.safetensors), both in DIR.
#pragma once

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "models/layers.h"
#include "models/model.h"

namespace dpt::test {

// An int64 or int32 tensor as int32 (token ids from numpy or torch).
inline Tensor as_i32(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::I32);
  for (size_t i = 0; i < t.numel(); ++i)
    out.data<int32_t>()[i] = t.dtype() == DType::I64 ? static_cast<int32_t>(t.data<int64_t>()[i]) : t.data<int32_t>()[i];
  return out;
}

// The files from explicit tensors: `grads` as grad.<name>, `state` as state.safetensors.
inline void write_step_tensors(const std::string& dir, const Tensor& logits, const models::LossResult& r,
                               const std::vector<NamedTensor>& grads, const std::vector<NamedTensor>& state,
                               const std::vector<NamedTensor>& extra = {}) {
  std::vector<NamedTensor> result{{"logits", logits}};
  Tensor loss = Tensor::empty({}, DType::F64);
  loss.data<double>()[0] = r.loss_sum / static_cast<double>(r.count);
  result.push_back({"loss", loss});
  for (const auto& g : grads) result.push_back({"grad." + g.name, g.tensor});
  result.insert(result.end(), extra.begin(), extra.end());
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/out.safetensors", result);
  write_safetensors(dir + "/state.safetensors", state);
}

inline void write_step_output(const std::string& dir, const models::Model& model, const Tensor& logits,
                              const models::LossResult& r, const std::vector<NamedTensor>& extra = {}) {
  std::vector<NamedTensor> grads;
  for (const auto& np : model.named_params()) grads.push_back({np.name, np.grad});
  write_step_tensors(dir, logits, r, grads, model.state(), extra);
  std::cout << model.summary() << "\n";
}

}  // namespace dpt::test
