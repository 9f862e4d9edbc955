// models/layers.cpp: the leaf modules and the softmax cross-entropy loss, forward and backward.
#include "models/layers.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dpt::models {

namespace {

std::vector<int64_t> nchw(const Tensor& x, const char* who) {
  DPT_CHECK(x.ndim() == 4, "{} takes [n, c, h, w], got {}", who, x.shape_str());
  return x.shape();
}

}  // namespace

// ---- Linear ---------------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool relu, bool bias)
    : in_(in_features), out_(out_features), relu_(relu), bias_(bias) {
  DPT_CHECK(in_ > 0 && out_ > 0, "Linear({}, {})", in_, out_);
  DPT_CHECK(bias_ || !relu_, "Linear({}, {}): the fused ReLU runs in the bias pass, which a layer without bias lacks",
            in_, out_);
}

std::string Linear::kind() const {
  return fmt::format("Linear{}({}->{}{})", relu_ ? "+ReLU" : "", in_, out_, bias_ ? "" : ", no bias");
}

std::vector<ParamSpec> Linear::param_specs() const {
  if (!bias_) return {{"weight", {out_, in_}}};
  return {{"weight", {out_, in_}}, {"bias", {out_}}};
}

void Linear::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  if (!bias_) {
    bind_views(params, {&w_});
    bind_views(grads, {&dw_});
    return;
  }
  bind_views(params, {&w_, &b_});
  bind_views(grads, {&dw_, &db_});
}

void Linear::init_params(std::mt19937_64& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  DPT_CHECK(w_.device().is_cpu(), "initialisation runs on the host; copy to the device after");
  float* w = w_.data<float>();
  if (normal_std_ > 0.0f) {
    for (size_t i = 0; i < w_.numel(); ++i) w[i] = normal(rng, 0.0f, normal_std_);
    if (bias_) std::fill_n(b_.data<float>(), b_.numel(), 0.0f);
    return;
  }
  for (size_t i = 0; i < w_.numel(); ++i) w[i] = uniform(rng, -bound, bound);
  if (!bias_) return;
  float* b = b_.data<float>();
  for (size_t i = 0; i < b_.numel(); ++i) b[i] = uniform(rng, -bound, bound);
}

void Linear::bind_bf16(std::vector<Tensor> params16) {
  if (params16.empty()) {
    w16_ = b16_ = Tensor();
    return;
  }
  if (!bias_) {
    bind_views(params16, {&w16_});
    return;
  }
  bind_views(params16, {&w16_, &b16_});
}

const Tensor& Linear::forward_bf16(const Tensor& x, Kernels& k) {
  DPT_CHECK(w16_.defined() && !relu_, "Linear({}, {}) got bf16 input without the bf16 fast path", in_, out_);
  DPT_CHECK(bias_ || !fuse_gelu_, "Linear({}, {}): the fused GELU epilogue needs a bias", in_, out_);
  DPT_CHECK(!packed_ || !fuse_gelu_, "Linear({}, {}): a packed output has no fused GELU", in_, out_);
  const int64_t batch = x.dim(0);
  x_ = x;
  x_shape_ = x.shape();
  Tensor& out = packed_ ? *packed_ : y_;
  if (packed_)
    DPT_CHECK(out.dtype() == DType::BF16 && out.ndim() == 2 && out.dim(0) == batch && packed_col0_ >= 0 &&
                  packed_col0_ + out_ <= out.dim(1) && out.device() == x.device(),
              "Linear({}, {}): packed output {} {} for {} rows from column {}", in_, out_, dtype_name(out.dtype()),
              out.shape_str(), batch, packed_col0_);
  else
    ensure_shape(y_, {batch, out_}, x.device(), DType::BF16);
  const int64_t ldd = packed_ ? out.dim(1) : out_, col0 = packed_ ? packed_col0_ : 0;
  if (fuse_gelu_) ensure_shape(pre16_, {batch, out_}, x.device(), DType::BF16);
  const MatmulShape s{.trans_a = false, .trans_b = true, .M = batch, .N = out_, .K = in_, .lda = in_, .ldb = in_,
                      .ldd = ldd,
                      .epilogue = fuse_gelu_ ? MatmulEpilogue::BiasGelu
                                  : bias_    ? MatmulEpilogue::Bias
                                             : MatmulEpilogue::None};
  k.matmul_bf16(s, {.a = x.data<BFloat16>(), .b = w16_.data<BFloat16>(), .d = out.data<BFloat16>() + col0,
                    .bias = bias_ ? b16_.data<BFloat16>() : nullptr,
                    .aux = fuse_gelu_ ? pre16_.data<BFloat16>() : nullptr});
  return out;
}

