// trainer/parallel/zero.cpp: ZeRO stages 1 and 2: reduce-scatter, the shard, the parameters all-gathered.
#include "trainer/parallel/zero.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/memory.h"
#include "core/check.h"

namespace dpt::trainer {

namespace {
Tensor view(const Tensor& t, size_t offset, size_t count) { return t.view(offset, {static_cast<int64_t>(count)}); }
}  // namespace

Zero::Pieces Zero::cut(const Tensor& bucket, const Chunks& c) {
  return {.split = view(bucket, 0, c.split), .chunk = view(bucket, c.mine, c.q), .rem = view(bucket, c.split, c.rem)};
}

std::vector<std::pair<size_t, size_t>> Zero::bucket_param_ranges() const {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const Bucket& b : buckets_) ranges.emplace_back(b.first_param, b.end_param);
  return ranges;
}

Zero::Zero(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts)
    : DataParallel(pg, model, stream, opts) {
  DPT_CHECK(opts_.zero >= 1 && pg_.size() > 1, "ZeRO stage {} on {} rank(s)", opts_.zero, pg_.size());
  const auto world = static_cast<size_t>(pg_.size()), rank = static_cast<size_t>(pg_.rank());
  for (const Bucket& b : buckets_) chunks_.push_back(chunks_of(b.count, world, rank));
  pieces_ = owned_pieces(buckets_, world, rank);
  owned_ = pieces_.ranges;
  if (held()) {
    // Stage 2: every bucket its own gradient storage (and wire buffer), held only while needed.
    views_ = model.split_grads(bucket_param_ranges());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      views_[b].storage().release();
      wire_views_.push_back(codec_.wire_buffer(buckets_[b].count, model.device()));
      if (wire_views_.back().defined()) wire_views_.back().storage().release();
    }
  } else {
    flat_bucket_views();
  }
  // Where the optimizer reads each piece's averaged gradient: in place (stage 1), or the pieces back to back in a
  // buffer of their own (stage 2: the bucket's storage is released after its reduce-scatter).
  size_t total = 0;
  for (const FlatRange& r : owned_) total += r.count;
  if (held()) shard_grads_ = Tensor::zeros({static_cast<int64_t>(total)}, DType::F32, model.device());
  for (size_t i = 0, a = 0; i < owned_.size(); a += owned_[i].count, ++i)
    owned_grads_.push_back(held() ? view(shard_grads_, a, owned_[i].count) : view(grads_, owned_[i].offset, owned_[i].count));
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    const Chunks& c = chunks_[i];
    grad_pieces_.push_back(cut(views_[i], c));
    if (codec_.compressed()) wire_pieces_.push_back(cut(wire_views_[i], c));
    if (held()) {
      kept_chunk_.push_back(c.q > 0 ? owned_grads_[pieces_.index_at(b.offset + c.mine)] : Tensor());
      kept_rem_.push_back(c.rem > 0 ? owned_grads_[pieces_.index_at(b.offset + c.split)] : Tensor());
    }
    // Stage 3 (fsdp.h) gives the parameters storages of their own and cuts those.
    if (opts_.zero < 3) param_pieces_.push_back(cut(view(model.params(), b.offset, b.count), c));
  }
  if (opts_.zero == 2) {
    models::Model::ParamHooks hooks;
    hooks.before_backward = [this](size_t first, size_t end) { hold(first, end); };
    model.set_param_hooks(std::move(hooks));
  }
  start_comm();
}

Zero::~Zero() {
  stop_comm();
  if (held()) model_.set_param_hooks({});  // the model may outlive this strategy
}

std::string Zero::name() const { return fmt::format("zero-{}", opts_.zero); }

void Zero::hold(size_t first_param, size_t end_param) {
  map_.for_each(first_param, end_param, [&](size_t b) { hold_bucket(b); });
}

// The buckets' storages are gradients, not the step's activations: not counted as this thread's allocations.
void Zero::hold_bucket(size_t bucket) {
  Storage& s = views_[bucket].storage();
  if (s.resident()) return;
  const ThreadAllocationsPaused paused;
  s.reserve(stream_);  // from the device's memory pool, ordered on the compute stream (no cudaMalloc in the step)
  views_[bucket].zero_(stream_);
}

// After the reduce-scatter (which the compute stream has waited for) and the copies out: back to the pool in the
// compute stream's order, with no device synchronisation.
void Zero::drop_bucket(size_t bucket) {
  const ThreadAllocationsPaused paused;
  views_[bucket].storage().release(stream_);
  if (codec_.compressed()) wire_views_[bucket].storage().release(stream_);
}

size_t Zero::gradient_bytes() const { return held() ? shard_grads_.bytes() : grads_.bytes(); }

