// models/layers.h: the leaf modules, each with explicit forward and backward on a kernel set (Linear, Conv2d,
// BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d), and the softmax cross-entropy loss.
//
// Layers never branch on the device: they call the Kernels they are given. Activations are NCHW.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels/kernels.h"
#include "models/module.h"

namespace dpt::models {

// y = x W^T + b (PyTorch's layout: W is [out, in]), optionally followed by ReLU fused into the bias pass; without a
// bias (nn.Linear(bias=False): Llama's projections) y = x W^T and the module has the weight alone.
// Any input [n, ...] of in_features values per example is read as [n, in] (flattened, as nn.Flatten).
class Linear final : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool relu = false, bool bias = true);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  // PyTorch's default: W and b ~ U(-1/sqrt(in), 1/sqrt(in)); after set_normal_init(std): W ~ N(0, std), b = 0
  // (GPT-2's initialisation).
  void init_params(std::mt19937_64& rng) override;
  void set_normal_init(float stddev) { normal_std_ = stddev; }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return bias_; }
  bool writes_fresh_grads() const override { return true; }
  const Tensor& weight16() const { return w16_; }  // the bf16 copy of the weight (undefined off the fast path)
  void bind_bf16(std::vector<Tensor> params16) override;
  // On bf16 input (the transformer fast path): y = GELU(x W^T + b) in the matmul's epilogue, the pre-activation kept
  // for backward (the GELU module after this layer is then not called: GptMlp). Float32 input is unaffected.
  void fuse_gelu_bf16(bool on) { fuse_gelu_ = on; }
  // The bf16 fast path's GELU between fc (with fuse_gelu_bf16) and proj, the Linear after it (a GPT's MLP): proj's
  // input gradient comes out of its matmul already through GELU's gradient (the DGelu epilogue, reading fc's
  // pre-activation: one rounding, not two, and no pass of its own), and fc takes the gradient it gets as its
  // pre-activation's. Float32 input is unaffected.
  static void chain_gelu_bf16(Linear& fc, Linear& proj);
  // On bf16 input: write the output into columns [col0, col0 + out_features) of `packed` (bf16 [batch, width], which
  // the caller sizes before each forward; forward returns it), and read the gradient from the same columns of the
  // [batch, width] tensor backward gets: projections of one input side by side in one buffer without copies
  // (LlamaAttention's q, k and v in the rows the fused attention reads). nullptr: an output of its own. Float32 input
  // is unaffected.
  void pack_bf16_output(Tensor* packed, int64_t col0) {
    packed_ = packed;
    packed_col0_ = col0;
  }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t in_, out_;
  bool relu_;
  bool bias_;
  bool fuse_gelu_ = false;
  const Tensor* dgelu_pre_ = nullptr;  // chain_gelu_bf16's proj: the pre-activation its input gradient goes through
  bool grad_is_pre_ = false;           // chain_gelu_bf16's fc: a bf16 gradient is its pre-activation's already
  Tensor* packed_ = nullptr;  // pack_bf16_output
  int64_t packed_col0_ = 0;
  float normal_std_ = 0.0f;  // > 0: N(0, normal_std_) weights and zero biases
  Tensor w_, b_, dw_, db_;
  Tensor w16_, b16_;  // the bf16 copies (bind_bf16)
  Tensor x_;  // the input of the last forward (a handle, not a copy)
  std::vector<int64_t> x_shape_;
  Tensor y_, dpre_, dx_;
  Tensor pre16_;  // bf16 + fuse_gelu: the pre-activation
  // The bf16 forms: x W^T + b through matmul_bf16 (bias, or bias + GELU, in its epilogue); backward dW and db in one
  // matmul (its bias-gradient epilogue), dx in another.
  const Tensor& forward_bf16(const Tensor& x, Kernels& k);
  const Tensor& backward_bf16(const Tensor& dy, Kernels& k);
};

// 2-D convolution without bias (torchvision's ResNets have none): weight [out, in, k, k].
class Conv2d final : public Module {
 public:
  enum class Init { PyTorchDefault, KaimingNormalFanOut };
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         Init init = Init::PyTorchDefault);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  // PyTorchDefault: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform_ with a = sqrt(5));
  // KaimingNormalFanOut: N(0, 2 / fan_out) (torchvision's ResNet: kaiming_normal_, mode fan_out, relu).
  void init_params(std::mt19937_64& rng) override;
  // The output shape for an input [n, c, h, w]; ConfigError when it would be empty.
  ConvShape shape_for(const std::vector<int64_t>& x) const;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t in_, out_, kernel_, stride_, pad_;
  Init init_;
  Tensor w_, dw_;
  Tensor x_, y_, dx_;
  ConvShape cs_;
};

