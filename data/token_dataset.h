// data/token_dataset.h: TokenWindowDataset, the token windows of a split's shards (token_shards.h) as a
// Dataset, so the sampler, the loader and the training loop serve a language model as they serve images.
// Example i is window i: block_size + 1 tokens as floats (exact: tokens are below 2^16), inputs the first
// block_size and targets the last block_size (the language-modelling task splits them); its label is 0. Where a
// shard has a loss mask (token_shards.h), a target that is context only is written as -(t + 1)
// (masked_window_value), which the task reads as input t and an ignored target.
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"
#include "data/token_shards.h"

namespace dpt::data {

class TokenWindowDataset final : public Dataset {
 public:
  // The `split` shards of `dir` (find_token_shards), windows of block_size + 1 tokens. ConfigError when there
  // are none, or when a token is >= vocab_size (naming the file and the position).
  TokenWindowDataset(const std::string& dir, const std::string& split, int64_t block_size, int64_t vocab_size);
  size_t size() const override { return windows_->size(); }
  size_t feature_count() const override { return windows_->window_tokens(); }
  int num_classes() const override { return static_cast<int>(vocab_size_); }
  std::string name() const override { return name_; }
  int32_t get(size_t index, float* features) const override;
  size_t shard_count() const { return windows_->shards().size(); }

 private:
  std::unique_ptr<TokenWindows> windows_;
  bool masked_ = false;  // a shard has a loss mask: its context-only targets are written as -(t + 1)
  int64_t vocab_size_;
  std::string name_;
};

}  // namespace dpt::data
