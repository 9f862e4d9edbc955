// models/layers.cpp: Linear (+ fused ReLU) and softmax cross-entropy, forward and backward.
#include "models/layers.h"

#include <cmath>

namespace dpt::models {

float uniform(std::mt19937_64& rng, float lo, float hi) {
  // 24 random bits -> [0, 1) exactly representable in float.
  const float u = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

Tensor& ensure_shape(Tensor& t, const std::vector<int64_t>& shape, Device device, DType dtype) {
  if (!t.defined() || t.shape() != shape || t.device() != device || t.dtype() != dtype) {
    t = Tensor::empty(shape, dtype, device);
  }
  return t;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool relu, bool needs_input_grad)
    : in_(in_features), out_(out_features), relu_(relu), needs_input_grad_(needs_input_grad) {
  DPT_CHECK(in_ > 0 && out_ > 0, "Linear({}, {})", in_, out_);
}

std::vector<ParamSpec> Linear::param_specs() const { return {{"weight", {out_, in_}}, {"bias", {out_}}}; }

void Linear::bind(std::vector<Tensor> params, std::vector<Tensor> grads) {
  DPT_CHECK_EQ(params.size(), 2u);
  DPT_CHECK_EQ(grads.size(), 2u);
  w_ = params[0];
  b_ = params[1];
  dw_ = grads[0];
  db_ = grads[1];
}

void Linear::init_params(std::mt19937_64& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  DPT_CHECK(w_.device().is_cpu(), "initialisation runs on the host; copy to the device after");
  float* w = w_.data<float>();
  for (size_t i = 0; i < w_.numel(); ++i) w[i] = uniform(rng, -bound, bound);
  float* b = b_.data<float>();
  for (size_t i = 0; i < b_.numel(); ++i) b[i] = uniform(rng, -bound, bound);
}

const Tensor& Linear::forward(const Tensor& x, Kernels& k) {
  DPT_CHECK(x.ndim() == 2 && x.dim(1) == in_, "Linear({}, {}) got input {}", in_, out_, x.shape_str());
  const int64_t batch = x.dim(0);
  x_ = x;
  ensure_shape(y_, {batch, out_}, x.device());
  float* y = y_.data<float>();
  k.gemm(false, true, batch, out_, in_, 1.0f, x.data<float>(), in_, w_.data<float>(), in_, 0.0f, y, out_);
  k.bias_act(y, b_.data<float>(), y, batch, out_, relu_);
  return y_;
}

const Tensor& Linear::backward(const Tensor& dy, Kernels& k) {
  const int64_t batch = x_.dim(0);
  DPT_CHECK(dy.ndim() == 2 && dy.dim(0) == batch && dy.dim(1) == out_, "Linear backward got {}", dy.shape_str());
  const float* d = dy.data<float>();
  if (relu_) {
    ensure_shape(dpre_, {batch, out_}, dy.device());
    k.relu_backward(y_.data<float>(), d, dpre_.data<float>(), dy.numel());
    d = dpre_.data<float>();
  }
  // dW[out, in] += dpre^T[out, B] x[B, in];  db += column sums of dpre;  dx[B, in] = dpre[B, out] W[out, in]
  k.gemm(true, false, out_, in_, batch, 1.0f, d, out_, x_.data<float>(), in_, 1.0f, dw_.data<float>(), in_);
  k.bias_grad_accumulate(d, db_.data<float>(), batch, out_);
  if (!needs_input_grad_) return none_;
  ensure_shape(dx_, {batch, in_}, dy.device());
  k.gemm(false, false, batch, in_, out_, 1.0f, d, out_, w_.data<float>(), in_, 0.0f, dx_.data<float>(), in_);
  return dx_;
}

void SoftmaxCrossEntropy::accumulate(const Tensor& logits, const Tensor& labels, Kernels& k, Tensor& stats,
                                     bool backward) {
  DPT_CHECK(logits.ndim() == 2, "logits must be [batch, classes], got {}", logits.shape_str());
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  DPT_CHECK_EQ(labels.numel(), static_cast<size_t>(rows));
  DPT_CHECK(labels.device() == logits.device() && stats.device() == logits.device(),
            "logits on {}, labels on {}, stats on {}", logits.device().str(), labels.device().str(), stats.device().str());
  DPT_CHECK_EQ(stats.numel(), 2u);
  float* d = nullptr;
  if (backward) d = ensure_shape(dlogits_, {rows, cols}, logits.device()).data<float>();
  k.softmax_xent(logits.data<float>(), labels.data<int32_t>(), d, rows, cols, stats.data<double>());
}

LossResult SoftmaxCrossEntropy::run(const Tensor& logits, const Tensor& labels, Kernels& k, bool backward) {
  ensure_shape(stats_, {2}, logits.device(), DType::F64).zero_(k.stream());
  accumulate(logits, labels, k, stats_, backward);
  const Tensor host = stats_.to(Device::cpu());  // synchronous
  const double* s = host.data<double>();
  return {.loss_sum = s[0], .correct = static_cast<int64_t>(s[1]), .count = logits.dim(0)};
}

LossResult SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& labels, Kernels& k) {
  return run(logits, labels, k, false);
}

LossResult SoftmaxCrossEntropy::forward_backward(const Tensor& logits, const Tensor& labels, Kernels& k) {
  return run(logits, labels, k, true);
}

}  // namespace dpt::models
