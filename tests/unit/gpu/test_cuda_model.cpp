// tests/unit/gpu/test_cuda_model.cpp: one MLP on the CPU and the same MLP moved to cuda:0 go through a
// training step on the same batch: forward, loss and its gradient, backward, an SGD update. The GPU must
// reproduce the CPU within float rounding at every stage.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gpu_testing.h"
#include "models/kernels/factory.h"
#include "models/model.h"

using namespace dpt;
using namespace dpt::models;
using namespace dpt::gpu_test;

namespace {

// The smallest gap between a row's largest and second largest logit: when it is far above the rounding
// differences, both devices pick the same argmax.
float min_top2_gap(const Tensor& logits) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  float gap = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> z(logits.data<float>() + r * cols, logits.data<float>() + (r + 1) * cols);
    std::partial_sort(z.begin(), z.begin() + 2, z.end(), std::greater<>());
    gap = std::min(gap, z[0] - z[1]);
  }
  return gap;
}

// Parameter by parameter (a whole-buffer norm would hide a wrong bias among 52k weights): ||got - want|| / ||want||
// below `tol`, where got is a host copy of the GPU model's flat buffer and want the CPU model's.
void require_close_per_param(const Model& cpu_model, const Tensor& got, const Tensor& want, double tol) {
  for (const NamedParam& np : cpu_model.named_params()) {
    const Diff d = compare(got.data<float>() + np.offset, want.data<float>() + np.offset, np.param.numel());
    INFO(np.name << ": " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < tol);
  }
}

}  // namespace

// Tolerances (relative L2 norms): logits and loss 1e-5, d(loss)/d(logits) 1e-5 (the first GEMM sums 784 float
// products; cuBLAS and OpenBLAS sum in different orders: expect ~3e-7), parameter gradients 1e-4 (two GEMMs
// deeper; expect ~5e-7), the parameters after the step 1e-5 and the step itself 1e-4 (expect ~2e-6: a step is
// small against the parameter it is added to, so one rounding of the sum weighs more). The ReLU masks agree:
// with this seed and batch the smallest |pre-activation| is 8e-5, far above any rounding difference.
TEST_CASE("an MLP moved to cuda reproduces the CPU's logits, loss, gradients and SGD step", "[gpu][model]") {
  constexpr int64_t kBatch = 33, kIn = 784, kClasses = 10;
  auto cpu_model = make_mlp(kIn, {64, 32}, kClasses);
  cpu_model->init(42);
  auto gpu_model = make_mlp(kIn, {64, 32}, kClasses);
  gpu_model->init(42);
  gpu_model->to(gpu());
  REQUIRE(gpu_model->device() == gpu());
  REQUIRE(gpu_model->params().device() == gpu());
  REQUIRE(gpu_model->grads().device() == gpu());
  REQUIRE(&gpu_model->kernels() == &kernels_for(gpu()));
  const size_t n = cpu_model->num_params();
  REQUIRE(gpu_model->num_params() == n);
  {
    const Tensor moved = to_host(gpu_model->params());  // the move copied the parameters bit for bit
    REQUIRE(bits_differ("params moved to the GPU", moved, cpu_model->params()) == "");
  }

  std::mt19937 rng(23);
  const Tensor x = random_floats({kBatch, kIn}, rng, 0.0f, 1.0f);  // pixel-like
  const Tensor dx = to_device(x);

  cpu_model->zero_grad();
  gpu_model->zero_grad();
  const Tensor& cpu_logits = cpu_model->forward(x);
  const Tensor& gpu_logits = gpu_model->forward(dx);
  REQUIRE(gpu_logits.device() == gpu());
  REQUIRE(gpu_logits.shape() == std::vector<int64_t>{kBatch, kClasses});
  {
    const Diff d = compare(to_host(gpu_logits), cpu_logits);
    INFO("logits: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < 1e-5);
  }

  // Labels: the CPU's prediction in odd rows (so some are hits), a random class in even ones.
  Tensor y = Tensor::empty({kBatch}, DType::I32);
  std::uniform_int_distribution<int32_t> cls(0, kClasses - 1);
  for (int64_t r = 0; r < kBatch; ++r) {
    const float* z = cpu_logits.data<float>() + r * kClasses;
    y.data<int32_t>()[r] = r % 2 == 1 ? static_cast<int32_t>(std::max_element(z, z + kClasses) - z) : cls(rng);
  }
  const Tensor dy = to_device(y);

  SoftmaxCrossEntropy cpu_loss, gpu_loss;
  const LossResult want = cpu_loss.forward_backward(cpu_logits, y, cpu_model->kernels());
  const LossResult got = gpu_loss.forward_backward(gpu_logits, dy, gpu_model->kernels());
  INFO(fmt::format("loss sum: gpu {}, cpu {}; correct: gpu {}, cpu {}", got.loss_sum, want.loss_sum, got.correct,
                   want.correct));
  REQUIRE(got.count == kBatch);
  REQUIRE(want.correct >= kBatch / 2);  // the labelling above makes the odd rows hits
  REQUIRE(rel_err(got.loss_sum, want.loss_sum) < 1e-5);
  REQUIRE(min_top2_gap(cpu_logits) > 1e-4f);  // so the argmax cannot flip with rounding (holds for this seed)
  REQUIRE(got.correct == want.correct);
  {
    const Diff d = compare(to_host(gpu_loss.grad()), cpu_loss.grad());
    INFO("dlogits: " << d);
    REQUIRE(d.nonfinite == 0);
    REQUIRE(d.rel_l2 < 1e-5);
  }

  cpu_model->backward(cpu_loss.grad());
  gpu_model->backward(gpu_loss.grad());
  require_close_per_param(*cpu_model, to_host(gpu_model->grads()), cpu_model->grads(), 1e-4);

  // One SGD step with momentum (first step: the buffer becomes the gradient) and weight decay, on both.
  const SgdParams sp{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = false, .first_step = true};
  Tensor cpu_buf = Tensor::zeros({static_cast<int64_t>(n)});
  Tensor gpu_buf = Tensor::zeros({static_cast<int64_t>(n)}, DType::F32, gpu());
  const Tensor before = copy_to(cpu_model->params(), Device::cpu());
  cpu_model->kernels().sgd_update(cpu_model->params().data<float>(), cpu_model->grads().data<float>(),
                                  cpu_buf.data<float>(), n, sp);
  gpu_model->kernels().sgd_update(gpu_model->params().data<float>(), gpu_model->grads().data<float>(),
                                  gpu_buf.data<float>(), n, sp);
  const Tensor after = to_host(gpu_model->params());
  require_close_per_param(*cpu_model, after, cpu_model->params(), 1e-5);
  require_close_per_param(*cpu_model, to_host(gpu_buf), cpu_buf, 1e-4);
  // The step itself (after - before), in double so the subtraction is exact.
  Tensor got_step = Tensor::empty({static_cast<int64_t>(n)}), want_step = Tensor::empty({static_cast<int64_t>(n)});
  for (size_t i = 0; i < n; ++i) {
    got_step.data<float>()[i] = static_cast<float>(double{after.data<float>()[i]} - before.data<float>()[i]);
    want_step.data<float>()[i] =
        static_cast<float>(double{cpu_model->params().data<float>()[i]} - before.data<float>()[i]);
  }
  require_close_per_param(*cpu_model, got_step, want_step, 1e-4);

  // And the updated models still agree on the next forward pass.
  const Diff d = compare(to_host(gpu_model->forward(dx)), cpu_model->forward(x));
  INFO("logits after the step: " << d);
  REQUIRE(d.rel_l2 < 1e-5);
}
