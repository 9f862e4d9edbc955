// models/resnet.cpp: BasicBlock, Bottleneck and the ResNet builder.
#include "models/resnet.h"

namespace dpt::models {
namespace {

constexpr auto kConvInit = Conv2d::Init::KaimingNormalFanOut;

// conv1x1 (stride) + BatchNorm: the shortcut when a block changes the shape; nullptr when it does not.
std::unique_ptr<Sequential> make_downsample(int64_t in_planes, int64_t out_planes, int64_t stride) {
  if (stride == 1 && in_planes == out_planes) return nullptr;
  auto ds = std::make_unique<Sequential>();
  ds->append(std::make_unique<Conv2d>(in_planes, out_planes, 1, stride, 0, kConvInit));
  ds->append(std::make_unique<BatchNorm2d>(out_planes));
  return ds;
}

// The tail every block shares: y = relu(main + shortcut) forward; backward splits d(loss)/dy through the
// relu into both branches (shortcut first: its parameters come last in the layout, so its gradients complete
// the first bucket sooner) and sums what they return.
const Tensor& residual_forward(const Tensor& main, const Tensor& x, Sequential* downsample, Tensor& y, Kernels& k) {
  const Tensor& shortcut = downsample ? downsample->forward(x, k) : x;
  DPT_CHECK(main.shape() == shortcut.shape(), "residual branch {} vs shortcut {}", main.shape_str(), shortcut.shape_str());
  ensure_shape(y, main.shape(), main.device());
  k.add(main.data<float>(), shortcut.data<float>(), y.data<float>(), y.numel(), /*relu=*/true);
  return y;
}

template <class MainBackward>
const Tensor& residual_backward(const Tensor& dy, const Tensor& y, Sequential* downsample, bool needs_input_grad,
                                Tensor& dsum, Tensor& dx, Kernels& k, MainBackward main_backward) {
  DPT_CHECK(dy.shape() == y.shape(), "block backward got {}, forward gave {}", dy.shape_str(), y.shape_str());
  ensure_shape(dsum, y.shape(), y.device());
  k.relu_backward(y.data<float>(), dy.data<float>(), dsum.data<float>(), dy.numel());
  const Tensor* dshort = &dsum;
  if (downsample) dshort = &downsample->backward(dsum, k);
  const Tensor& dmain = main_backward(dsum);
  if (!needs_input_grad) return dmain;  // undefined
  ensure_shape(dx, dmain.shape(), dmain.device());
  k.add(dmain.data<float>(), dshort->data<float>(), dx.data<float>(), dx.numel(), /*relu=*/false);
  return dx;
}

}  // namespace

ResNetOptions resnet_preset(int64_t depth) {
  ResNetOptions o;
  switch (depth) {
    case 18: o.blocks = {2, 2, 2, 2}; break;
    case 34: o.blocks = {3, 4, 6, 3}; break;
    case 50: o.blocks = {3, 4, 6, 3}; o.block = ResNetBlock::bottleneck; break;
    default: DPT_THROW(ConfigError, "model.depth = {}: must be 18, 34 or 50 (or give model.blocks)", depth);
  }
  return o;
}

// ---- BasicBlock -----------------------------------------------------------------------------------------

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride) {
  conv1_ = add("conv1", std::make_unique<Conv2d>(in_planes, planes, 3, stride, 1, kConvInit));
  bn1_ = add("bn1", std::make_unique<BatchNorm2d>(planes));
  relu_ = add("relu", std::make_unique<ReLU>());
  conv2_ = add("conv2", std::make_unique<Conv2d>(planes, planes, 3, 1, 1, kConvInit));
  bn2_ = add("bn2", std::make_unique<BatchNorm2d>(planes));
  if (auto ds = make_downsample(in_planes, planes * kExpansion, stride)) downsample_ = add("downsample", std::move(ds));
}

std::string BasicBlock::kind() const {
  return fmt::format("BasicBlock({}{})", conv1_->kind(), downsample_ ? ", downsample" : "");
}

void BasicBlock::set_needs_input_grad(bool needed) {
  needs_input_grad_ = needed;
  conv1_->set_needs_input_grad(needed);
  if (downsample_) downsample_->set_needs_input_grad(needed);
}

const Tensor& BasicBlock::run_forward(const Tensor& x, Kernels& k) {
  const Tensor& h = relu_->forward(bn1_->forward(conv1_->forward(x, k), k), k);
  const Tensor& main = bn2_->forward(conv2_->forward(h, k), k);
  return residual_forward(main, x, downsample_, y_, k);
}

const Tensor& BasicBlock::run_backward(const Tensor& dy, Kernels& k) {
  return residual_backward(dy, y_, downsample_, needs_input_grad_, dsum_, dx_, k, [&](const Tensor& d) -> const Tensor& {
    const Tensor& dh = conv2_->backward(bn2_->backward(d, k), k);
    return conv1_->backward(bn1_->backward(relu_->backward(dh, k), k), k);
  });
}