void Linear::chain_gelu_bf16(Linear& fc, Linear& proj) {
  DPT_CHECK(fc.fuse_gelu_ && fc.out_ == proj.in_ && !proj.fuse_gelu_ && !fc.packed_ && !proj.packed_,
            "chain_gelu_bf16: Linear({}, {}) with its GELU, then Linear({}, {})", fc.in_, fc.out_, proj.in_, proj.out_);
  fc.grad_is_pre_ = true;
  proj.dgelu_pre_ = &fc.pre16_;
}

const Tensor& Linear::backward_bf16(const Tensor& dy, Kernels& k) {
  const int64_t batch = x_.dim(0);
  // The gradient's row stride: out_, or the packed width (this layer's columns from packed_col0_ on).
  const int64_t ld = packed_ ? dy.dim(dy.ndim() - 1) : out_;
  DPT_CHECK(dy.dtype() == DType::BF16 && dy.numel() == static_cast<size_t>(batch * ld) &&
                (!packed_ || packed_col0_ + out_ <= ld),
            "Linear({}, {}) bf16 backward got {} {}", in_, out_, dtype_name(dy.dtype()), dy.shape_str());
  const BFloat16* d = dy.data<BFloat16>() + (packed_ ? packed_col0_ : 0);
  if (fuse_gelu_ && !grad_is_pre_) {  // through the GELU first: d(pre) = dy * gelu'(pre)
    ensure_shape(dpre_, {batch, out_}, dy.device(), DType::BF16);
    k.gelu_backward_bf16(pre16_.data<BFloat16>(), d, dpre_.data<BFloat16>(), dy.numel());
    d = dpre_.data<BFloat16>();
  }
  // dW[out, in] += d^T[out, B] x[B, in], db[out] += the column sums of d: one matmul and its bias-gradient epilogue
  // (= with fresh grads: nothing read, and the bias gradient straight from cuBLASLt's epilogue).
  const int64_t lda = fuse_gelu_ ? out_ : ld;  // (dpre_ is [batch, out_])
  const MatmulShape dw{.trans_a = true, .trans_b = false, .M = out_, .N = in_, .K = batch, .lda = lda, .ldb = in_,
                       .ldd = in_, .d_f32 = true, .accumulate = !fresh_grads_,
                       .epilogue = bias_ ? MatmulEpilogue::BiasGrad : MatmulEpilogue::None};
  k.matmul_bf16(dw, {.a = d, .b = x_.data<BFloat16>(), .d = dw_.raw(),
                     .bias_grad = bias_ ? db_.data<float>() : nullptr});
  if (!needs_input_grad_) return none_;
  // dx[B, in] = d[B, out] W[out, in], or, after chain_gelu_bf16, through the GELU before it: * gelu'(its pre)
  ensure_shape(dx_, x_shape_, dy.device(), DType::BF16);
  if (dgelu_pre_)
    DPT_CHECK(dgelu_pre_->dtype() == DType::BF16 && dgelu_pre_->numel() == static_cast<size_t>(batch * in_),
              "Linear({}, {}): the GELU's pre-activation {} {} for {} rows", in_, out_,
              dtype_name(dgelu_pre_->dtype()), dgelu_pre_->shape_str(), batch);
  const MatmulShape dx{.M = batch, .N = in_, .K = out_, .lda = lda, .ldb = in_, .ldd = in_,
                       .epilogue = dgelu_pre_ ? MatmulEpilogue::DGelu : MatmulEpilogue::None};
  k.matmul_bf16(dx, {.a = d, .b = w16_.data<BFloat16>(), .d = dx_.raw(),
                     .aux = dgelu_pre_ ? dgelu_pre_->data<BFloat16>() : nullptr});
  return dx_;
}