// Batch normalisation over the channels of NCHW activations (PyTorch's BatchNorm2d: eps 1e-5, momentum 0.1,
// affine, tracking running statistics). Training mode normalises with the batch's statistics and moves the
// running ones; evaluation mode uses the running ones. With set_sync(), the batch statistics and the input
// gradient's sums are summed across ranks first (SyncBatchNorm): the same kernels, one all-reduce each way.
class BatchNorm2d final : public Module {
 public:
  // Sums `sums` (doubles on the activations' device) in place across the ranks, ordered with the kernel
  // set's stream; set by the trainer (models never talk to a process group themselves).
  using AllReduceSum = std::function<void(Tensor& sums)>;

  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override;
  std::vector<BufferSpec> buffer_specs() const override;
  std::vector<Counter> counters() override { return {{"num_batches_tracked", &num_batches_tracked_}}; }
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  // weight = 1, bias = 0 (buffers: running_mean 0, running_var 1).
  void init_params(std::mt19937_64& rng) override;
  void set_sync(AllReduceSum sum) { sync_ = std::move(sum); }
  bool synced() const { return static_cast<bool>(sync_); }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t channels_;
  float eps_, momentum_;
  int64_t num_batches_tracked_ = 0;
  AllReduceSum sync_;
  Tensor gamma_, beta_, dgamma_, dbeta_, running_mean_, running_var_;
  Tensor x_, y_, dx_, save_mean_, save_invstd_, sums_;
  BnShape bs_;
};

class ReLU final : public Module {
 public:
  std::string kind() const override { return "ReLU"; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  Tensor y_, dx_;
};

class MaxPool2d final : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);
  std::string kind() const override;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t kernel_, stride_, pad_;
  PoolShape ps_;
  Tensor y_, argmax_, dx_;
};

// AdaptiveAvgPool2d((1, 1)): [n, c, h, w] -> [n, c, 1, 1], the mean of each plane.
class AdaptiveAvgPool2d final : public Module {
 public:
  std::string kind() const override { return "AdaptiveAvgPool2d(1)"; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  std::vector<int64_t> x_shape_;
  Tensor y_, dx_;
};

// A norm whose backward can also add the gradient of a residual stream around it (a transformer block's
// x + f(norm(x))): backward_add(dy, residual) = backward(dy) + residual, in the norm's input-gradient buffer; with
// bf16 activations inside the norm's one pass (the sum rounded once: the kernels' `residual`), in float32 the backward
// then Kernels::add (add_residual). LayerNorm, and the Llama family's RmsNorm.
class ResidualNorm : public Module {
 public:
  // The norm of sum = a + b (add_bf16's, or add()'s in float32), sum grown to a's shape and dtype and kept by the
  // caller as the residual stream; the norm saves it as its input. b: a's shape and dtype. With bf16 activations
  // the add is inside the norm's pass where the kernel set fuses them (Kernels::add_layernorm_forward_bf16,
  // add_rmsnorm_forward_bf16: the same bits as the two calls). The hooks run as for forward (Module::forward).
  const Tensor& forward_add(const Tensor& a, const Tensor& b, Tensor& sum, Kernels& k);
  // residual: dy's shape and dtype. The hooks run as for backward (Module::backward).
  const Tensor& backward_add(const Tensor& dy, const Tensor& residual, Kernels& k);

 protected:
  // forward_add's addend and sum while its forward runs, else null: the input x is then the first summand.
  struct PendingAdd {
    const Tensor* b = nullptr;
    Tensor* sum = nullptr;
  };
  const PendingAdd& pending_add() const { return add_; }
  // backward_add's residual while its backward runs, else null.
  const BFloat16* residual_bf16() const { return residual_ ? residual_->data<BFloat16>() : nullptr; }
  // dx += the residual in float32, when backward_add gave one (the sum add() made before the fused form).
  void add_residual(Tensor& dx, Kernels& k) const;

 private:
  PendingAdd add_;
  const Tensor* residual_ = nullptr;
};

// A pre-norm transformer block, x -> r1 = x + f(norm1(x)) -> y = r1 + g(norm2(r1)) (GptBlock, LlamaBlock), whose
// residual stream the fast path hands to the next block without the sum at its end (run_handing_off): block i returns
// r1 and keeps g's output m as output_addend(); block i+1's first norm makes its input x = r1 + m inside its pass
// (ResidualNorm::forward_add, fused by the GPU set), and the final norm does the same after the last block. The same
// bits as the sums made apart (the kernels' contract); one pass over the stream less per block. The backward is
// unchanged: the gradient of a sum reaches both summands as it is.
class ResidualBlock : public Module {
 public:
  // For the next forward only: its input is x + *input_addend (made by the first norm into this block's buffer;
  // null: x itself), and with defer_output it returns r1, leaving m as output_addend() for the caller to add.
  void hand_off(const Tensor* input_addend, bool defer_output);
  const Tensor* output_addend() const { return out_addend_; }

