// core/bfloat16_launch.h: the launchers of the conversion kernels in bfloat16_convert.cu (CUDA builds only).
// Each takes an explicit stream, launches, and returns cudaGetLastError() for bfloat16_convert.cpp to check;
// the .cu side stays free of the project's C++ headers (fmt, spdlog), which nvcc need not parse.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/bfloat16.h"

namespace dpt::cuda_launch {

cudaError_t to_bfloat16(const float* src, BFloat16* dst, size_t n, float divisor, cudaStream_t s);
cudaError_t from_bfloat16(const BFloat16* src, float* dst, size_t n, cudaStream_t s);

}  // namespace dpt::cuda_launch
