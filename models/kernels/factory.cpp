// models/kernels/factory.cpp: kernels_for(device): the kernel set for a device, the one place that knows both
// sets.
#include "models/kernels/factory.h"

#include <map>
#include <memory>
#include <mutex>

#include "models/kernels/cpu/cpu_kernels.h"
#ifdef DPT_WITH_CUDA
#include "models/kernels/cuda/cuda_kernels.h"
#endif

namespace dpt::models {

Kernels& kernels_for(Device device) {
  static CpuKernels cpu;  // stateless
  if (device.is_cpu()) return cpu;
#ifdef DPT_WITH_CUDA
  // One set (stream + cuBLAS handle) per device, created on first use and kept for the process. Never
  // destroyed: tearing down cuBLAS and streams during static destruction, after the CUDA runtime may have
  // unloaded, is a known crash at exit; the process's end releases them.
  static std::mutex mu;
  static auto* sets = new std::map<int, std::unique_ptr<Kernels>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& set = (*sets)[device.index];
  if (!set) set = std::make_unique<CudaKernels>(device.index);
  return *set;
#else
  DPT_THROW(UnsupportedError, "no kernels for device {}: this dptrain was built without CUDA", device.str());
#endif
}

}  // namespace dpt::models
