// models/kernels.cpp: kernels_for(device): the kernel set for a device.
#include "models/kernels.h"

#include "models/kernels/cpu/cpu_kernels.h"

namespace dpt::models {

Kernels& kernels_for(Device device) {
  static CpuKernels cpu;  // stateless
  if (device.is_cpu()) return cpu;
  DPT_THROW(UnsupportedError, "no kernels for device {} in this build", device.str());
}

}  // namespace dpt::models
