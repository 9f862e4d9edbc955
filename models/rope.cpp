// models/rope.cpp: RoPE's inverse frequencies, Llama 3's scaling and the cos/sin tables (models/rope.h).
#include "models/rope.h"

#include <cmath>
#include <numbers>

#include "core/check.h"

namespace dpt::models {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling) {
  if (head_dim < 2 || head_dim % 2) DPT_THROW(ConfigError, "rotary embeddings need an even head_dim, got {}", head_dim);
  if (!(theta > 0)) DPT_THROW(ConfigError, "rope_theta must be positive, got {}", theta);
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {  // float32 as torch: (2i).float() / dim, base ** that, 1 / that
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  if (scaling.type.empty() || scaling.type == "default") return inv;
  if (scaling.type != "llama3")
    DPT_THROW(ConfigError, "rope_scaling type '{}' is not supported (dptrain reads none and 'llama3')", scaling.type);
  if (!(scaling.factor > 0) || !(scaling.high_freq_factor > scaling.low_freq_factor) ||
      !(scaling.low_freq_factor > 0) || scaling.original_max_position_embeddings <= 0)
    DPT_THROW(ConfigError, "rope_scaling llama3: factor {}, low_freq_factor {}, high_freq_factor {}, "
              "original_max_position_embeddings {}: need factor > 0 and 0 < low < high", scaling.factor,
              scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position_embeddings);
  // HF's _compute_llama3_parameters: wavelengths beyond old_context / low_freq_factor slowed by `factor`, below
  // old_context / high_freq_factor kept, those between blended by where old_context / wavelength falls.
  const double old_context = static_cast<double>(scaling.original_max_position_embeddings);
  const double low_wavelen = old_context / scaling.low_freq_factor, high_wavelen = old_context / scaling.high_freq_factor;
  for (float& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / scaling.factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / scaling.factor + smooth * f);
    }
  }
  return inv;
}

void rope_tables(int64_t positions, int64_t head_dim, double theta, const RopeScaling& scaling, std::vector<float>& cos,
                 std::vector<float>& sin) {
  const std::vector<float> inv = rope_inv_freq(head_dim, theta, scaling);
  const auto half = static_cast<int64_t>(inv.size());
  cos.resize(static_cast<size_t>(positions * half));
  sin.resize(cos.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv[static_cast<size_t>(i)];
      cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
      sin[static_cast<size_t>(p * half + i)] = std::sin(angle);
    }
}

}  // namespace dpt::models
