// trainer/task.cpp: see task.h.
#include "trainer/task.h"

#include "models/kernels/factory.h"

#include "core/check.h"

namespace dpt::trainer {
namespace {

class Classification final : public Task {
 public:
  explicit Classification(std::vector<int64_t> sample_shape) : sample_shape_(std::move(sample_shape)) {}
  void prepare(const data::Batch& b) override {
    std::vector<int64_t> shape{b.features.dim(0)};  // [B, F] folded to [B, C, H, W] for images: a view, no copy
    shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    input_ = b.features.reshape(std::move(shape));
    targets_ = b.labels;
    rows_ = static_cast<int64_t>(b.size);
  }
  const Tensor& input() const override { return input_; }
  const Tensor& targets() const override { return targets_; }
  int64_t rows() const override { return rows_; }
  const char* unit() const override { return "samples"; }

 private:
  std::vector<int64_t> sample_shape_;
  Tensor input_, targets_;
  int64_t rows_ = 0;
};

class LanguageModel final : public Task {
 public:
  LanguageModel(int64_t block_size, Device device) : t_(block_size), kernels_(models::kernels_for(device)) {}
  // The windows [B, T + 1] (floats holding tokens) as int32 inputs [B, T] and next tokens [B * T], on the
  // batch's device by the kernel set (on a GPU: on the compute stream, no host synchronisation).
  void prepare(const data::Batch& b) override {
    DPT_CHECK(b.features.device() == kernels_.device(), "language-model batch on {}, the task on {}",
              b.features.device().str(), kernels_.device().str());
    DPT_CHECK(b.features.ndim() == 2 && b.features.dim(1) == t_ + 1, "token windows [B, {}] expected, got {}",
              t_ + 1, b.features.shape_str());
    const int64_t n = b.features.dim(0);
    if (!tokens_.defined() || tokens_.dim(0) != n) {
      tokens_ = Tensor::empty({n, t_}, DType::I32, kernels_.device());
      next_ = Tensor::empty({n * t_}, DType::I32, kernels_.device());
    }
    kernels_.split_token_windows(b.features.data<float>(), tokens_.data<int32_t>(), next_.data<int32_t>(), n, t_);
  }
  const Tensor& input() const override { return tokens_; }
  const Tensor& targets() const override { return next_; }
  int64_t rows() const override { return tokens_.defined() ? tokens_.dim(0) * t_ : 0; }
  const char* unit() const override { return "tokens"; }

 private:
  int64_t t_;
  models::Kernels& kernels_;
  Tensor tokens_, next_;
};

}  // namespace

std::unique_ptr<Task> make_classification_task(std::vector<int64_t> sample_shape) {
  return std::make_unique<Classification>(std::move(sample_shape));
}

std::unique_ptr<Task> make_language_model_task(int64_t block_size, Device device) {
  return std::make_unique<LanguageModel>(block_size, device);
}

std::unique_ptr<Task> make_task(ModelInput input, int64_t block_size, std::vector<int64_t> sample_shape, Device device) {
  return input == ModelInput::tokens ? make_language_model_task(block_size, device)
                                     : make_classification_task(std::move(sample_shape));
}

}  // namespace dpt::trainer
