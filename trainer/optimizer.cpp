// trainer/optimizer.cpp: SGD and AdamW steps through the model's kernel set.
#include "trainer/optimizer.h"

#include <cmath>

#include "models/kernels/elementwise.h"

namespace dpt::trainer {

Optimizer::Optimizer(const TrainConfig& cfg, models::Model& model, bool decay_matrices_only)
    : cfg_(cfg), model_(model) {
  const auto shape = model.params().shape();
  // The update runs over maximal runs of neighbouring parameters that share a weight decay: one run for the
  // whole buffer unless only matrices decay.
  for (const auto& np : model.named_params()) {
    const bool decay = !decay_matrices_only || np.param.ndim() >= 2;
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().offset + runs_.back().count == np.offset)
      runs_.back().count += np.param.numel();
    else
      runs_.push_back({np.offset, np.param.numel(), decay});
  }
  if (cfg.optimizer == "sgd") {
    if (cfg.momentum != 0.0) slots_.emplace_back("momentum", Tensor::zeros(shape, DType::F32, model.device()));
  } else if (cfg.optimizer == "adamw") {
    slots_.emplace_back("exp_avg", Tensor::zeros(shape, DType::F32, model.device()));
    slots_.emplace_back("exp_avg_sq", Tensor::zeros(shape, DType::F32, model.device()));
  } else {
    DPT_THROW(ConfigError, "unknown optimizer '{}'", cfg.optimizer);
  }
}

void Optimizer::step(double lr) {
  auto& k = model_.kernels();
  for (const Run& r : runs_) {
    float* p = model_.params().data<float>() + r.offset;
    const float* g = model_.grads().data<float>() + r.offset;
    const float wd = r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    auto slot = [&](size_t i) { return slots_[i].second.data<float>() + r.offset; };
    if (cfg_.optimizer == "sgd") {
      models::SgdParams sp{.lr = static_cast<float>(lr),
                           .momentum = static_cast<float>(cfg_.momentum),
                           .weight_decay = wd,
                           .nesterov = cfg_.nesterov,
                           .first_step = steps_ == 0};
      k.sgd_update(p, g, slots_.empty() ? nullptr : slot(0), r.count, sp);
    } else {
      models::AdamWParams ap{.lr = static_cast<float>(lr),
                             .beta1 = static_cast<float>(cfg_.beta1),
                             .beta2 = static_cast<float>(cfg_.beta2),
                             .eps = static_cast<float>(cfg_.eps),
                             .weight_decay = wd,
                             .step = steps_ + 1};
      k.adamw_update(p, g, slot(0), slot(1), r.count, ap);
    }
  }
  ++steps_;
}

std::vector<NamedTensor> Optimizer::state() const {
  std::vector<NamedTensor> out;
  for (const auto& [slot, flat] : slots_)
    for (const auto& np : model_.named_params())
      out.push_back({np.name + "." + slot, flat.view(np.offset, np.param.shape())});
  return out;
}

double clip_gradients(models::Model& model, double max_norm, double sum_squares) {
  const double coef = models::elementwise::clip_coefficient(sum_squares, max_norm);
  if (coef < 1.0) model.kernels().scale(model.grads().data<float>(), model.num_params(), static_cast<float>(coef));
  return std::sqrt(sum_squares);
}

}  // namespace dpt::trainer
