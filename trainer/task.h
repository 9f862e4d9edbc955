// trainer/task.h: Task, what the training loop needs to know about the kind of learning (DESIGN.md,
// "Interfaces"): how a batch of the data set becomes the model's input and the loss's targets, and how many
// loss rows (examples, or tokens) a batch holds. The loop stays the same for every model.
//   classification        features [B, ...] as the model's sample shape; targets the labels [B]
//   language modelling    features [B, T + 1] token windows; input tokens [B, T] (int32), targets the next
//                         tokens [B * T], one per logits row
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "trainer/model_config.h"
#include "data/loader.h"

namespace dpt::trainer {

class Task {
 public:
  virtual ~Task() = default;
  // Makes `b`'s model input and targets (on b's device), valid until the next prepare().
  virtual void prepare(const data::Batch& b) = 0;
  // The model's input.
  virtual const Tensor& input() const = 0;
  // One int32 target per logits row.
  virtual const Tensor& targets() const = 0;
  // Loss rows in the batch: the count its summed loss and hits are divided by.
  virtual int64_t rows() const = 0;
  // What a row is, for the progress lines' rate: "samples" or "tokens".
  virtual const char* unit() const = 0;
};

// The task a model family trains (ModelFamily::input): language modelling over tokens, classification over examples.
std::unique_ptr<Task> make_task(ModelInput input, int64_t block_size, std::vector<int64_t> sample_shape, Device device);
// Classification over examples of `sample_shape` ({C, H, W} or {F}).
std::unique_ptr<Task> make_classification_task(std::vector<int64_t> sample_shape);
// Next-token prediction over windows of block_size + 1 tokens, the batches on `device` (the windows are split
// there by its kernel set).
std::unique_ptr<Task> make_language_model_task(int64_t block_size, Device device);

}  // namespace dpt::trainer
