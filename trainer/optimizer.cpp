// trainer/optimizer.cpp: SGD and AdamW steps through the model's kernel set.
#include "trainer/optimizer.h"

namespace dpt::trainer {

Optimizer::Optimizer(const TrainConfig& cfg, models::Model& model) : cfg_(cfg), model_(model) {
  const auto shape = model.params().shape();
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
  float* p = model_.params().data<float>();
  const float* g = model_.grads().data<float>();
  const size_t n = model_.num_params();
  if (cfg_.optimizer == "sgd") {
    models::SgdParams sp{.lr = static_cast<float>(lr),
                         .momentum = static_cast<float>(cfg_.momentum),
                         .weight_decay = static_cast<float>(cfg_.weight_decay),
                         .nesterov = cfg_.nesterov,
                         .first_step = steps_ == 0};
    k.sgd_update(p, g, slots_.empty() ? nullptr : slots_[0].second.data<float>(), n, sp);
  } else {
    models::AdamWParams ap{.lr = static_cast<float>(lr),
                           .beta1 = static_cast<float>(cfg_.beta1),
                           .beta2 = static_cast<float>(cfg_.beta2),
                           .eps = static_cast<float>(cfg_.eps),
                           .weight_decay = static_cast<float>(cfg_.weight_decay),
                           .step = steps_ + 1};
    k.adamw_update(p, g, slots_[0].second.data<float>(), slots_[1].second.data<float>(), n, ap);
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

}  // namespace dpt::trainer
