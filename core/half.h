// core/half.h: IEEE half precision (fp16) to float32, exactly: what readers of fp16 weights (safetensors' F16, torch's
// HalfStorage) widen with, since dptrain keeps floating weights as float32 (or bf16).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dpt {

// Subnormals, infinities and NaNs (their payload shifted) kept.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) {  // infinity or NaN
    const uint32_t bits = sign | 0x7F800000u | (mant << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  // Normal: the exponent rebiased; subnormal and zero: mant x 2^-24, exact in float32.
  const float magnitude = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                                   : std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -magnitude : magnitude;
}

}  // namespace dpt