std::vector<std::shared_ptr<comm::Work>> Zero::reduce(size_t bucket) {
  if (held()) {  // a bucket backward never wrote (parameters without gradients) holds zeros
    hold_bucket(bucket);
    const ThreadAllocationsPaused paused;
    if (codec_.compressed()) wire_views_[bucket].storage().reserve(stream_);
  }
  codec_.encode(views_[bucket], wire_views_[bucket]);
  // Persistent (a backend may keep state per buffer address: Gloo's two-rank rings) only where the bucket's memory
  // stays put: stages 2 and 3 release it and reserve it again, at another address, every step.
  const comm::AllreduceOptions op = codec_.options(bucket_label(bucket), /*persistent=*/!held());
  Pieces& p = codec_.compressed() ? wire_pieces_[bucket] : grad_pieces_[bucket];
  std::vector<std::shared_ptr<comm::Work>> works;
  if (p.chunk.numel()) works.push_back(pg_.reduce_scatter(p.split, p.chunk, op));  // in place: this rank's chunk
  if (p.rem.numel()) works.push_back(pg_.allreduce(p.rem, op));
  return works;
}

void Zero::settle(size_t bucket) {
  Pieces& g = grad_pieces_[bucket];
  if (codec_.compressed()) {
    if (g.chunk.numel()) codec_.decode(wire_pieces_[bucket].chunk, g.chunk);
    if (g.rem.numel()) codec_.decode(wire_pieces_[bucket].rem, g.rem);
  }
  if (!held()) return;
  // Stage 2: this rank's averaged pieces move to the gradient shard; the bucket's storage goes.
  if (g.chunk.numel()) kept_chunk_[bucket].copy_from(g.chunk, stream_);
  if (g.rem.numel()) kept_rem_[bucket].copy_from(g.rem, stream_);
  drop_bucket(bucket);
}

void Zero::reduce_after_backward() {  // bucket by bucket, now
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (const auto& w : reduce(b)) w->block(stream_);
    settle(b);
  }
}

void Zero::after_update() {
  model_.params_written();  // the gathers write through param_pieces_ (a sharded update never marks the bf16 copy)
  for (size_t b = 0; b < param_pieces_.size(); ++b) {
    Pieces& p = param_pieces_[b];
    if (p.chunk.numel() == 0) continue;
    pg_.allgather(p.chunk, p.split, {.stream = stream_, .what = fmt::format("params bucket {}", b)})->block(stream_);
  }
}

double Zero::sharded_sum_squares(models::Kernels& k) {
  Tensor sums = Tensor::zeros({static_cast<int64_t>(owned_.size())}, DType::F64, device_);
  for (size_t i = 0; i < owned_.size(); ++i)
    if (!pieces_.by_all[i] || pg_.rank() == 0)
      k.sum_squares_to(owned_grads_[i].data<float>(), owned_grads_[i].numel(), sums.data<double>() + i);
  pg_.allreduce(sums, {.op = comm::ReduceOp::Sum, .stream = stream_, .what = "gradient norm"})->block(stream_);
  const Tensor host = sums.to(Device::cpu());  // synchronises the stream
  double total = 0.0;  // in piece order: the same on every rank
  for (size_t i = 0; i < owned_.size(); ++i) total += host.data<double>()[i];
  return total;
}

void Zero::sum_squares_to(models::Kernels& k, Tensor& out) {
  Tensor host = Tensor::empty({1}, DType::F64);
  host.data<double>()[0] = sharded_sum_squares(k);
  out.copy_from(host, stream_);
}

double Zero::sum_squares(models::Kernels& k) { return sharded_sum_squares(k); }

std::vector<std::string> Zero::shard_lines(size_t optimizer_state_bytes, int64_t accum_steps) const {
  size_t mine = 0;
  for (const FlatRange& r : owned_) mine += r.count;
  const size_t whole = model_.num_params();
  std::vector<std::string> lines;
  lines.push_back(fmt::format(
      "zero: stage {}: optimizer state sharded over {} ranks: this rank updates {} of {} parameters ({:.1f}%) and holds "
      "{} of optimizer state; {} bucket(s) reduce-scattered{}, {}",
      opts_.zero, pg_.size(), mine, whole, 100.0 * static_cast<double>(mine) / static_cast<double>(whole),
      format_bytes(optimizer_state_bytes), buckets_.size(), opts_.overlap ? " during backward" : " after backward",
      opts_.zero >= 3 ? "parameters gathered bucket by bucket in forward and backward (none after the step)"
                      : "parameters all-gathered after each step"));
  if (held()) {
    size_t largest = 0;
    for (const Bucket& b : buckets_) largest = std::max(largest, b.count * sizeof(float));
    lines.push_back(fmt::format(
        "zero: stage 2: gradients sharded too: this rank keeps {} of gradients between steps (DDP: {}); a bucket's "
        "full gradients (the largest {}) are held from backward reaching it to its reduce-scatter{}",
        format_bytes(gradient_bytes()), format_bytes(whole * sizeof(float)), format_bytes(largest),
        accum_steps > 1 ? ", and over the whole gradient accumulation" : ""));
  }
  return lines;
}

}  // namespace dpt::trainer
