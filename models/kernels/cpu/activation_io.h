// models/kernels/cpu/activation_io.h: how the CPU set's templates over the activations' type (float32, or bf16 on the
// transformer fast path) read and write an element: bf16 read widened (exact), written rounded once.
#pragma once

#include <cstdint>

#include "core/bfloat16.h"

namespace dpt::models::cpu_act {

inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const BFloat16* p, int64_t i) { return to_float(p[i]); }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(BFloat16* p, int64_t i, float v) { p[i] = to_bfloat16(v); }

}  // namespace dpt::models::cpu_act
