// models/kernels/smem_limits.h: which kernels' dynamic shared memory limits the CUDA set has raised, so that it
// calls cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) once per device, kernel and
// larger size, not before every launch (a host call into the driver: the fused LayerNorm backward at 776-1024
// columns made one per call). Pure bookkeeping with no CUDA header (cuda/common.cuh's allow_dynamic_smem calls the
// driver and holds the mutex), tested on the CPU (tests/unit/models/test_fast_path_kernels.cpp).
//
// The attribute is per function and device context and outlives the launch; it is a limit, not a reservation: a
// launch with fewer bytes than the limit runs as under a limit of its own size. So the limit only ever rises: a
// smaller request after a larger one needs nothing, and lowering it would fail the larger one's next launch.
#pragma once

#include <cstddef>
#include <map>
#include <utility>

namespace dpt::models {

class SmemLimits {
 public:
  // What every kernel may use without the attribute.
  static constexpr size_t kDefaultBytes = 48 * 1024;
  // Whether a launch of `kernel` on `device` with `bytes` of dynamic shared memory must raise its limit first.
  bool needs_raise(int device, const void* kernel, size_t bytes) const {
    if (bytes <= kDefaultBytes) return false;
    const auto it = raised_.find({device, kernel});
    return it == raised_.end() || it->second < bytes;
  }
  // After cudaFuncSetAttribute raised it to `bytes` (only after it succeeded: a failed raise is tried again).
  void raised(int device, const void* kernel, size_t bytes) {
    size_t& limit = raised_[{device, kernel}];
    if (bytes > limit) limit = bytes;
  }

 private:
  std::map<std::pair<int, const void*>, size_t> raised_;
};

}  // namespace dpt::models
