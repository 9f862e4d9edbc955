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

namespace dpt::cuda {

// After a library refused a call with a status (no exception: a sweep's candidate that cannot run these operands):
// clears the CUDA error the refusal may have left, so that it is not blamed on the next kernel. A sticky error (the
// context is lost, and every later call fails) cannot be cleared: it throws DeviceError naming `what`, so that no
// sweep counts a lost context as a refusal and goes on into the next training step.
inline void clear_refusal(const char* what) {
  (void)cudaGetLastError();
  const cudaError_t sticky = cudaPeekAtLastError();
  if (sticky != cudaSuccess)
    throw DeviceError(fmt::format("{}: CUDA error {}: {} (sticky: the context is lost)", what,
                                  cudaGetErrorName(sticky), cudaGetErrorString(sticky)));
}

}  // namespace dpt::cuda