const Tensor& Linear::run_forward(const Tensor& x, Kernels& k) {
  // Any [n, ...] input with in_features values per example is read as [n, in] (nn.Flatten before it: an
  // image for the MLP, [n, c, 1, 1] after global pooling).
  DPT_CHECK(x.ndim() >= 2 && x.numel() == static_cast<size_t>(x.dim(0) * in_), "Linear({}, {}) got input {}", in_,
            out_, x.shape_str());
  if (x.dtype() == DType::BF16) return forward_bf16(x, k);
  const int64_t batch = x.dim(0);
  x_ = x;
  x_shape_ = x.shape();
  ensure_shape(y_, {batch, out_}, x.device());
  float* y = y_.data<float>();
  k.gemm(false, true, batch, out_, in_, 1.0f, x.data<float>(), in_, w_.data<float>(), in_, 0.0f, y, out_);
  if (bias_) k.bias_act(y, b_.data<float>(), y, batch, out_, relu_);
  return y_;
}

const Tensor& Linear::run_backward(const Tensor& dy, Kernels& k) {
  if (x_.dtype() == DType::BF16) return backward_bf16(dy, k);
  const int64_t batch = x_.dim(0);
  DPT_CHECK(dy.ndim() == 2 && dy.dim(0) == batch && dy.dim(1) == out_, "Linear backward got {}", dy.shape_str());
  const float* d = dy.data<float>();
  if (relu_) {
    ensure_shape(dpre_, {batch, out_}, dy.device());
    k.relu_backward(y_.data<float>(), d, dpre_.data<float>(), dy.numel());
    d = dpre_.data<float>();
  }
  // dW[out, in] += dpre^T[out, B] x[B, in];  db += column sums of dpre;  dx[B, in] = dpre[B, out] W[out, in]
  // (fresh grads: dW written, db zeroed first)
  k.gemm(true, false, out_, in_, batch, 1.0f, d, out_, x_.data<float>(), in_, fresh_grads_ ? 0.0f : 1.0f,
         dw_.data<float>(), in_);
  if (bias_) {
    if (fresh_grads_) db_.zero_(k.stream());
    k.bias_grad_accumulate(d, db_.data<float>(), batch, out_);
  }
  if (!needs_input_grad_) return none_;
  ensure_shape(dx_, x_shape_, dy.device());
  k.gemm(false, false, batch, in_, out_, 1.0f, d, out_, w_.data<float>(), in_, 0.0f, dx_.data<float>(), in_);
  return dx_;
}

// ---- Conv2d ---------------------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, Init init)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), pad_(padding), init_(init) {
  DPT_CHECK(in_ > 0 && out_ > 0 && kernel_ > 0 && stride_ > 0 && pad_ >= 0, "Conv2d({}, {}, {}, stride {}, padding {})",
            in_, out_, kernel_, stride_, pad_);
}

std::string Conv2d::kind() const {
  return fmt::format("Conv2d({}->{}, {}x{}{}{})", in_, out_, kernel_, kernel_,
                     stride_ != 1 ? fmt::format(", stride {}", stride_) : "",
                     pad_ != 0 ? fmt::format(", pad {}", pad_) : "");
}

std::vector<ParamSpec> Conv2d::param_specs() const { return {{"weight", {out_, in_, kernel_, kernel_}}}; }

void Conv2d::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  bind_views(params, {&w_});
  bind_views(grads, {&dw_});
}

void Conv2d::init_params(std::mt19937_64& rng) {
  DPT_CHECK(w_.device().is_cpu(), "initialisation runs on the host; copy to the device after");
  float* w = w_.data<float>();
  if (init_ == Init::KaimingNormalFanOut) {
    const float stddev = std::sqrt(2.0f / static_cast<float>(out_ * kernel_ * kernel_));
    for (size_t i = 0; i < w_.numel(); ++i) w[i] = normal(rng, 0.0f, stddev);
  } else {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_ * kernel_ * kernel_));
    for (size_t i = 0; i < w_.numel(); ++i) w[i] = uniform(rng, -bound, bound);
  }
}