// ---- Bottleneck -----------------------------------------------------------------------------------------

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride) {
  conv1_ = add("conv1", std::make_unique<Conv2d>(in_planes, planes, 1, 1, 0, kConvInit));
  bn1_ = add("bn1", std::make_unique<BatchNorm2d>(planes));
  conv2_ = add("conv2", std::make_unique<Conv2d>(planes, planes, 3, stride, 1, kConvInit));
  bn2_ = add("bn2", std::make_unique<BatchNorm2d>(planes));
  conv3_ = add("conv3", std::make_unique<Conv2d>(planes, planes * kExpansion, 1, 1, 0, kConvInit));
  bn3_ = add("bn3", std::make_unique<BatchNorm2d>(planes * kExpansion));
  relu1_ = add("relu", std::make_unique<ReLU>());
  relu2_ = add("relu2", std::make_unique<ReLU>());  // torchvision reuses one ReLU; no parameters either way
  if (auto ds = make_downsample(in_planes, planes * kExpansion, stride)) downsample_ = add("downsample", std::move(ds));
}

std::string Bottleneck::kind() const {
  return fmt::format("Bottleneck({}{})", conv2_->kind(), downsample_ ? ", downsample" : "");
}

void Bottleneck::set_needs_input_grad(bool needed) {
  needs_input_grad_ = needed;
  conv1_->set_needs_input_grad(needed);
  if (downsample_) downsample_->set_needs_input_grad(needed);
}

const Tensor& Bottleneck::run_forward(const Tensor& x, Kernels& k) {
  const Tensor& h1 = relu1_->forward(bn1_->forward(conv1_->forward(x, k), k), k);
  const Tensor& h2 = relu2_->forward(bn2_->forward(conv2_->forward(h1, k), k), k);
  const Tensor& main = bn3_->forward(conv3_->forward(h2, k), k);
  return residual_forward(main, x, downsample_, y_, k);
}

const Tensor& Bottleneck::run_backward(const Tensor& dy, Kernels& k) {
  return residual_backward(dy, y_, downsample_, needs_input_grad_, dsum_, dx_, k, [&](const Tensor& d) -> const Tensor& {
    const Tensor& dh2 = conv3_->backward(bn3_->backward(d, k), k);
    const Tensor& dh1 = conv2_->backward(bn2_->backward(relu2_->backward(dh2, k), k), k);
    return conv1_->backward(bn1_->backward(relu1_->backward(dh1, k), k), k);
  });
}

// ---- the network ----------------------------------------------------------------------------------------

std::unique_ptr<Model> make_resnet(const ResNetOptions& o, const std::string& name, Device device) {
  if (o.blocks.empty() || o.blocks.size() != o.widths.size())
    DPT_THROW(ConfigError, "resnet: {} stage(s) of blocks but {} width(s); give one width per stage", o.blocks.size(),
              o.widths.size());
  for (size_t i = 0; i < o.blocks.size(); ++i)
    if (o.blocks[i] < 1 || o.widths[i] < 1)
      DPT_THROW(ConfigError, "resnet: stage {} has {} block(s) of width {}; both must be >= 1", i + 1, o.blocks[i],
                o.widths[i]);
  if (o.in_channels < 1 || o.num_classes < 1)
    DPT_THROW(ConfigError, "resnet: in_channels {} and num_classes {} must be >= 1", o.in_channels, o.num_classes);
  const bool bottleneck = o.block == ResNetBlock::bottleneck;
  const int64_t expansion = bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;

  auto net = std::make_unique<Sequential>();
  const int64_t stem = o.widths[0];
  if (o.small_stem) {
    net->append(std::make_unique<Conv2d>(o.in_channels, stem, 3, 1, 1, kConvInit), "conv1");
  } else {
    net->append(std::make_unique<Conv2d>(o.in_channels, stem, 7, 2, 3, kConvInit), "conv1");
  }
  net->append(std::make_unique<BatchNorm2d>(stem), "bn1");
  net->append(std::make_unique<ReLU>(), "relu");
  if (!o.small_stem) net->append(std::make_unique<MaxPool2d>(3, 2, 1), "maxpool");
  int64_t in_planes = stem;
  for (size_t s = 0; s < o.blocks.size(); ++s) {
    auto stage = std::make_unique<Sequential>();
    for (int64_t b = 0; b < o.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      if (bottleneck) {
        stage->append(std::make_unique<Bottleneck>(in_planes, o.widths[s], stride));
      } else {
        stage->append(std::make_unique<BasicBlock>(in_planes, o.widths[s], stride));
      }
      in_planes = o.widths[s] * expansion;
    }
    net->append(std::move(stage), fmt::format("layer{}", s + 1));
  }
  net->append(std::make_unique<AdaptiveAvgPool2d>(), "avgpool");
  net->append(std::make_unique<Linear>(in_planes, o.num_classes), "fc");
  net->set_needs_input_grad(false);  // the stem convolution: nobody needs d(loss)/d(image)
  return std::make_unique<Model>(std::move(net), name, device);
}

}  // namespace dpt::models
