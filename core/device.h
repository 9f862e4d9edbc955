// core/device.h: where memory and kernels live: the CPU, or one GPU. Below the tensors (core/tensor.h) and the memory
// accounting (core/memory.h), which both name devices.
#pragma once

#include <cstdint>
#include <string>

namespace dpt {

struct Device {
  enum class Kind : uint8_t { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::CUDA, index}; }
  bool is_cpu() const { return kind == Kind::CPU; }
  bool is_cuda() const { return kind == Kind::CUDA; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }  // "cpu" or "cuda:N"
  bool operator==(const Device&) const = default;
};

}  // namespace dpt
