// models/model.h: Model: a tree of modules over one flat parameter buffer, one flat gradient buffer and one
// flat buffer of buffers (non-trainable state such as BatchNorm's running statistics).
//
// Names are the dotted paths of PyTorch's state_dict ("layers.0.weight" for the MLP, "layer1.0.conv1.weight",
// "bn1.running_mean", "bn1.num_batches_tracked" for a ResNet), so checkpoints load into the equivalent torch
// module and torch weights load here. The data-parallel strategy, the optimizer and the checkpoint each see params(),
// grads() and buffers() as one contiguous array; parameters are laid out in tree order (a module's own, then
// its children's, in registration order = forward order).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels/kernels.h"
#include "models/layers.h"
#include "models/module.h"

namespace dpt::models {

struct NamedParam {
  std::string name;   // "layers.0.weight"
  Tensor param;       // view into params()
  Tensor grad;        // view into grads()
  size_t offset = 0;  // element offset in the flat buffers
};

class Model {
 public:
  // Walks `root`, allocates the flat buffers on `device`. `name` heads summary() ("mlp 784-512-512-10").
  Model(std::unique_ptr<Module> root, std::string name, Device device);

  // Deterministic initialisation from the seed (same seed, same parameters, on every rank and machine);
  // buffers to their initial values, counters to 0.
  void init(uint64_t seed);
  const Tensor& forward(const Tensor& x);
  // `grads_ready(first, end)` is called as soon as backward has finished the gradients of named_params()
  // [first, end) (one module's own), in backward order: the hook a bucketed all-reduce starts from.
  using GradsReady = std::function<void(size_t first, size_t end)>;
  // Returns d(loss)/d(input), undefined when the first layer was built without it (every built-in model).
  const Tensor& backward(const Tensor& dlogits, const GradsReady& grads_ready = {});
  // Zeroes the gradients; or, training on the transformer fast path with whole gradients (not split_grads) where
  // every module with parameters writes_fresh_grads(), leaves them as they are and has the next backward write them
  // (Module::set_fresh_grads: PyTorch's zero_grad(set_to_none=True)), so that a step makes no pass of its own over
  // them (0.5 GB for GPT-2 124M), the weight gradients' products read nothing, and the bias gradients come straight
  // from cuBLASLt's epilogue. Until that backward grads() holds what it held: nothing may read it in between.
  void zero_grad();
  // Whether zero_grad may leave the gradients to the next backward (the default); off, it always zeroes them (the
  // tests compare the two).
  void set_fresh_grads_allowed(bool on) { fresh_allowed_ = on; }
  // Whether the last zero_grad left the gradients to the next backward, which has not run yet.
  bool fresh_grads_pending() const { return fresh_pending_; }
  // What ZeRO hangs on the passes (stages 2 and 3). The per-module hooks are called with named_params() [first, end):
  // the module's own parameters, or those of the module it uses_params_of() (a tied weight), for every module that
  // has either (hook_ranges() lists them, in tree order): before and after its forward, before its backward writes
  // gradients and after it is done. The pass hooks bracket Model::forward and Model::backward. Persistent; empty
  // functions are skipped.
  struct ParamHooks {
    std::function<void(size_t first, size_t end)> before_forward, after_forward, before_backward, after_backward;
    std::function<void()> forward_begin, forward_end, backward_begin, backward_end;
  };
  void set_param_hooks(ParamHooks hooks) { hooks_ = std::move(hooks); }
  const std::vector<std::pair<size_t, size_t>>& hook_ranges() const { return hook_ranges_; }
  // Gives the gradients of each range [first, end) of named_params() its own flat tensor (own storage, zeroed),
  // returned in the order of `ranges`; the ranges must cover every parameter exactly once, each contiguous. Every
  // NamedParam::grad and module view moves there, and grads() is undefined from then on (zero_grad() zeroes the
  // resident ones): ZeRO stage 2 releases and reserves these storages bucket by bucket. Once; to() is refused after.
  std::vector<Tensor> split_grads(const std::vector<std::pair<size_t, size_t>>& ranges);
  // The same for the parameters (their values copied over): params() is undefined from then on; ZeRO stage 3.
  std::vector<Tensor> split_params(const std::vector<std::pair<size_t, size_t>>& ranges);
  // Where the parameters live, in offset order: params() itself, or the parts of split_params().
  std::vector<Tensor> param_storage() const { return param_parts_.empty() ? std::vector<Tensor>{params_} : param_parts_; }
  bool grads_split() const { return !grad_parts_.empty(); }
  bool params_split() const { return !param_parts_.empty(); }
  // The arithmetic of the GEMM-class layers (train.precision), applied to the kernel set at every forward and
  // backward; throws UnsupportedError when this model's kernel set cannot compute in it.
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  // train.deterministic (Kernels::set_deterministic), kept here and applied to the kernel set at every forward and
  // backward like the precision: the set is shared by the device's models, and a move changes the set.
  void set_deterministic(bool on);
  bool deterministic() const { return deterministic_; }
  // The transformer fast path (train.bf16_activations): in training mode the activations pass between the layers in
  // bf16, the matmuls (cuBLASLt on a GPU) read a bf16 copy of the parameters that each training forward refreshes
  // from params() (one rounding pass), and the loss takes bf16 logits (the fused classifier); parameters,
  // gradients and optimizer state stay float32, and evaluation runs the float32 path. Needs a root that supports it
  // (the GPT) and whole parameters (not split_params: ZeRO stage 3): UnsupportedError otherwise.
  void set_bf16_activations(bool on);
  bool bf16_activations() const { return bf16_; }
  // The bf16 copy of params() (undefined when the fast path is off), as of the last training forward.
  const Tensor& params16() const { return params16_; }
  // For an update that writes the bf16 copy along with params() (the optimizer's fused AdamW, which rounds each
  // updated value as the forward's pass would: the same bits): the copy's data, nullptr off the fast path. Once it
  // has written the whole copy, params16_written(): the next training forward then skips its rounding pass (a read
  // of params() and a write of the copy: about 0.75 GB for GPT-2 124M). That forward only; and mutable params(),
  // to(), load_state() and params_written() drop it first, so nothing else that changes the parameters can hide
  // behind a stale copy.
  BFloat16* params16_data() { return params16_.defined() ? params16_.data<BFloat16>() : nullptr; }
  void params16_written() { params16_current_ = params16_.defined(); }
  // A write into the parameters through views taken earlier (param_storage(), named_params(), ZeRO's pieces): the
  // next training forward rounds them afresh.
  void params_written() { params16_current_ = false; }
  bool params16_current() const { return params16_current_; }
  // How many training forwards rounded params() into the bf16 copy (the others used an update's): tests, benches.
  int64_t params16_roundings() const { return params16_roundings_; }
  // Training (batch statistics) or evaluation (running statistics) mode; training is the default.
  void set_training(bool training) { root_->set_training(training); }
  // Moves parameters and buffers to `device` (gradients start at zero there); modules are rebound.
  void to(Device device);
  // SyncBatchNorm: every BatchNorm2d sums its statistics across ranks with `sum` (nullptr: plain BatchNorm).
  // Returns how many BatchNorm layers it reached.
  size_t set_batch_norm_sync(const BatchNorm2d::AllReduceSum& sum);

