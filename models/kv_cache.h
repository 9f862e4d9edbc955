// models/kv_cache.h: the KV cache of autoregressive generation (models/generate.h), shared by the language models that
// keep one (the GPT, the Llama family): per layer, the keys and values of the positions a generation has seen.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace dpt::models {

// Keys and values per layer: [batch, positions, width] each (the heads side by side as the projections give them;
// a Llama's keys after RoPE). `len` positions are filled.
struct KvCache {
  int64_t batch = 0, len = 0;
  std::vector<Tensor> k, v;  // one per layer

  // An empty cache of `layers` layers, each [batch, positions, width] for keys and for values, on `device`.
  static std::unique_ptr<KvCache> make(int64_t layers, int64_t batch, int64_t positions, int64_t width, Device device) {
    DPT_CHECK(batch >= 1, "KV cache for {} sequences", batch);
    auto c = std::make_unique<KvCache>();
    c->batch = batch;
    for (int64_t l = 0; l < layers; ++l) {
      c->k.push_back(Tensor::empty({batch, positions, width}, DType::F32, device));
      c->v.push_back(Tensor::empty({batch, positions, width}, DType::F32, device));
    }
    return c;
  }
};

// A model root that generates with a KV cache. After begin_kv_cache, each forward (in evaluation mode) takes only the
// next tokens [batch, t] of the sequences, which continue the cached positions, and returns their logits; a step
// then costs one position's work instead of the whole window's. A sequence cannot grow past the model's longest
// (ConfigError), nor past the `positions` begin_kv_cache was given (the cache's rows, sized by its caller to what
// the generation needs, so a short text of a long-context model keeps a small cache: an internal check);
// begin_kv_cache again starts an empty cache; end_kv_cache frees it and returns to whole-sequence forwards.
class KvCachedLm {
 public:
  virtual ~KvCachedLm() = default;
  // positions: the cache's rows, at most the model's longest sequence; 0: that longest.
  virtual void begin_kv_cache(int64_t batch, Device device, int64_t positions = 0) = 0;
  virtual void end_kv_cache() = 0;
  virtual int64_t kv_cache_len() const = 0;
};

}  // namespace dpt::models
