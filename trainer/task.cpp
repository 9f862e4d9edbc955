// trainer/task.cpp: see task.h.
#include "trainer/task.h"

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
  explicit LanguageModel(int64_t block_size) : t_(block_size) {}
  // The windows [B, T + 1] (floats holding tokens) as int32 inputs [B, T] and next tokens [B * T].
  void prepare(const data::Batch& b) override {
    DPT_CHECK(b.features.device().is_cpu(), "language-model batches are split on the host");
    DPT_CHECK(b.features.ndim() == 2 && b.features.dim(1) == t_ + 1, "token windows [B, {}] expected, got {}",
              t_ + 1, b.features.shape_str());
    const int64_t n = b.features.dim(0);
    if (!tokens_.defined() || tokens_.dim(0) != n) {
      tokens_ = Tensor::empty({n, t_}, DType::I32);
      next_ = Tensor::empty({n * t_}, DType::I32);
    }
    const float* f = b.features.data<float>();
    int32_t* in = tokens_.data<int32_t>();
    int32_t* out = next_.data<int32_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < t_; ++i) {
        in[r * t_ + i] = static_cast<int32_t>(f[r * (t_ + 1) + i]);
        out[r * t_ + i] = static_cast<int32_t>(f[r * (t_ + 1) + i + 1]);
      }
  }
  const Tensor& input() const override { return tokens_; }
  const Tensor& targets() const override { return next_; }
  int64_t rows() const override { return tokens_.defined() ? tokens_.dim(0) * t_ : 0; }
  const char* unit() const override { return "tokens"; }

 private:
  int64_t t_;
  Tensor tokens_, next_;
};

}  // namespace

std::unique_ptr<Task> make_classification_task(std::vector<int64_t> sample_shape) {
  return std::make_unique<Classification>(std::move(sample_shape));
}

std::unique_ptr<Task> make_language_model_task(int64_t block_size, Device device) {
  if (!device.is_cpu())
    DPT_THROW(UnsupportedError, "language modelling (model.name = gpt) runs on the CPU only so far, not {}: use "
              "train.device = cpu", device.str());
  return std::make_unique<LanguageModel>(block_size);
}

std::unique_ptr<Task> make_task(const std::string& model_name, int64_t block_size,
                                std::vector<int64_t> sample_shape, Device device) {
  return model_name == "gpt" ? make_language_model_task(block_size, device)
                             : make_classification_task(std::move(sample_shape));
}

}  // namespace dpt::trainer
