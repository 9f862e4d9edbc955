// data/token_dataset.cpp: see token_dataset.h.
#include "data/token_dataset.h"

#include <vector>

#include <fmt/format.h>

namespace dpt::data {

TokenWindowDataset::TokenWindowDataset(const std::string& dir, const std::string& split, int64_t block_size,
                                       int64_t vocab_size)
    : windows_(std::make_unique<TokenWindows>(find_token_shards(dir, split), block_size)), vocab_size_(vocab_size) {
  windows_->check_vocab(vocab_size);
  masked_ = windows_->masked();
  name_ = fmt::format("tokens {}/{} ({} shard(s), {} windows of {})", dir, split, windows_->shards().size(),
                      windows_->size(), block_size + 1);
}

int32_t TokenWindowDataset::get(size_t index, float* features) const {
  thread_local std::vector<int32_t> window;
  thread_local std::vector<uint8_t> trained;
  window.resize(windows_->window_tokens());
  if (!masked_) {
    windows_->get(index, window.data());
    for (size_t i = 0; i < window.size(); ++i) features[i] = static_cast<float>(window[i]);
    return 0;
  }
  trained.resize(window.size());
  windows_->get(index, window.data(), trained.data());
  features[0] = static_cast<float>(window[0]);  // an input only: never a target
  for (size_t i = 1; i < window.size(); ++i)
    features[i] = trained[i] ? static_cast<float>(window[i]) : masked_window_value(static_cast<uint32_t>(window[i]));
  return 0;
}

}  // namespace dpt::data