 protected:
  // run_forward's parts: the first norm of the block's input (x, or x plus the handed-off addend: input() after),
  // and the block's output r1_ + m (or r1_ itself, deferring).
  const Tensor& first_norm(ResidualNorm& norm, const Tensor& x, Kernels& k);
  const Tensor& input() const;
  const Tensor& output(const Tensor& m, Kernels& k);
  // The output's shape, for run_backward's check (y_ stays empty while deferring).
  const std::vector<int64_t>& output_shape() const { return r1_.shape(); }
  Tensor r1_;

 private:
  const Tensor* in_addend_ = nullptr;
  bool defer_ = false, deferring_ = false;  // hand_off's; this forward's
  const Tensor* out_addend_ = nullptr;
  const Tensor* input_ = nullptr;
  Tensor x_sum_, y_;
};

// The blocks of `blocks` (ResidualBlocks, at least one) on x with the residual stream handed from block to block,
// then `final_norm` of the last block's output, made in its pass into `sum`. The blocks' hooks run as in forward.
const Tensor& run_handing_off(Module& blocks, const Tensor& x, ResidualNorm& final_norm, Tensor& sum, Kernels& k);
// A transformer's blocks then its final norm: handing off (run_handing_off) or each block making its own output sum
// (`sum` then released: held by nothing else once the norm runs).
const Tensor& run_blocks(Module& blocks, const Tensor& x, ResidualNorm& final_norm, Tensor& sum, bool hand_off,
                         Kernels& k);

// Layer normalisation over the last dimension (nn.LayerNorm(C): eps 1e-5, weight 1, bias 0): any input whose
// last dimension is C, read as [rows, C]; the output has the input's shape.
class LayerNorm final : public ResidualNorm {
 public:
  explicit LayerNorm(int64_t channels, float eps = 1e-5f);
  std::string kind() const override;
  std::vector<ParamSpec> param_specs() const override { return {{"weight", {c_}}, {"bias", {c_}}}; }
  void bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) override;
  void init_params(std::mt19937_64& rng) override;
  bool writes_fresh_grads() const override { return true; }

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  int64_t c_;
  float eps_;
  Tensor gamma_, beta_, dgamma_, dbeta_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

// GELU with the tanh approximation (GPT-2's; nn.GELU(approximate="tanh")), elementwise, any shape.
class Gelu final : public Module {
 public:
  std::string kind() const override { return "GELU(tanh)"; }
  // Activation recomputation: the output goes into `*storage` (grown as needed), which other layers share, so
  // it is not kept per layer; recompute() writes this layer's output there again before a backward that
  // needs it (the next layer's saved input is a view of that storage). nullptr: an output of its own.
  void share_output(Tensor* storage) { shared_ = storage; }
  void recompute(Kernels& k);

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  Tensor x_, y_, dx_;
  Tensor* shared_ = nullptr;
};

// `view` becomes a view of shape `shape` at the start of `storage`, which grows (is replaced) when it is smaller
// than that or on another device: scratch that several layers use in turn.
void shared_view(Tensor& view, Tensor& storage, const std::vector<int64_t>& shape, Device device);

struct LossResult {
  double loss_sum = 0.0;  // summed over the batch
  int64_t correct = 0;
  int64_t count = 0;       // the targets counted: the batch's rows but those labelled kIgnoreLabel
};

// Mean softmax cross-entropy over a batch. The backward variants also leave d(mean loss)/d(logits) in grad(). A row
// labelled kIgnoreLabel (a masked target) adds no loss and no gradient, and the means differ: the reported loss
// (LossResult, stats[0] / stats[2]) is over the counted targets, the gradient divides by every row (so ranks with
// different shares of masked rows still add up to the whole batch's gradient).
class SoftmaxCrossEntropy {
 public:
  // The training step's form: no host synchronisation. `stats` (F64 [3], on the logits' device) gets
  // stats[0] += summed loss, stats[1] += correct predictions, stats[2] += the targets counted (rows not labelled
  // kIgnoreLabel: a masked token's row adds nothing). With backward, grad() is d(mean loss)/d(logits) times
  // grad_scale (gradient accumulation's share of the step's rows, fp16's loss scale). bf16 logits (the transformer fast
  // path: a Gpt's or a Llama's with bf16 activations) go through the fused classifier, which overwrites them in place with that
  // gradient: grad() is then the logits tensor itself.
  void accumulate(const Tensor& logits, const Tensor& labels, Kernels& k, Tensor& stats, bool backward,
                  double grad_scale = 1.0);
  // Synchronous forms returning the batch's result to the host.
  LossResult forward(const Tensor& logits, const Tensor& labels, Kernels& k);
  LossResult forward_backward(const Tensor& logits, const Tensor& labels, Kernels& k);
  const Tensor& grad() const { return dlogits_; }

 private:
  LossResult run(const Tensor& logits, const Tensor& labels, Kernels& k, bool backward);
  Tensor dlogits_, stats_;
};

}  // namespace dpt::models
