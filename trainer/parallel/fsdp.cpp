// trainer/parallel/fsdp.cpp: ZeRO stage 3: the parameters gathered around their use.
#include "trainer/parallel/fsdp.h"

#include <fmt/format.h>

#include <exception>
#include <unordered_map>

#include "core/memory.h"
#include "trainer/checkpoint.h"

namespace dpt::trainer {

Fsdp::Fsdp(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts)
    : Zero(pg, model, stream, opts) {
  param_views_ = model.split_params(bucket_param_ranges());  // the values copied: every rank's initial model, whole
  size_t total = 0;
  for (const FlatRange& r : owned_) total += r.count;
  shard_params_ = Tensor::zeros({static_cast<int64_t>(total)}, DType::F32, model.device());
  std::vector<Tensor> owned_params;
  for (size_t i = 0, a = 0; i < owned_.size(); a += owned_[i].count, ++i)
    owned_params.push_back(shard_params_.view(a, {static_cast<int64_t>(owned_[i].count)}));
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    const Chunks& c = chunks_[i];
    param_pieces_.push_back(cut(param_views_[i], c));
    kept_param_chunk_.push_back(c.q > 0 ? owned_params[pieces_.index_at(b.offset + c.mine)] : Tensor());
    kept_param_rem_.push_back(c.rem > 0 ? owned_params[pieces_.index_at(b.offset + c.split)] : Tensor());
  }
  keep_params();  // this rank's pieces of the initial parameters; the whole buckets go
  gathered_.assign(buckets_.size(), Gathered::kYes);
  gather_ticket_.assign(buckets_.size(), 0);
  gather_work_.resize(buckets_.size());
  for (const Tensor& v : param_views_) resident_bytes_ += v.bytes();
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
  peak_bytes_ = 0;  // what training gathers, from here on
  users_.assign(buckets_.size(), 0);
  for (const auto& [first, end] : model.hook_ranges())
    map_.for_each(first, end, [&](size_t b) { ++users_[b]; });
  for (auto& pos : order_pos_) pos.assign(buckets_.size(), kNone);

  models::Model::ParamHooks hooks;
  hooks.before_forward = [this](size_t first, size_t end) { use_params(first, end); };
  hooks.before_backward = [this](size_t first, size_t end) {
    use_params(first, end);
    hold(first, end);
  };
  hooks.after_forward = hooks.after_backward = [this](size_t first, size_t end) { done_with_params(first, end); };
  hooks.forward_begin = [this] { begin_pass(0); };
  hooks.backward_begin = [this] { begin_pass(1); };
  hooks.forward_end = hooks.backward_end = [this] { end_pass(); };
  model.set_param_hooks(std::move(hooks));
}

Fsdp::~Fsdp() {
  stop_comm();                    // no gather may run on the thread while this strategy's parts go
  model_.set_param_hooks({});     // the model may outlive this strategy
}

void Fsdp::keep_params() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Pieces& p = param_pieces_[b];
    if (p.chunk.numel()) kept_param_chunk_[b].copy_from(p.chunk, stream_);
    if (p.rem.numel()) kept_param_rem_[b].copy_from(p.rem, stream_);
  }
}

// The bucket's parameters from every rank's piece: this rank's chunk in, all chunks out; the remainder (the same on
// every rank) copied. On the communication thread or, without one, here.
void Fsdp::gather_bucket(size_t bucket) {
  Pieces& p = param_pieces_[bucket];
  if (p.chunk.numel())
    pg_.allgather(kept_param_chunk_[bucket], p.split, {.stream = stream_, .what = fmt::format("params bucket {}", bucket)})
        ->block(stream_);
  if (p.rem.numel()) p.rem.copy_from(kept_param_rem_[bucket], stream_);
}

void Fsdp::start_gather(size_t bucket) {
  {
    const ThreadAllocationsPaused paused;  // parameters, not the step's activations
    // From the device's memory pool in the compute stream's order; the gather's stream waits on that stream.
    param_views_[bucket].storage().reserve(stream_);
  }
  resident_bytes_ += param_views_[bucket].bytes();
  peak_bytes_ = std::max(peak_bytes_, resident_bytes_);
  gathered_[bucket] = Gathered::kPending;
  if (comm_) {
    gather_ticket_[bucket] = comm_->submit([this, bucket] { gather_bucket(bucket); });
    return;
  }
  if (pg_.asynchronous()) {  // enqueued on the group's stream; the compute stream waits for it in wait_gather
    Pieces& p = param_pieces_[bucket];
    if (p.chunk.numel())
      gather_work_[bucket] = pg_.allgather(kept_param_chunk_[bucket], p.split,
                                           {.stream = stream_, .what = fmt::format("params bucket {}", bucket)});
    if (p.rem.numel()) p.rem.copy_from(kept_param_rem_[bucket], stream_);
    return;
  }
  gather_bucket(bucket);
  gathered_[bucket] = Gathered::kYes;
}

