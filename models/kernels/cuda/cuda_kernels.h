// models/kernels/cuda/cuda_kernels.h: the GPU kernel set: GEMMs through cuBLAS, the rest as the CUDA kernels
// of kernels.cu, all on one non-blocking stream per device. Built only with DPT_WITH_CUDA.
#pragma once

#include <memory>

#include "models/kernels.h"

namespace dpt::models {

// The kernel set of CUDA device `index` (sets that device current). Throws DeviceError when it cannot
// create its stream or cuBLAS handle.
std::unique_ptr<Kernels> make_cuda_kernels(int index);

}  // namespace dpt::models
