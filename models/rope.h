// models/rope.h: the rotary position embeddings' angles (Llama's RoPE, issue 35): per pair i < head_dim / 2 of a head
// the inverse frequency theta^(-2i / head_dim), as Hugging Face's LlamaRotaryEmbedding computes it (in float32), and
// Llama 3's rope_scaling ("llama3": long wavelengths slowed by `factor`, short ones kept, a smooth blend between);
// then the cos and sin tables the kernels' rope() reads. Pure host arithmetic, shared by both kernel sets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt::models {

// config.json's rope_scaling: none (type empty) or Llama 3's.
struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// head_dim / 2 inverse frequencies (float32, as HF: 1 / theta^(arange(0, head_dim, 2) / head_dim)), scaled.
// Throws ConfigError for an odd head_dim, theta <= 0, an unknown scaling type or llama3 factors that do not order.
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});

// cos and sin of position p times each inverse frequency (float32 products, as HF), [positions, head_dim / 2].
void rope_tables(int64_t positions, int64_t head_dim, double theta, const RopeScaling& scaling, std::vector<float>& cos,
                 std::vector<float>& sin);

}  // namespace dpt::models