ConvShape Conv2d::shape_for(const std::vector<int64_t>& x) const {
  DPT_CHECK(x.size() == 4 && x[1] == in_, "{} got input [{}]", kind(), fmt::join(x, ", "));
  ConvShape cs{.n = x[0], .c = x[1], .h = x[2], .w = x[3], .k = out_, .r = kernel_, .s = kernel_,
               .stride = stride_, .pad = pad_};
  if (!conv_output_size(cs))
    DPT_THROW(ConfigError, "{}: input {}x{} is too small for the kernel (the output would be empty)", kind(), x[2], x[3]);
  return cs;
}

const Tensor& Conv2d::run_forward(const Tensor& x, Kernels& k) {
  cs_ = shape_for(nchw(x, "Conv2d"));
  x_ = x;
  ensure_shape(y_, {cs_.n, cs_.k, cs_.p, cs_.q}, x.device());
  k.conv2d_forward(x.data<float>(), w_.data<float>(), y_.data<float>(), cs_);
  return y_;
}

const Tensor& Conv2d::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == y_.shape(), "{} backward got {}, forward gave {}", kind(), dy.shape_str(), y_.shape_str());
  if (needs_input_grad_) ensure_shape(dx_, x_.shape(), dy.device());
  // dw accumulates, then dx (when wanted) is overwritten: one call, so that a kernel set may share dy's rounding.
  k.conv2d_backward(dy.data<float>(), x_.data<float>(), w_.data<float>(),
                    needs_input_grad_ ? dx_.data<float>() : nullptr, dw_.data<float>(), cs_);
  return needs_input_grad_ ? dx_ : none_;
}

// ---- BatchNorm2d ----------------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t channels, float eps, float momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  DPT_CHECK(channels_ > 0, "BatchNorm2d({})", channels_);
}

std::string BatchNorm2d::kind() const { return fmt::format("{}BatchNorm2d({})", sync_ ? "Sync" : "", channels_); }

std::vector<ParamSpec> BatchNorm2d::param_specs() const { return {{"weight", {channels_}}, {"bias", {channels_}}}; }

std::vector<BufferSpec> BatchNorm2d::buffer_specs() const {
  return {{"running_mean", {channels_}, 0.0f}, {"running_var", {channels_}, 1.0f}};
}

void BatchNorm2d::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> buffers) {
  bind_views(params, {&gamma_, &beta_});
  bind_views(grads, {&dgamma_, &dbeta_});
  bind_views(buffers, {&running_mean_, &running_var_});
}

void BatchNorm2d::init_params(std::mt19937_64&) {
  DPT_CHECK(gamma_.device().is_cpu(), "initialisation runs on the host; copy to the device after");
  std::fill_n(gamma_.data<float>(), channels_, 1.0f);
  std::fill_n(beta_.data<float>(), channels_, 0.0f);
  num_batches_tracked_ = 0;
}

const Tensor& BatchNorm2d::run_forward(const Tensor& x, Kernels& k) {
  const auto shape = nchw(x, "BatchNorm2d");
  DPT_CHECK(shape[1] == channels_, "{} got input {}", kind(), x.shape_str());
  bs_ = {.n = shape[0], .c = channels_, .hw = shape[2] * shape[3]};
  x_ = x;
  ensure_shape(y_, shape, x.device());
  if (!training_) {
    k.bn_forward_eval(x.data<float>(), gamma_.data<float>(), beta_.data<float>(), running_mean_.data<float>(),
                      running_var_.data<float>(), bs_, eps_, y_.data<float>());
    return y_;
  }
  if (bs_.n * bs_.hw <= 1 && !sync_)
    DPT_THROW(ConfigError, "{}: training needs more than one value per channel, got input {} (batch size 1 at 1x1?)",
              kind(), x.shape_str());
  ensure_shape(sums_, {2 * channels_ + 1}, x.device(), DType::F64);
  ensure_shape(save_mean_, {channels_}, x.device());
  ensure_shape(save_invstd_, {channels_}, x.device());
  k.bn_stats(x.data<float>(), bs_, sums_.data<double>());
  if (sync_) sync_(sums_);
  k.bn_forward_train(x.data<float>(), gamma_.data<float>(), beta_.data<float>(), sums_.data<double>(), bs_, eps_,
                     momentum_, running_mean_.data<float>(), running_var_.data<float>(), save_mean_.data<float>(),
                     save_invstd_.data<float>(), y_.data<float>());
  ++num_batches_tracked_;
  return y_;
}

