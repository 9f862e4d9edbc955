// models/resnet.h: ResNets as torchvision builds them (BasicBlock, Bottleneck, four stages from block counts),
// plus the small-image variant (a 3x3 stride-1 stem without max pooling, configurable widths and stages).
//
// Parameter and buffer names are torchvision's state_dict names (conv1.weight, bn1.running_mean,
// layer1.0.conv1.weight, layer2.0.downsample.0.weight, fc.bias, ...): they are the interface every
// pretrained file depends on, so torchvision weights load here and our checkpoints load into
// torchvision.models.resnetNN(num_classes=...) with strict=True. Initialisation follows torchvision: convs
// kaiming_normal_(fan_out, relu), BatchNorm weight 1 and bias 0, fc PyTorch's Linear default.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/layers.h"
#include "models/model.h"

namespace dpt::models {

enum class ResNetBlock : uint8_t { basic, bottleneck };  // expansion 1 | 4

struct ResNetOptions {
  ResNetBlock block = ResNetBlock::basic;
  std::vector<int64_t> blocks = {2, 2, 2, 2};  // blocks per stage; the first stage keeps the resolution,
                                               // each later one halves it
  std::vector<int64_t> widths = {64, 128, 256, 512};  // planes per stage (the same count as blocks)
  int64_t in_channels = 3;
  int64_t num_classes = 1000;
  bool small_stem = false;  // conv1 3x3 stride 1 and no max pool (CIFAR-style, for 28x28 / 32x32 images)
};

// torchvision's block counts: 18 and 34 basic, 50 bottleneck. ConfigError for other depths.
ResNetOptions resnet_preset(int64_t depth);

// conv3x3 -> bn -> relu -> conv3x3 -> bn, plus the shortcut (identity, or conv1x1 + bn when the shape
// changes), then relu.
class BasicBlock final : public Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride);
  std::string kind() const override;
  void set_needs_input_grad(bool needed) override;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  Conv2d *conv1_, *conv2_;
  BatchNorm2d *bn1_, *bn2_;
  ReLU* relu_;
  Sequential* downsample_ = nullptr;
  Tensor y_, dsum_, dx_;
};

// conv1x1 -> bn -> relu -> conv3x3 (the stride) -> bn -> relu -> conv1x1 (x4 planes) -> bn, plus the
// shortcut, then relu (torchvision's ResNet v1.5).
class Bottleneck final : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride);
  std::string kind() const override;
  void set_needs_input_grad(bool needed) override;

 protected:
  const Tensor& run_forward(const Tensor& x, Kernels& k) override;
  const Tensor& run_backward(const Tensor& dy, Kernels& k) override;

 private:
  Conv2d *conv1_, *conv2_, *conv3_;
  BatchNorm2d *bn1_, *bn2_, *bn3_;
  ReLU *relu1_, *relu2_;
  Sequential* downsample_ = nullptr;
  Tensor y_, dsum_, dx_;
};

// The whole network; `name` for the summary line ("resnet18"). ConfigError for inconsistent options.
std::unique_ptr<Model> make_resnet(const ResNetOptions& opts, const std::string& name, Device device = Device::cpu());

}  // namespace dpt::models
