// trainer/optimizer.cpp: SGD and AdamW steps through the model's kernel set: AdamW as one fused pass per owned piece
// (adamw_fused: clipping, the per-element weight decay and the fast path's bf16 copy inside), SGD run by run.
#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
  // AdamW's fused pieces: each owned piece with its runs' decay ranges, relative to the piece.
  at = 0;
  for (const FlatRange& r : owned_) {
    Piece piece{.offset = r.offset, .at = at, .count = r.count, .decay_edges = {}};
    std::vector<int64_t> edges;
    for (const Run& run : runs_) {
      if (run.at < at || run.at >= at + r.count || !run.decay) continue;
      const auto lo = static_cast<int64_t>(run.at - at), hi = static_cast<int64_t>(run.at - at + run.count);
      if (!edges.empty() && edges.back() == lo)
        edges.back() = hi;  // neighbouring decay runs (cut at nothing else) merge
      else
        edges.insert(edges.end(), {lo, hi});
    }
    piece.all_decay = edges.size() == 2 && edges[0] == 0 && static_cast<size_t>(edges[1]) == r.count;
    if (!piece.all_decay && !edges.empty()) {
      Tensor host = Tensor::empty({static_cast<int64_t>(edges.size())}, DType::I64);
      std::copy(edges.begin(), edges.end(), host.data<int64_t>());
      piece.decay_edges = host.to(model.device());
      piece.n_edges = edges.size();
    }
    pieces_.push_back(std::move(piece));
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

void Optimizer::step(double lr, const double* grad_ss, double max_norm) {
  auto& k = model_.kernels();
  float* params = shard_params_.defined() ? shard_params_.data<float>() : model_.params().data<float>();
  float* grads = shard_grads_.defined() ? shard_grads_.data<float>() : model_.grads().data<float>();
  // Where a piece's (or a run's) parameters and gradients start: in the shard buffers at `at`, else in the model's
  // flat buffers at `offset`.
  const auto param_at = [&](size_t offset, size_t at) { return params + (shard_params_.defined() ? at : offset); };
  const auto grad_at = [&](size_t offset, size_t at) { return grads + (shard_grads_.defined() ? at : offset); };
  if (cfg_.optimizer == OptimizerKind::adamw) {
    // The fast path's bf16 copy, written in the same pass (the next training forward then skips its rounding
    // pass): where this update covers the whole flat buffer. A sharded update's pieces would leave the others' stale.
    BFloat16* params16 = this->params16();
    const models::AdamWParams ap = adamw_params(lr);
    for (const Piece& pc : pieces_)
      k.adamw_fused(param_at(pc.offset, pc.at), params16 ? params16 + pc.offset : nullptr, grad_at(pc.offset, pc.at),
                    slots_[0].second.data<float>() + pc.at, slots_[1].second.data<float>() + pc.at, pc.count,
                    pc.adamw(ap), pc.edges(), pc.n_edges, grad_ss, max_norm);
    if (params16) model_.params16_written();
    ++steps_;
    return;
  }
  if (grad_ss)
    for (const Piece& pc : pieces_) k.clip_by_norm(grad_at(pc.offset, pc.at), pc.count, grad_ss, max_norm);
  for (const Run& r : runs_) {  // SGD, run by run (one weight decay each)
    models::SgdParams sp{.lr = static_cast<float>(lr),
                         .momentum = static_cast<float>(cfg_.momentum),
                         .weight_decay = r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
                         .nesterov = cfg_.nesterov,
                         .first_step = steps_ == 0};
    k.sgd_update(param_at(r.offset, r.at), grad_at(r.offset, r.at),
                 slots_.empty() ? nullptr : slots_[0].second.data<float>() + r.at, r.count, sp);
  }
  ++steps_;
}

models::AdamWParams Optimizer::adamw_params(double lr) const {
  return {.lr = static_cast<float>(lr),
          .beta1 = static_cast<float>(cfg_.beta1),
          .beta2 = static_cast<float>(cfg_.beta2),
          .eps = static_cast<float>(cfg_.eps),
          .weight_decay = static_cast<float>(cfg_.weight_decay),
          .step = steps_ + 1};
}

BFloat16* Optimizer::params16() const {
  return sharded_ || shard_params_.defined() ? nullptr : model_.params16_data();
}

bool Optimizer::can_stage() const {
  return cfg_.optimizer == OptimizerKind::adamw && !sharded_ && !shard_params_.defined() && !shard_grads_.defined();
}

void Optimizer::stage(double lr, StreamHandle stream) {
  DPT_CHECK(can_stage(), "Optimizer::stage: only AdamW over the whole parameter buffer");
  using models::elementwise::AdamWSteps;
  static_assert(sizeof(AdamWSteps) % sizeof(float) == 0 && alignof(AdamWSteps) <= alignof(float));
  constexpr int64_t kFloats = sizeof(AdamWSteps) / sizeof(float);
  const auto block_floats = static_cast<int64_t>(pieces_.size()) * kFloats;
  const models::AdamWParams ap = adamw_params(lr);
  staged_.clear();
  for (const Piece& pc : pieces_) staged_.push_back(models::elementwise::adamw_steps(pc.adamw(ap)));  // step()'s
  const size_t bytes = staged_.size() * sizeof(AdamWSteps);
  if (!staged_block_.defined()) staged_block_ = Tensor::zeros({block_floats}, DType::F32, model_.device());
  if (!model_.device().is_cuda()) {
    std::memcpy(staged_block_.raw(), staged_.data(), bytes);
    return;
  }
  if (!staged_pinned_.defined()) {
    staged_pinned_ = Tensor::empty_pinned({static_cast<int64_t>(kStageSlots) * block_floats}, DType::F32);
    for (size_t i = 0; i < kStageSlots; ++i) staged_copied_.push_back(std::make_unique<cuda::Event>());
  }
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % kStageSlots;
  // The slot's last copy was enqueued kStageSlots steps ago (the step timer keeps the host within two steps of the
  // device): done by now, so this returns at once.
  staged_copied_[slot]->synchronize();
  void* src = staged_pinned_.data<float>() + static_cast<int64_t>(slot) * block_floats;
  std::memcpy(src, staged_.data(), bytes);
  cuda::memcpy(staged_block_.raw(), src, bytes, stream);
  staged_copied_[slot]->record(stream);
}

void Optimizer::step_staged(const double* grad_ss, double max_norm) {
  DPT_CHECK(!staged_.empty() && staged_block_.defined(), "Optimizer::step_staged before stage()");
  auto& k = model_.kernels();
  float* params = model_.params().data<float>();
  const float* grads = model_.grads().data<float>();
  BFloat16* params16 = this->params16();
  const auto* block = static_cast<const models::elementwise::AdamWSteps*>(staged_block_.raw());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& pc = pieces_[i];
    k.adamw_fused_staged(params + pc.offset, params16 ? params16 + pc.offset : nullptr, grads + pc.offset,
                         slots_[0].second.data<float>() + pc.at, slots_[1].second.data<float>() + pc.at, pc.count,
                         block + i, pc.edges(), pc.n_edges, grad_ss, max_norm);
  }
}

void Optimizer::staged_done() {
  if (params16()) model_.params16_written();
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