const Tensor& BatchNorm2d::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == y_.shape(), "{} backward got {}, forward gave {}", kind(), dy.shape_str(), y_.shape_str());
  DPT_CHECK(training_, "{}: backward in evaluation mode", kind());
  k.bn_backward_reduce(dy.data<float>(), x_.data<float>(), save_mean_.data<float>(), save_invstd_.data<float>(), bs_,
                       sums_.data<double>(), dgamma_.data<float>(), dbeta_.data<float>());
  if (!needs_input_grad_) return none_;
  if (sync_) sync_(sums_);
  ensure_shape(dx_, x_.shape(), dy.device());
  k.bn_backward_data(dy.data<float>(), x_.data<float>(), gamma_.data<float>(), save_mean_.data<float>(),
                     save_invstd_.data<float>(), sums_.data<double>(), bs_, dx_.data<float>());
  return dx_;
}

// ---- ReLU, pooling --------------------------------------------------------------------------------------

const Tensor& ReLU::run_forward(const Tensor& x, Kernels& k) {
  ensure_shape(y_, x.shape(), x.device());
  k.relu(x.data<float>(), y_.data<float>(), x.numel());
  return y_;
}

const Tensor& ReLU::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == y_.shape(), "ReLU backward got {}, forward gave {}", dy.shape_str(), y_.shape_str());
  if (!needs_input_grad_) return none_;
  ensure_shape(dx_, y_.shape(), dy.device());
  k.relu_backward(y_.data<float>(), dy.data<float>(), dx_.data<float>(), dy.numel());
  return dx_;
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding) : kernel_(kernel), stride_(stride), pad_(padding) {
  DPT_CHECK(kernel_ > 0 && stride_ > 0 && pad_ >= 0 && 2 * pad_ <= kernel_,
            "MaxPool2d(kernel {}, stride {}, padding {}): padding must be at most half the kernel", kernel_, stride_, pad_);
}

std::string MaxPool2d::kind() const { return fmt::format("MaxPool2d({}, stride {}, pad {})", kernel_, stride_, pad_); }

const Tensor& MaxPool2d::run_forward(const Tensor& x, Kernels& k) {
  const auto s = nchw(x, "MaxPool2d");
  ps_ = {.n = s[0], .c = s[1], .h = s[2], .w = s[3], .kernel = kernel_, .stride = stride_, .pad = pad_};
  if (!pool_output_size(ps_))
    DPT_THROW(ConfigError, "{}: input {}x{} is too small (the output would be empty)", kind(), s[2], s[3]);
  ensure_shape(y_, {ps_.n, ps_.c, ps_.p, ps_.q}, x.device());
  ensure_shape(argmax_, {ps_.n, ps_.c, ps_.p, ps_.q}, x.device(), DType::I32);
  k.maxpool2d_forward(x.data<float>(), y_.data<float>(), argmax_.data<int32_t>(), ps_);
  return y_;
}

const Tensor& MaxPool2d::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == y_.shape(), "{} backward got {}, forward gave {}", kind(), dy.shape_str(), y_.shape_str());
  if (!needs_input_grad_) return none_;
  ensure_shape(dx_, {ps_.n, ps_.c, ps_.h, ps_.w}, dy.device());
  k.maxpool2d_backward(dy.data<float>(), argmax_.data<int32_t>(), dx_.data<float>(), ps_);
  return dx_;
}

const Tensor& AdaptiveAvgPool2d::run_forward(const Tensor& x, Kernels& k) {
  x_shape_ = nchw(x, "AdaptiveAvgPool2d");
  ensure_shape(y_, {x_shape_[0], x_shape_[1], 1, 1}, x.device());
  k.avgpool_forward(x.data<float>(), y_.data<float>(), x_shape_[0] * x_shape_[1], x_shape_[2] * x_shape_[3]);
  return y_;
}

const Tensor& AdaptiveAvgPool2d::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.numel() == y_.numel(), "AdaptiveAvgPool2d backward got {}", dy.shape_str());
  if (!needs_input_grad_) return none_;
  ensure_shape(dx_, x_shape_, dy.device());
  k.avgpool_backward(dy.data<float>(), dx_.data<float>(), x_shape_[0] * x_shape_[1], x_shape_[2] * x_shape_[3]);
  return dx_;
}

