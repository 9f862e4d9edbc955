// models/layers.h: layers with explicit forward and backward, and the softmax cross-entropy loss.
//
// A layer declares the parameters it needs (param_specs); the Model allocates them inside its one flat
// parameter buffer (and the gradients inside the flat gradient buffer) and hands the layer views (bind).
// backward() ACCUMULATES parameter gradients (+=), so gradient accumulation over micro-batches is free; the
// Model zeroes the flat gradient buffer once per optimizer step.
// Activation buffers are kept between steps and reallocated only when the batch size changes.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels.h"

namespace dpt::models {

struct ParamSpec {
  std::string name;  // within the layer: "weight", "bias"
  std::vector<int64_t> shape;
};

// Deterministic, portable uniform draws in [lo, hi) for initialisation (independent of the C++ library's
// distribution implementations, so the same seed gives the same model everywhere).
float uniform(std::mt19937_64& rng, float lo, float hi);

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;  // "Linear", ...
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual void bind(std::vector<Tensor> params, std::vector<Tensor> grads) {}
  virtual void init_params(std::mt19937_64& rng) {}
  // Returns the output; the reference stays valid until the next forward().
  virtual const Tensor& forward(const Tensor& x, Kernels& k) = 0;
  // Given d(loss)/d(output), accumulates parameter gradients and returns d(loss)/d(input), or an undefined
  // tensor when the layer was built without an input gradient (the first layer: nobody needs it).
  virtual const Tensor& backward(const Tensor& dy, Kernels& k) = 0;
};

// y = x W^T + b (PyTorch's layout: W is [out, in]), optionally followed by ReLU fused into the bias pass.
class Linear final : public Layer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool relu, bool needs_input_grad);
  std::string kind() const override { return relu_ ? "Linear+ReLU" : "Linear"; }
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads) override;
  // PyTorch's default: W and b ~ U(-1/sqrt(in), 1/sqrt(in)).
  void init_params(std::mt19937_64& rng) override;
  const Tensor& forward(const Tensor& x, Kernels& k) override;
  const Tensor& backward(const Tensor& dy, Kernels& k) override;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  bool relu_, needs_input_grad_;
  Tensor w_, b_, dw_, db_;
  Tensor x_;          // the input of the last forward (a handle, not a copy)
  Tensor y_, dpre_, dx_, none_;
};

struct LossResult {
  double loss_sum = 0.0;  // summed over the batch
  int64_t correct = 0;
  int64_t count = 0;
};

// Mean softmax cross-entropy over a batch. The backward variants also leave d(mean loss)/d(logits) in grad().
class SoftmaxCrossEntropy {
 public:
  // The training step's form: no host synchronisation. `stats` (F64 [2], on the logits' device) gets
  // stats[0] += summed loss, stats[1] += correct predictions.
  void accumulate(const Tensor& logits, const Tensor& labels, Kernels& k, Tensor& stats, bool backward);
  // Synchronous forms returning the batch's result to the host.
  LossResult forward(const Tensor& logits, const Tensor& labels, Kernels& k);
  LossResult forward_backward(const Tensor& logits, const Tensor& labels, Kernels& k);
  const Tensor& grad() const { return dlogits_; }

 private:
  LossResult run(const Tensor& logits, const Tensor& labels, Kernels& k, bool backward);
  Tensor dlogits_, stats_;
};

// (Re)allocates `t` when its shape differs from `shape`; returns it.
Tensor& ensure_shape(Tensor& t, const std::vector<int64_t>& shape, Device device, DType dtype = DType::F32);

}  // namespace dpt::models
