// models/kernels/factory.h: kernels_for(device): the kernel set of a device (the CPU set, or the CUDA set of
// one GPU), made on first use and kept for the process.
#pragma once

#include "core/tensor.h"
#include "models/kernels/kernels.h"

namespace dpt::models {

// The kernel set for a device; throws UnsupportedError for a device this build has no kernels for.
Kernels& kernels_for(Device device);

}  // namespace dpt::models