// ---- loss -----------------------------------------------------------------------------------------------

void SoftmaxCrossEntropy::accumulate(const Tensor& logits, const Tensor& labels, Kernels& k, Tensor& stats,
                                     bool backward, double grad_scale) {
  DPT_CHECK(logits.ndim() == 2, "logits must be [batch, classes], got {}", logits.shape_str());
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  DPT_CHECK_EQ(labels.numel(), static_cast<size_t>(rows));
  DPT_CHECK(labels.device() == logits.device() && stats.device() == logits.device(),
            "logits on {}, labels on {}, stats on {}", logits.device().str(), labels.device().str(), stats.device().str());
  DPT_CHECK_EQ(stats.numel(), 3u);
  k.count_targets(labels.data<int32_t>(), rows, stats.data<double>() + 2);
  if (logits.dtype() == DType::BF16) {
    const float dscale = backward && rows > 0 ? static_cast<float>(grad_scale / static_cast<double>(rows)) : 0.0f;
    // dscale 0 means "no gradient" to the classifier: the logits would stay where the gradient should be.
    DPT_CHECK(!backward || rows == 0 || dscale != 0.0f, "the fused classifier's gradient scale {} / {} rows is 0 in "
              "float32", grad_scale, rows);
    k.classifier_bf16(logits.data<BFloat16>(), labels.data<int32_t>(), rows, cols, cols, dscale, stats.data<double>());
    if (backward) dlogits_ = logits;  // overwritten with the gradient
    return;
  }
  float* d = nullptr;
  if (backward) d = ensure_shape(dlogits_, {rows, cols}, logits.device()).data<float>();
  k.softmax_xent(logits.data<float>(), labels.data<int32_t>(), d, rows, cols, stats.data<double>());
  if (backward && grad_scale != 1.0) k.scale(d, dlogits_.numel(), static_cast<float>(grad_scale));
}

LossResult SoftmaxCrossEntropy::run(const Tensor& logits, const Tensor& labels, Kernels& k, bool backward) {
  ensure_shape(stats_, {3}, logits.device(), DType::F64).zero_(k.stream());
  accumulate(logits, labels, k, stats_, backward);
  const Tensor host = stats_.to(Device::cpu());  // synchronous
  const double* s = host.data<double>();
  return {.loss_sum = s[0], .correct = static_cast<int64_t>(s[1]), .count = static_cast<int64_t>(s[2])};
}

LossResult SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& labels, Kernels& k) {
  return run(logits, labels, k, false);
}

LossResult SoftmaxCrossEntropy::forward_backward(const Tensor& logits, const Tensor& labels, Kernels& k) {
  return run(logits, labels, k, true);
}

// ---- LayerNorm, GELU ------------------------------------------------------------------------------------------

LayerNorm::LayerNorm(int64_t channels, float eps) : c_(channels), eps_(eps) {
  DPT_CHECK(c_ > 0 && eps_ > 0.0f, "LayerNorm({}, eps {})", c_, eps_);
}

std::string LayerNorm::kind() const { return fmt::format("LayerNorm({})", c_); }

void LayerNorm::bind(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor>) {
  bind_views(params, {&gamma_, &beta_});
  bind_views(grads, {&dgamma_, &dbeta_});
}

void LayerNorm::init_params(std::mt19937_64&) {
  std::fill_n(gamma_.data<float>(), gamma_.numel(), 1.0f);
  std::fill_n(beta_.data<float>(), beta_.numel(), 0.0f);
}

