// trainer/optimizer.cpp: SGD and AdamW steps through the model's kernel set.
#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "models/kernels/elementwise.h"

namespace dpt::trainer {

Optimizer::Optimizer(const TrainConfig& cfg, models::Model& model, bool decay_matrices_only,
                     std::vector<FlatRange> owned, Tensor shard_grads, Tensor shard_params)
    : cfg_(cfg), model_(model), owned_(std::move(owned)), shard_grads_(std::move(shard_grads)),
      shard_params_(std::move(shard_params)) {
  if (owned_.empty()) owned_ = {{0, model.num_params()}};
  sharded_ = !(owned_.size() == 1 && owned_[0] == FlatRange{0, model.num_params()});
  size_t total = 0;
  for (const FlatRange& r : owned_) {
    DPT_CHECK_LE(r.offset + r.count, model.num_params());
    total += r.count;
  }
  // The update runs over maximal runs of neighbouring parameters that share a weight decay, cut at the owned
  // pieces' edges: one run for the whole buffer unless only matrices decay or the state is sharded.
  size_t at = 0;
  for (const FlatRange& r : owned_) {
    const size_t end = r.offset + r.count;
    bool first = true;
    for (const auto& np : model.named_params()) {
      const size_t lo = std::max(np.offset, r.offset), hi = std::min(np.offset + np.param.numel(), end);
      if (lo >= hi) continue;
      const bool decay = !decay_matrices_only || np.param.ndim() >= 2;
      if (!first && runs_.back().decay == decay)
        runs_.back().count += hi - lo;
      else
        runs_.push_back({lo, at + (lo - r.offset), hi - lo, decay});
      first = false;
    }
    at += r.count;
  }
  DPT_CHECK(!shard_grads_.defined() || shard_grads_.numel() == total, "gradient shard of {} elements for {} owned",
            shard_grads_.numel(), total);
  DPT_CHECK(!shard_params_.defined() || shard_params_.numel() == total, "parameter shard of {} elements for {} owned",
            shard_params_.numel(), total);
  const std::vector<int64_t> shape{static_cast<int64_t>(total)};
  if (cfg.optimizer == OptimizerKind::sgd) {
    if (cfg.momentum != 0.0) slots_.emplace_back("momentum", Tensor::zeros(shape, DType::F32, model.device()));
  } else if (cfg.optimizer == OptimizerKind::adamw) {
    slots_.emplace_back("exp_avg", Tensor::zeros(shape, DType::F32, model.device()));
    slots_.emplace_back("exp_avg_sq", Tensor::zeros(shape, DType::F32, model.device()));
  } else {
    DPT_THROW(ConfigError, "unknown optimizer '{}'", choice_name(cfg.optimizer));
  }
}

void Optimizer::step(double lr) {
  auto& k = model_.kernels();
  for (const Run& r : runs_) {
    float* p = shard_params_.defined() ? shard_params_.data<float>() + r.at : model_.params().data<float>() + r.offset;
    const float* g = shard_grads_.defined() ? shard_grads_.data<float>() + r.at : model_.grads().data<float>() + r.offset;
    const float wd = r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    auto slot = [&](size_t i) { return slots_[i].second.data<float>() + r.at; };
    if (cfg_.optimizer == OptimizerKind::sgd) {
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
  DPT_CHECK(!sharded_, "per-parameter state of a sharded optimizer");
  std::vector<NamedTensor> out;
  for (const auto& [slot, flat] : slots_)
    for (const auto& np : model_.named_params())
      out.push_back({np.name + "." + slot, flat.view(np.offset, np.param.shape())});
  return out;
}

OptimizerShard Optimizer::shard() const {
  OptimizerShard out{.ranges = owned_, .slots = {}};
  for (const auto& [slot, flat] : slots_) out.slots.push_back({slot, flat});
  return out;
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const auto& [slot, flat] : slots_) bytes += flat.bytes();
  return bytes;
}


}  // namespace dpt::trainer
