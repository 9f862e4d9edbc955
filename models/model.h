// models/model.h: Model: a sequence of layers over one flat parameter buffer and one flat gradient buffer.
//
// Parameters are laid out in layer order ("layers.0.weight", "layers.0.bias", "layers.2.weight", ...: the
// names PyTorch gives an nn.Sequential held as `layers`, so checkpoints load into the equivalent torch
// module). The Reducer, the optimizer and the checkpoint each see params()/grads() as one contiguous array.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels.h"
#include "models/layers.h"

namespace dpt::models {

struct NamedParam {
  std::string name;  // "layers.0.weight"
  Tensor param;      // view into params()
  Tensor grad;       // view into grads()
  size_t offset = 0;  // element offset in the flat buffers
};

class Model {
 public:
  // `names[i]` is layer i's prefix ("layers.0"). Allocates the flat buffers on `device`.
  Model(std::vector<std::unique_ptr<Layer>> layers, std::vector<std::string> names, Device device);

  // Deterministic initialisation from the seed (same seed, same parameters, on every rank and machine).
  void init(uint64_t seed);
  const Tensor& forward(const Tensor& x);
  // `grads_ready(first, end)` is called as soon as backward has finished the gradients of named_params()
  // [first, end) (one layer's), last layer first: the hook a bucketed all-reduce starts from.
  using GradsReady = std::function<void(size_t first, size_t end)>;
  void backward(const Tensor& dlogits, const GradsReady& grads_ready = {});
  void zero_grad();
  // Moves parameters to `device` (gradients start at zero there); layers are rebound to the new buffers.
  void to(Device device);

  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& params() const { return params_; }
  const std::vector<NamedParam>& named_params() const { return named_; }
  size_t num_params() const { return params_.numel(); }
  Device device() const { return device_; }
  Kernels& kernels() const { return *kernels_; }
  std::string summary() const;  // "mlp: Linear+ReLU(784->512) ... , 669706 parameters"

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
  Device device_;
  Kernels* kernels_ = nullptr;
  Tensor params_, grads_;
  std::vector<NamedParam> named_;
  std::vector<std::pair<size_t, size_t>> layer_params_;  // layer i's range in named_

  void allocate(Device device, int64_t total);  // flat buffers on `device`, views bound into the layers
};

// MLP: in -> hidden[0] -> ReLU -> ... -> classes. Layer names follow nn.Sequential(Linear, ReLU, ...).
std::unique_ptr<Model> make_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes,
                                Device device = Device::cpu());

}  // namespace dpt::models