const Tensor& LayerNorm::run_forward(const Tensor& x, Kernels& k) {
  DPT_CHECK(x.ndim() >= 1 && x.dim(x.ndim() - 1) == c_, "LayerNorm({}) got input {}", c_, x.shape_str());
  const int64_t rows = static_cast<int64_t>(x.numel()) / c_;
  const PendingAdd& add = pending_add();  // b set: the input normalised is *add.sum = x + *add.b
  x_ = add.b ? *add.sum : x;
  ensure_shape(mean_, {rows}, x.device());
  ensure_shape(rstd_, {rows}, x.device());
  if (x.dtype() == DType::BF16) {  // the fast path: bf16 in and out, float32 statistics and parameters
    ensure_shape(y_, x.shape(), x.device(), DType::BF16);
    if (add.b)
      k.add_layernorm_forward_bf16(x.data<BFloat16>(), add.b->data<BFloat16>(), add.sum->data<BFloat16>(),
                                   gamma_.data<float>(), beta_.data<float>(), y_.data<BFloat16>(), mean_.data<float>(),
                                   rstd_.data<float>(), rows, c_, eps_);
    else
      k.layernorm_forward_bf16(x.data<BFloat16>(), gamma_.data<float>(), beta_.data<float>(), y_.data<BFloat16>(),
                               mean_.data<float>(), rstd_.data<float>(), rows, c_, eps_);
    return y_;
  }
  if (add.b) k.add(x.data<float>(), add.b->data<float>(), add.sum->data<float>(), x.numel(), false);
  ensure_shape(y_, x.shape(), x.device());
  k.layernorm_forward(x_.data<float>(), gamma_.data<float>(), beta_.data<float>(), y_.data<float>(),
                      mean_.data<float>(), rstd_.data<float>(), rows, c_, eps_);
  return y_;
}

const Tensor& ResidualNorm::forward_add(const Tensor& a, const Tensor& b, Tensor& sum, Kernels& k) {
  DPT_CHECK(b.shape() == a.shape() && b.dtype() == a.dtype(), "{} forward's addend is {} {} for {} {}", kind(),
            dtype_name(b.dtype()), b.shape_str(), dtype_name(a.dtype()), a.shape_str());
  ensure_shape(sum, a.shape(), a.device(), a.dtype());
  struct Reset {
    PendingAdd& p;
    ~Reset() { p = {}; }
  } reset{add_};
  add_ = {&b, &sum};
  return forward(a, k);
}

const Tensor& ResidualNorm::backward_add(const Tensor& dy, const Tensor& residual, Kernels& k) {
  DPT_CHECK(residual.shape() == dy.shape() && residual.dtype() == dy.dtype(),
            "{} backward's residual gradient is {} {} for a gradient {} {}", kind(), dtype_name(residual.dtype()),
            residual.shape_str(), dtype_name(dy.dtype()), dy.shape_str());
  struct Reset {
    const Tensor*& r;
    ~Reset() { r = nullptr; }
  } reset{residual_};
  residual_ = &residual;
  return backward(dy, k);
}

void ResidualBlock::hand_off(const Tensor* input_addend, bool defer_output) {
  in_addend_ = input_addend;
  defer_ = defer_output;
}

// hand_off's settings are taken at the forward's start: a forward that throws leaves none for the next.
const Tensor& ResidualBlock::first_norm(ResidualNorm& norm, const Tensor& x, Kernels& k) {
  const Tensor* addend = std::exchange(in_addend_, nullptr);
  deferring_ = std::exchange(defer_, false);
  out_addend_ = nullptr;
  input_ = addend ? &x_sum_ : &x;
  if (addend) return norm.forward_add(x, *addend, x_sum_, k);
  x_sum_ = Tensor();  // not this forward's (an evaluation's, say): held by nothing else once the norm runs
  return norm.forward(x, k);
}

const Tensor& ResidualBlock::input() const {
  DPT_CHECK(input_, "{}: input() before first_norm()", kind());
  return *input_;
}

const Tensor& ResidualBlock::output(const Tensor& m, Kernels& k) {
  if (deferring_) {
    out_addend_ = &m;
    y_ = Tensor();  // an evaluation's float32 output, say: the fast path keeps no output of its own
    return r1_;
  }
  ensure_shape(y_, r1_.shape(), r1_.device(), r1_.dtype());
  if (r1_.dtype() == DType::BF16)  // the residual stream in bf16
    k.add_bf16(r1_.data<BFloat16>(), m.data<BFloat16>(), y_.data<BFloat16>(), r1_.numel());
  else
    k.add(r1_.data<float>(), m.data<float>(), y_.data<float>(), r1_.numel(), false);
  return y_;
}

