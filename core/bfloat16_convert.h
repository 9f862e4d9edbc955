// core/bfloat16_convert.h: float32 <-> bfloat16 conversion of whole tensors, on the CPU or the GPU (the
// tensors' device), with core/bfloat16.h's rounding: what a bfloat16 gradient all-reduce needs on either side
// of the wire.
#pragma once

#include "core/tensor.h"

namespace dpt {

// dst[i] = bfloat16(src[i] / divisor): the division in float32, then one rounding (ties to even; inf and
// NaN kept). src is F32, dst BF16, same numel and device. On a CUDA tensor the kernel runs on `stream`
// (asynchronously); with no stream the device is synchronised around it.
void to_bfloat16(const Tensor& src, Tensor& dst, float divisor = 1.0f, StreamHandle stream = nullptr);
// dst[i] = float32(src[i]), exact. src is BF16, dst F32; otherwise as to_bfloat16.
void from_bfloat16(const Tensor& src, Tensor& dst, StreamHandle stream = nullptr);

}  // namespace dpt