  Tensor& params() {  // mutable: whatever writes through it, the bf16 copy is rounded afresh (params16_written)
    params_written();
    return params_;
  }
  Tensor& grads() { return grads_; }
  Tensor& buffers() { return buffers_; }  // empty (numel 0) when the model has none
  const Tensor& params() const { return params_; }
  const Tensor& buffers() const { return buffers_; }
  const std::vector<NamedParam>& named_params() const { return named_; }
  const std::vector<NamedTensor>& named_buffers() const { return named_buffers_; }
  size_t num_params() const { return num_params_; }
  Device device() const { return device_; }
  Kernels& kernels() const { return *kernels_; }
  // Runs the model on `k` from now on (forward, backward, the optimizer's step): a set for the model's device
  // wrapping its own, as TimedKernels does for dpt-model-bench's per-operation breakdown. set_kernels(
  // kernels_for(device())) goes back; so does moving the model. `k` must outlive its use here.
  void set_kernels(Kernels& k);
  std::string summary() const;  // "mlp 784-512-512-10: 669706 parameters"
  // The module tree (to ask a model's own options: dynamic_cast<const Gpt*>(&root())).
  const Module& root() const { return *root_; }
  Module& root() { return *root_; }

  // The whole state in state_dict order of names: parameters and buffers (views on the model's device) and
  // counters (fresh 0-dimensional int64 host tensors).
  std::vector<NamedTensor> state() const;
  // Sets the whole state from `find(name)` (any device; shapes must match exactly; counters from int64 or
  // float tensors of one element). Throws CheckpointError naming `source` and the first key that is
  // missing or has another shape or dtype, as `shown(key)` gives it when set (the file's name for it).
  void load_state(const std::function<const Tensor*(const std::string&)>& find, const std::string& source,
                  const std::function<std::string(const std::string&)>& shown = {});

 private:
  struct Owner {  // a module owning parameters, buffers or counters
    Module* module;
    std::string prefix;  // "layer1.0.bn1." ("" for the root)
    size_t first = 0, end = 0;    // its parameters: named_params() [first, end)
    size_t bfirst = 0, bend = 0;  // its buffers: named_buffers() [bfirst, bend)
  };
  // A module using another's parameters (uses_params_of()), and that owner.
  std::vector<std::pair<Module*, const Module*>> tied_;
  std::vector<Tensor> grad_parts_, param_parts_;  // after split_grads(), split_params()
  ParamHooks hooks_;
  std::vector<std::pair<size_t, size_t>> hook_ranges_;
  void rebind(const Owner& o);
  void hook(Module* m, size_t first, size_t end);
  // split_grads and split_params: checks `ranges`, then moves each range's `field` views into a new part.
  std::vector<Tensor> split(const std::vector<std::pair<size_t, size_t>>& ranges, Tensor NamedParam::*field, bool copy);
  std::unique_ptr<Module> root_;
  std::string name_;
  std::vector<Owner> owners_;
  Device device_;
  Kernels* kernels_ = nullptr;
  Tensor params_, grads_, buffers_;
  Tensor params16_;  // the fast path's bf16 copy of params_ (same offsets)
  bool params16_current_ = false;  // params16_ written by an update since the last training forward
  int64_t params16_roundings_ = 0;
  bool bf16_ = false;
  bool fresh_allowed_ = true, fresh_pending_ = false;  // set_fresh_grads_allowed, zero_grad's hand-over
  std::vector<char> fresh_written_;  // during a fresh backward: per owner, whether its grads-ready hook ran
  size_t num_params_ = 0;
  std::vector<NamedParam> named_;
  std::vector<NamedTensor> named_buffers_;
  std::vector<std::pair<std::string, int64_t*>> counters_;
  const GradsReady* grads_ready_ = nullptr;  // during backward()
  Precision precision_ = Precision::F32;
  bool deterministic_ = true;

  void allocate(Device device, int64_t total_params, int64_t total_buffers);
};

// MLP: in -> hidden[0] -> ReLU -> ... -> classes. Names follow a module holding nn.Sequential(Linear, ReLU,
// ...) as `layers`: layers.0, layers.2, ...
std::unique_ptr<Model> make_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes,
                                Device device = Device::cpu());

}  // namespace dpt::models
