// models/module.cpp: Module's entry points, Sequential, the initialisation draws.
#include "models/module.h"

#include <cmath>
#include <numbers>

namespace dpt::models {

const Tensor& Module::forward(const Tensor& x, Kernels& k) {
  if (hooks_.before_forward) hooks_.before_forward();
  const Tensor& y = run_forward(x, k);
  if (hooks_.after_forward) hooks_.after_forward();
  return y;
}

const Tensor& Module::backward(const Tensor& dy, Kernels& k) {
  if (hooks_.before_backward) hooks_.before_backward();
  const Tensor& dx = run_backward(dy, k);
  if (grads_ready_) grads_ready_();
  if (hooks_.after_backward) hooks_.after_backward();
  return dx;
}

void Module::set_training(bool training) {
  training_ = training;
  for (auto& [name, child] : child_views_) child->set_training(training);
}

void Module::set_bf16_activations(bool on) {
  bf16_ = on;
  for (auto& [name, child] : child_views_) child->set_bf16_activations(on);
}

void Module::set_fresh_grads(bool on) {
  fresh_grads_ = on;
  for (auto& [name, child] : child_views_) child->set_fresh_grads(on);
}

std::string Sequential::kind() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < children().size(); ++i) s += (i ? ", " : "") + children()[i].second->kind();
  return s + ")";
}

void Sequential::set_needs_input_grad(bool needed) {
  needs_input_grad_ = needed;
  if (!children().empty()) children().front().second->set_needs_input_grad(needed);
}

const Tensor& Sequential::run_forward(const Tensor& x, Kernels& k) {
  const Tensor* h = &x;
  for (auto& [name, child] : children()) h = &child->forward(*h, k);
  return *h;
}

const Tensor& Sequential::run_backward(const Tensor& dy, Kernels& k) {
  const Tensor* d = &dy;
  const auto& kids = children();
  for (size_t i = kids.size(); i-- > 0;) {
    d = &kids[i].second->backward(*d, k);
    if (!d->defined()) {
      DPT_CHECK(i == 0, "{} returned no input gradient but is not the first module", kids[i].first);
      break;
    }
  }
  if (kids.empty()) return dy;
  return *d;
}

float uniform(std::mt19937_64& rng, float lo, float hi) {
  // 24 random bits -> [0, 1) exactly representable in float.
  const float u = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

float normal(std::mt19937_64& rng, float mean, float stddev) {
  // Box-Muller from two 53-bit uniforms; u1 in (0, 1] keeps the log finite.
  const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return mean + stddev * static_cast<float>(z);
}

void bind_views(const std::vector<Tensor>& views, std::initializer_list<Tensor*> targets) {
  DPT_CHECK_EQ(views.size(), targets.size());
  size_t i = 0;
  for (Tensor* t : targets) *t = views[i++];
}

Tensor& ensure_shape(Tensor& t, const std::vector<int64_t>& shape, Device device, DType dtype) {
  if (!t.defined() || t.shape() != shape || t.device() != device || t.dtype() != dtype) {
    t = Tensor::empty(shape, dtype, device);
  }
  return t;
}

}  // namespace dpt::models