void Fsdp::wait_gather(size_t bucket) {
  if (comm_) {
    comm_->wait(gather_ticket_[bucket]);
  } else {
    if (gather_work_[bucket]) gather_work_[bucket]->block(stream_);
    gather_work_[bucket].reset();
  }
  gathered_[bucket] = Gathered::kYes;
}

void Fsdp::need_params(size_t bucket) {
  if (gathered_[bucket] == Gathered::kNo) start_gather(bucket);
  if (gathered_[bucket] == Gathered::kPending) wait_gather(bucket);
}

void Fsdp::release_params(size_t bucket) {
  if (gathered_[bucket] == Gathered::kNo) return;
  if (gathered_[bucket] == Gathered::kPending) wait_gather(bucket);
  {
    const ThreadAllocationsPaused paused;
    param_views_[bucket].storage().release(stream_);  // after its modules' kernels on the compute stream
  }
  resident_bytes_ -= param_views_[bucket].bytes();
  gathered_[bucket] = Gathered::kNo;
}

void Fsdp::begin_pass(int pass) {
  pass_ = pass;
  left_ = users_;
}

void Fsdp::use_params(size_t first_param, size_t end_param) {
  std::vector<size_t>& order = order_[pass_];
  std::vector<size_t>& pos = order_pos_[pass_];
  map_.for_each(first_param, end_param, [&](size_t b) {
    need_params(b);
    if (!recorded_[pass_]) {  // the first pass of its kind records the order buckets are first used in
      if (pos[b] == kNone) {
        pos[b] = order.size();
        order.push_back(b);
      }
    } else if (pos[b] != kNone && pos[b] + 1 < order.size() && gathered_[order[pos[b] + 1]] == Gathered::kNo) {
      start_gather(order[pos[b] + 1]);  // prefetch: the next bucket's gather runs while this one's modules compute
    }
  });
}

void Fsdp::done_with_params(size_t first_param, size_t end_param) {
  map_.for_each(first_param, end_param, [&](size_t b) {
    if (left_[b] > 0 && --left_[b] == 0) release_params(b);
  });
}

void Fsdp::end_pass() {
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
  recorded_[pass_] = true;
}

void Fsdp::for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    need_params(b);
    fn(buckets_[b], param_views_[b]);
    release_params(b);
  }
}

void Fsdp::with_full_params(const std::function<void()>& fn, bool changed) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (gathered_[b] == Gathered::kNo) start_gather(b);
  for (size_t b = 0; b < buckets_.size(); ++b) need_params(b);
  std::exception_ptr err;
  try {
    fn();
    if (changed) keep_params();
  } catch (...) {
    err = std::current_exception();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
  if (err) std::rethrow_exception(err);
}

// The parameters gathered bucket by bucket (every rank takes part), so that beyond its shard a rank holds one bucket
// at a time, and rank 0 the host copy.
std::vector<NamedTensor> Fsdp::model_state_on_host(bool lead) {
  Tensor flat = lead ? Tensor::empty({static_cast<int64_t>(model_.num_params())}) : Tensor();
  for_each_gathered([&](const Bucket& b, const Tensor& params) {
    if (lead) flat.view(b.offset, {static_cast<int64_t>(b.count)}).copy_from(params);
  });
  if (!lead) return {};
  std::unordered_map<std::string, const models::NamedParam*> params;
  for (const auto& np : model_.named_params()) params[np.name] = &np;
  std::vector<NamedTensor> state = model_.state();
  for (NamedTensor& nt : state) {
    const auto it = params.find(nt.name);
    nt.tensor = it != params.end() ? flat.view(it->second->offset, it->second->param.shape()) : nt.tensor.to(Device::cpu());
  }
  return state;
}

std::vector<std::string> Fsdp::shard_lines(size_t optimizer_state_bytes, int64_t accum_steps) const {
  std::vector<std::string> lines = Zero::shard_lines(optimizer_state_bytes, accum_steps);
  lines.push_back(fmt::format(
      "zero: stage 3: parameters sharded too: this rank keeps {} of parameters between steps (whole: {}); each "
      "bucket's are all-gathered before the first module using it runs forward or backward (the next bucket "
      "prefetched), and released once its modules are done (the memory report's parameters: the shard and the most "
      "gathered at once)", format_bytes(param_bytes()), format_bytes(model_.num_params() * sizeof(float))));
  return lines;
}

}  // namespace dpt::trainer
