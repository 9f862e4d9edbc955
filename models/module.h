// models/module.h: Module, the node of a model's tree (a layer, a residual block, a whole network), and
// Sequential.
//
// A module declares the parameters and buffers it owns itself (param_specs, buffer_specs); its children are
// modules registered by name in forward order. The Model walks the tree, names everything with dotted paths
// ("layer1.0.conv1.weight": PyTorch's state_dict names), allocates every parameter inside one flat parameter
// buffer, every gradient inside one flat gradient buffer and every buffer (BatchNorm running statistics)
// inside one flat buffer of buffers, and binds views of them into the modules.
//
// forward() and backward() are the public, non-virtual entry points; modules implement run_forward and
// run_backward. backward() ACCUMULATES parameter gradients (+=), so gradient accumulation over micro-batches
// is free, and calls the module's grads-ready hook (set by the Model) as soon as the module's own parameter
// gradients are complete: the point a bucketed all-reduce starts from. The exception: a backward with fresh grads
// (set_fresh_grads, the transformer fast path's first backward after Model::zero_grad, which then leaves the gradients
// as they were, as PyTorch's zero_grad(set_to_none=True)) writes each of its own parameters' gradients in full.
// Outputs and saved activations are kept between steps and reallocated only when a shape changes.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels/kernels.h"

namespace dpt::models {

struct ParamSpec {
  std::string name;  // within the module: "weight", "bias"
  std::vector<int64_t> shape;
};

// A non-trainable float tensor: part of the model's state (checkpointed, broadcast from rank 0 at the
// start), not of its gradients. Starts at `init` in every element.
struct BufferSpec {
  std::string name;  // "running_mean"
  std::vector<int64_t> shape;
  float init = 0.0f;
};

// A host-side int64 scalar of the state (BatchNorm's num_batches_tracked): checkpointed as a 0-dimensional
// int64 tensor, as PyTorch keeps it.
struct Counter {
  std::string name;
  int64_t* value;
};

class Module {
 public:
  virtual ~Module() = default;
  virtual std::string kind() const = 0;  // "Conv2d(3, 64, 7, stride 2)", ...

  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual std::vector<BufferSpec> buffer_specs() const { return {}; }
  virtual std::vector<Counter> counters() { return {}; }
  // Views of this module's own parameters, gradients and buffers, in the order of the specs.
  virtual void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) {}
  // The transformer fast path (Model::set_bf16_activations): views of this module's own parameters in the model's
  // bf16 copy of them, in param_specs order (empty: the fast path is off). The modules whose bf16 forward multiplies
  // by a weight keep them: cuBLASLt's bf16 matmuls read these, the float32 masters stay what the optimizer updates.
  virtual void bind_bf16(std::vector<Tensor> params16) {}
  // Draws this module's own parameters (on the host) from `rng`; the Model calls it in tree order.
  virtual void init_params(std::mt19937_64& rng) {}

  // Returns the output; the reference stays valid until the next forward().
  const Tensor& forward(const Tensor& x, Kernels& k);
  // Given d(loss)/d(output), accumulates parameter gradients and returns d(loss)/d(input), or an undefined
  // tensor when the module was told its input needs no gradient (the network's first layer).
  const Tensor& backward(const Tensor& dy, Kernels& k);

  // Training mode (the default) or evaluation mode, for this module and all below it (BatchNorm's batch vs
  // running statistics).
  void set_training(bool training);
  bool training() const { return training_; }
  // The transformer fast path for this module and all below it: in training mode, activations pass between the
  // layers in bf16 (a module tells the mode by its input's dtype). Only a root whose supports_bf16_activations()
  // says so runs it (Model::set_bf16_activations checks).
  void set_bf16_activations(bool on);
  bool bf16_activations() const { return bf16_; }
  virtual bool supports_bf16_activations() const { return false; }
  // Fresh grads, for this module and all below it: the next backward writes (=) each own parameter's gradient in
  // full instead of adding to it, or zeroes it before adding; whatever the gradient buffer held is never read. Only
  // the Model sets it, for the first backward after a zero_grad that skipped its pass, and only when every module
  // with parameters writes_fresh_grads().
  void set_fresh_grads(bool on);
  bool fresh_grads() const { return fresh_grads_; }
  // Whether this module's backward honours set_fresh_grads for its own parameters (a module without parameters need
  // not say).
  virtual bool writes_fresh_grads() const { return false; }
  // false: backward need not compute d(loss)/d(input) (the first layer: nobody needs it).
  virtual void set_needs_input_grad(bool needed) { needs_input_grad_ = needed; }
  bool needs_input_grad() const { return needs_input_grad_; }

  const std::vector<std::pair<std::string, Module*>>& children() const { return child_views_; }
  // Called by backward() once this module's own parameter gradients are complete (the Model sets it).
  void set_grads_ready_hook(std::function<void()> hook) { grads_ready_ = std::move(hook); }
  // Called around run_forward and run_backward (the Model sets them; Model::ParamHooks): ZeRO makes this module's
  // parameters (stage 3) and gradient storage (stage 2) resident before, and may release them after.
  struct Hooks {
    std::function<void()> before_forward, after_forward, before_backward, after_backward;
  };
  void set_hooks(Hooks hooks) { hooks_ = std::move(hooks); }
  // The module whose own parameters this one's forward and backward also read and write, or nullptr: a tied
  // weight (the GPT's LM head is the transformer's token embedding). Its hooks then cover those parameters too.
  virtual const Module* uses_params_of() const { return nullptr; }

 protected:
  virtual const Tensor& run_forward(const Tensor& x, Kernels& k) = 0;
  virtual const Tensor& run_backward(const Tensor& dy, Kernels& k) = 0;

  // Registers a child (forward order = parameter order) and returns it.
  template <class M>
  M* add(std::string name, std::unique_ptr<M> child) {
    M* raw = child.get();
    child_views_.emplace_back(std::move(name), raw);
    children_.push_back(std::move(child));
    return raw;
  }

  bool training_ = true;
  bool bf16_ = false;
  bool fresh_grads_ = false;
  bool needs_input_grad_ = true;
  Tensor none_;  // the undefined tensor backward returns when no input gradient is needed

 private:
  std::vector<std::unique_ptr<Module>> children_;
  std::vector<std::pair<std::string, Module*>> child_views_;
  std::function<void()> grads_ready_;
  Hooks hooks_;
};

// Children applied in order. needs_input_grad reaches the first child.
class Sequential : public Module {
 public:
  Sequential() = default;
  // Appends a child named by its index in PyTorch's nn.Sequential ("0", "1", ...), or by `name`.
  template <class M>
  M* append(std::unique_ptr<M> child, std::string name = "") {
    if (name.empty()) name = std::to_string(children().size());
    return add(std::move(name), std::move(child));
  }
  std::string kind() const override;
  void set_needs_input_grad(bool needed) override;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;
};

// Deterministic, portable draws for initialisation (independent of the C++ library's distribution
// implementations, so the same seed gives the same model everywhere): uniform in [lo, hi), and normal.
float uniform(std::mt19937_64& rng, float lo, float hi);
float normal(std::mt19937_64& rng, float mean, float stddev);

// For a module's bind(): checks that `views` holds exactly one tensor per target and assigns them in order
// (the order of its param_specs or buffer_specs): bind_views(params, {&w_, &b_}).
void bind_views(const std::vector<Tensor>& views, std::initializer_list<Tensor*> targets);

// (Re)allocates `t` when its shape, device or dtype differs; returns it.
Tensor& ensure_shape(Tensor& t, const std::vector<int64_t>& shape, Device device, DType dtype = DType::F32);

}  // namespace dpt::models
