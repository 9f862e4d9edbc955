// models/model.cpp: the flat-buffer Model and the MLP builder.
#include "models/model.h"

namespace dpt::models {

Model::Model(std::vector<std::unique_ptr<Layer>> layers, std::vector<std::string> names, Device device)
    : layers_(std::move(layers)), names_(std::move(names)) {
  DPT_CHECK_EQ(layers_.size(), names_.size());
  size_t total = 0;
  for (const auto& layer : layers_)
    for (const auto& spec : layer->param_specs()) total += numel_of(spec.shape);
  allocate(Device::cpu(), static_cast<int64_t>(total));
  if (device != Device::cpu()) to(device);
}

void Model::allocate(Device device, int64_t total) {
  device_ = device;
  kernels_ = &kernels_for(device);
  params_ = Tensor::zeros({total}, DType::F32, device);
  grads_ = Tensor::zeros({total}, DType::F32, device);
  named_.clear();
  layer_params_.clear();
  size_t offset = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layer_params_.emplace_back(named_.size(), named_.size() + layers_[i]->param_specs().size());
    std::vector<Tensor> p, g;
    for (const auto& spec : layers_[i]->param_specs()) {
      NamedParam np{names_[i] + "." + spec.name, params_.view(offset, spec.shape), grads_.view(offset, spec.shape),
                    offset};
      p.push_back(np.param);
      g.push_back(np.grad);
      named_.push_back(std::move(np));
      offset += numel_of(spec.shape);
    }
    layers_[i]->bind(std::move(p), std::move(g));
  }
}

void Model::to(Device device) {
  if (device == device_) return;
  const Tensor old = params_;
  allocate(device, static_cast<int64_t>(old.numel()));
  params_.copy_from(old);
}

void Model::init(uint64_t seed) {
  // Initialisation draws on the host (the same numbers on every machine), then moves to the device.
  const Device device = device_;
  to(Device::cpu());
  std::mt19937_64 rng(seed);
  for (auto& layer : layers_) layer->init_params(rng);
  to(device);
}

const Tensor& Model::forward(const Tensor& x) {
  const Tensor* h = &x;
  for (auto& layer : layers_) h = &layer->forward(*h, *kernels_);
  return *h;
}

void Model::backward(const Tensor& dlogits, const GradsReady& grads_ready) {
  const Tensor* d = &dlogits;
  for (size_t i = layers_.size(); i-- > 0;) {
    d = &layers_[i]->backward(*d, *kernels_);
    const auto [first, end] = layer_params_[i];
    if (grads_ready && first != end) grads_ready(first, end);
    if (!d->defined()) {
      DPT_CHECK_EQ(i, 0u);  // only the first layer may skip its input gradient
      break;
    }
  }
}

void Model::zero_grad() { grads_.zero_(kernels_->stream()); }

std::string Model::summary() const {
  std::string s;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (i) s += " -> ";
    s += layers_[i]->kind();
    if (auto* lin = dynamic_cast<const Linear*>(layers_[i].get()))
      s += fmt::format("({}->{})", lin->in_features(), lin->out_features());
  }
  return fmt::format("{}; {} parameters", s, num_params());
}

std::unique_ptr<Model> make_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes,
                                Device device) {
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<std::string> names;
  int64_t in = in_features;
  for (size_t i = 0; i <= hidden.size(); ++i) {
    const bool last = i == hidden.size();
    const int64_t out = last ? classes : hidden[i];
    layers.push_back(std::make_unique<Linear>(in, out, /*relu=*/!last, /*needs_input_grad=*/i > 0));
    // nn.Sequential(Linear, ReLU, Linear, ReLU, Linear): the Linear layers sit at indices 0, 2, 4, ...
    names.push_back(fmt::format("layers.{}", 2 * i));
    in = out;
  }
  return std::make_unique<Model>(std::move(layers), std::move(names), device);
}

}  // namespace dpt::models