const Tensor& run_handing_off(Module& blocks, const Tensor& x, ResidualNorm& final_norm, Tensor& sum, Kernels& k) {
  std::vector<ResidualBlock*> list;
  for (const auto& [name, child] : blocks.children()) {
    auto* block = dynamic_cast<ResidualBlock*>(child);
    DPT_CHECK(block, "{}: block {} ({}) is not a ResidualBlock", blocks.kind(), name, child->kind());
    list.push_back(block);
  }
  DPT_CHECK(!list.empty(), "{}: no block to run", blocks.kind());
  const Tensor* h = &x;
  const Tensor* addend = nullptr;
  try {
    for (ResidualBlock* block : list) {
      block->hand_off(addend, /*defer_output=*/true);
      h = &block->forward(*h, k);
      addend = block->output_addend();
    }
  } catch (...) {  // a block that threw before its first norm: nothing handed off stays for a later forward
    for (ResidualBlock* block : list) block->hand_off(nullptr, false);
    throw;
  }
  return final_norm.forward_add(*h, *addend, sum, k);
}

const Tensor& run_blocks(Module& blocks, const Tensor& x, ResidualNorm& final_norm, Tensor& sum, bool hand_off,
                         Kernels& k) {
  if (hand_off) return run_handing_off(blocks, x, final_norm, sum, k);
  sum = Tensor();
  return final_norm.forward(blocks.forward(x, k), k);
}

void ResidualNorm::add_residual(Tensor& dx, Kernels& k) const {
  if (residual_) k.add(residual_->data<float>(), dx.data<float>(), dx.data<float>(), dx.numel(), false);
}

const Tensor& LayerNorm::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == x_.shape() && dy.dtype() == x_.dtype(), "LayerNorm backward got {} {} for input {} {}",
            dtype_name(dy.dtype()), dy.shape_str(), dtype_name(x_.dtype()), x_.shape_str());
  const int64_t rows = static_cast<int64_t>(x_.numel()) / c_;
  if (x_.dtype() == DType::BF16) {
    ensure_shape(dx_, x_.shape(), dy.device(), DType::BF16);
    k.layernorm_backward_bf16(dy.data<BFloat16>(), x_.data<BFloat16>(), gamma_.data<float>(), mean_.data<float>(),
                              rstd_.data<float>(), dx_.data<BFloat16>(), dgamma_.data<float>(), dbeta_.data<float>(),
                              rows, c_, residual_bf16(), /*accumulate=*/!fresh_grads_);
    return dx_;
  }
  ensure_shape(dx_, x_.shape(), dy.device());
  if (fresh_grads_) {  // the float32 kernel adds: from 0
    dgamma_.zero_(k.stream());
    dbeta_.zero_(k.stream());
  }
  k.layernorm_backward(dy.data<float>(), x_.data<float>(), gamma_.data<float>(), mean_.data<float>(),
                       rstd_.data<float>(), dx_.data<float>(), dgamma_.data<float>(), dbeta_.data<float>(), rows, c_);
  add_residual(dx_, k);
  return dx_;
}

void shared_view(Tensor& view, Tensor& storage, const std::vector<int64_t>& shape, Device device) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  if (!storage.defined() || storage.numel() < n || storage.device() != device)
    storage = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, device);
  view = storage.view(0, shape);
}

const Tensor& Gelu::run_forward(const Tensor& x, Kernels& k) {
  x_ = x;
  if (shared_)
    shared_view(y_, *shared_, x.shape(), x.device());
  else
    ensure_shape(y_, x.shape(), x.device());
  k.gelu_forward(x.data<float>(), y_.data<float>(), x.numel());
  return y_;
}

void Gelu::recompute(Kernels& k) {
  DPT_CHECK(shared_ && x_.defined(), "GELU recompute without a shared output or a forward");
  shared_view(y_, *shared_, x_.shape(), x_.device());
  k.gelu_forward(x_.data<float>(), y_.data<float>(), x_.numel());
}

const Tensor& Gelu::run_backward(const Tensor& dy, Kernels& k) {
  DPT_CHECK(dy.shape() == x_.shape(), "GELU backward got {} for input {}", dy.shape_str(), x_.shape_str());
  ensure_shape(dx_, x_.shape(), dy.device());
  k.gelu_backward(x_.data<float>(), dy.data<float>(), dx_.data<float>(), dy.numel());
  return dx_;
}

}  // namespace dpt::models
