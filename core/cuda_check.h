// core/cuda_check.h: DPT_CUDA_CHECK, for sources compiled with the CUDA runtime (DPT_WITH_CUDA builds only).
// A failed call throws DeviceError naming the call, CUDA's error name and message, file:line and the rank.
#pragma once

#include <cuda_runtime_api.h>

#include "core/check.h"

#define DPT_CUDA_CHECK(expr)                                                                                  \
  do {                                                                                                        \
    const cudaError_t dpt_err_ = (expr);                                                                      \
    if (dpt_err_ != cudaSuccess)                                                                              \
      throw ::dpt::DeviceError(::dpt::detail::located(                                                        \
          __FILE__, __LINE__,                                                                                 \
          fmt::format("CUDA error in {}: {}: {}", #expr, cudaGetErrorName(dpt_err_), cudaGetErrorString(dpt_err_)))); \
  } while (0)

// After a kernel launch: a bad launch configuration shows up here, not at the next synchronisation.
#define DPT_CUDA_CHECK_LAUNCH() DPT_CUDA_CHECK(cudaGetLastError())
