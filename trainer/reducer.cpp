// trainer/reducer.cpp: bucket assignment, and the bucketed all-reduce overlapping backward.
#include "trainer/reducer.h"

#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>

#include "core/bfloat16_convert.h"
#include "core/cuda.h"
#include "core/memory.h"
#include "core/check.h"

namespace dpt::trainer {

std::vector<Bucket> assign_buckets(const std::vector<size_t>& sizes, size_t cap_bytes, size_t first_cap_bytes,
                                   size_t elem_bytes) {
  DPT_CHECK(cap_bytes > 0 && first_cap_bytes > 0 && elem_bytes > 0, "bucket caps {} and {}, element {} bytes",
            cap_bytes, first_cap_bytes, elem_bytes);
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  std::vector<Bucket> out;
  size_t end = sizes.size();  // the bucket being filled holds parameters [i, end)
  size_t bytes = 0;
  for (size_t i = sizes.size(); i-- > 0;) {
    const size_t cap = out.empty() ? first_cap_bytes : cap_bytes;
    const size_t b = sizes[i] * elem_bytes;
    if (end != i + 1 && bytes > 0 && bytes + b > cap) {  // close the bucket [i + 1, end)
      out.push_back({offsets[i + 1], offsets[end] - offsets[i + 1], i + 1, end});
      end = i + 1;
      bytes = 0;
    }
    bytes += b;
  }
  if (end > 0) out.push_back({0, offsets[end], 0, end});
  return out;
}

Reducer::Reducer(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const ReducerOptions& opts)
    : pg_(pg), model_(model), device_(model.device()), stream_(stream), opts_(opts) {
  DPT_CHECK(opts_.grad_dtype == DType::F32 || opts_.grad_dtype == DType::BF16,
            "the reducer all-reduces float32 or bfloat16 gradients, not {}", dtype_name(opts_.grad_dtype));
  DPT_CHECK(opts_.zero >= 0 && opts_.zero <= 3, "ZeRO stage {}: the reducer shards for stages 0 to 3", opts_.zero);
  std::vector<size_t> sizes;
  for (const auto& np : model.named_params()) sizes.push_back(np.param.numel());
  buckets_ = assign_buckets(sizes, opts_.bucket_cap_bytes, std::min(opts_.first_bucket_cap_bytes, opts_.bucket_cap_bytes));
  bucket_of_param_.assign(sizes.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t p = buckets_[b].first_param; p < buckets_[b].end_param; ++p) bucket_of_param_[p] = b;
  missing_.assign(buckets_.size(), 0);
  sharded_ = opts_.zero >= 1 && pg_.size() > 1;
  bucket_views(model);
  if (sharded_) {
    shard_buckets(model);
  } else {
    owned_ = {{0, grads_.numel()}};
    owned_grads_ = {grads_};
  }
  if (params_sharded()) setup_param_shard(model);
  if (held()) install_hooks(model);
  if (pg_.size() > 1 && opts_.overlap && !pg_.asynchronous()) {
    const int device = stream_ ? cuda::current_device() : -1;
    comm_thread_ = std::thread([this, device] { comm_loop(device); });
  }
}

void Reducer::bucket_views(models::Model& model) {
  const bool wire = compressed() && pg_.size() > 1;  // one rank communicates nothing: no bfloat16 copy then
  auto count = [&](size_t b) { return std::vector<int64_t>{static_cast<int64_t>(buckets_[b].count)}; };
  std::vector<std::pair<size_t, size_t>> ranges;  // each bucket's parameters
  for (const Bucket& b : buckets_) ranges.emplace_back(b.first_param, b.end_param);
  if (held()) {
    // Stage 2: every bucket its own gradient storage (and bfloat16 copy), held only while needed.
    views_ = model.split_grads(ranges);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      views_[b].storage().release();
      if (wire) {
        wire_views_.push_back(Tensor::empty(count(b), DType::BF16, model.device()));
        wire_views_.back().storage().release();
      }
    }
  } else {
    grads_ = model.grads();
    if (wire) wire_ = Tensor::empty({static_cast<int64_t>(grads_.numel())}, DType::BF16, grads_.device());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      views_.push_back(grads_.view(buckets_[b].offset, count(b)));
      if (wire) wire_views_.push_back(wire_.view(buckets_[b].offset, count(b)));
    }
  }
  if (params_sharded()) {
    param_views_ = model.split_params(ranges);  // the values copied: every rank's initial model, whole
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) param_views_.push_back(model.params().view(buckets_[b].offset, count(b)));
  }
}

void Reducer::setup_param_shard(const models::Model& model) {
  keep_params();  // this rank's pieces of the initial parameters; the whole buckets go
  gathered_.assign(buckets_.size(), Gathered::kYes);
  gather_work_.resize(buckets_.size());
  for (const Tensor& v : param_views_) resident_bytes_ += v.bytes();
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
  peak_bytes_ = 0;  // what training gathers, from here on
  users_.assign(buckets_.size(), 0);
  for (const auto& [first, end] : model.hook_ranges())
    for_each_bucket_of(first, end, [&](size_t b) { ++users_[b]; });
  for (auto& pos : order_pos_) pos.assign(buckets_.size(), kNone);
}

void Reducer::install_hooks(models::Model& model) {
  models::Model::ParamHooks hooks;
  hooks.before_backward = [this](size_t first, size_t end) {
    if (params_sharded()) use_params(first, end);
    hold(first, end);
  };
  if (params_sharded()) {
    hooks.before_forward = [this](size_t first, size_t end) { use_params(first, end); };
    hooks.after_forward = hooks.after_backward = [this](size_t first, size_t end) { done_with_params(first, end); };
    hooks.forward_begin = [this] { begin_pass(0); };
    hooks.backward_begin = [this] { begin_pass(1); };
    hooks.forward_end = hooks.backward_end = [this] { end_pass(); };
  }
  model.set_param_hooks(std::move(hooks));
}

void Reducer::shard_buckets(models::Model& model) {
  const auto world = static_cast<size_t>(pg_.size()), rank = static_cast<size_t>(pg_.rank());
  auto view = [](const Tensor& t, size_t offset, size_t count) { return t.view(offset, {static_cast<int64_t>(count)}); };
  // owned_ in increasing offset: buckets run from the end of the buffer to its start.
  for (size_t i = buckets_.size(); i-- > 0;) {
    const Bucket& b = buckets_[i];
    const size_t q = b.count / world, rem = b.count - world * q;
    if (q > 0) {
      owned_.push_back({b.offset + rank * q, q});
      owned_by_all_.push_back(false);
    }
    if (rem > 0) {
      owned_.push_back({b.offset + world * q, rem});
      owned_by_all_.push_back(true);
    }
  }
  // Where the optimizer reads each piece's averaged gradient: in place (stage 1), or the pieces back to back in
  // a buffer of their own (stage 2: the bucket's storage is released after its reduce-scatter).
  size_t total = 0;
  for (const FlatRange& r : owned_) total += r.count;
  if (held()) shard_grads_ = Tensor::zeros({static_cast<int64_t>(total)}, DType::F32, model.device());
  if (params_sharded()) shard_params_ = Tensor::zeros({static_cast<int64_t>(total)}, DType::F32, model.device());
  for (size_t i = 0, a = 0; i < owned_.size(); a += owned_[i].count, ++i) {
    owned_grads_.push_back(held() ? view(shard_grads_, a, owned_[i].count) : view(grads_, owned_[i].offset, owned_[i].count));
    if (params_sharded()) owned_params_.push_back(view(shard_params_, a, owned_[i].count));
  }
  auto piece_at = [&](size_t offset) {  // the index in owned_ of the piece starting at `offset`
    const auto it = std::lower_bound(owned_.begin(), owned_.end(), offset,
                                     [](const FlatRange& r, size_t o) { return r.offset < o; });
    DPT_CHECK(it != owned_.end() && it->offset == offset, "no owned piece at offset {}", offset);
    return static_cast<size_t>(it - owned_.begin());
  };
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    const Tensor& g = views_[i];  // the bucket's gradients, from its first element
    const size_t q = b.count / world, rem = b.count - world * q, mine = rank * q;
    const Tensor& pv = param_views_[i];  // the bucket's parameters, from its first element
    Pieces p{.split = view(g, 0, world * q), .chunk = view(g, mine, q), .rem = view(g, world * q, rem),
             .param_split = view(pv, 0, world * q), .param_chunk = view(pv, mine, q), .param_rem = view(pv, world * q, rem)};
    if (compressed()) {
      p.wire_split = view(wire_views_[i], 0, world * q);
      p.wire_chunk = view(wire_views_[i], mine, q);
      p.wire_rem = view(wire_views_[i], world * q, rem);
    }
    if (held()) {
      if (q > 0) p.kept_chunk = owned_grads_[piece_at(b.offset + mine)];
      if (rem > 0) p.kept_rem = owned_grads_[piece_at(b.offset + world * q)];
    }
    if (params_sharded()) {
      if (q > 0) p.kept_param_chunk = owned_params_[piece_at(b.offset + mine)];
      if (rem > 0) p.kept_param_rem = owned_params_[piece_at(b.offset + world * q)];
    }
    pieces_.push_back(std::move(p));
  }
}

void Reducer::hold(size_t first_param, size_t end_param) {
  for_each_bucket_of(first_param, end_param, [&](size_t b) { hold_bucket(b); });
}

// The buckets' storages are gradients, not the step's activations: not counted as this thread's allocations.
void Reducer::hold_bucket(size_t bucket) {
  Storage& s = views_[bucket].storage();
  if (s.resident()) return;
  const ThreadAllocationsPaused paused;
  s.reserve();
  views_[bucket].zero_(stream_);
}

void Reducer::drop_bucket(size_t bucket) {
  const ThreadAllocationsPaused paused;
  views_[bucket].storage().release();
  if (compressed()) wire_views_[bucket].storage().release();
}

size_t Reducer::gradient_bytes() const { return held() ? shard_grads_.bytes() : grads_.bytes(); }

size_t Reducer::param_bytes() const {
  if (params_sharded()) return shard_params_.bytes();
  size_t bytes = 0;
  for (const Tensor& v : param_views_) bytes += v.bytes();
  return bytes;
}

// ---- stage 3: the parameters gathered around their use ------------------------------------------------------------

Reducer::Gathered Reducer::gathered(size_t bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  return gathered_[bucket];
}

void Reducer::set_gathered(size_t bucket, Gathered g) {
  std::lock_guard<std::mutex> lock(mu_);
  gathered_[bucket] = g;
}

void Reducer::keep_params() {
  for (Pieces& p : pieces_) {
    if (p.param_chunk.numel()) p.kept_param_chunk.copy_from(p.param_chunk, stream_);
    if (p.param_rem.numel()) p.kept_param_rem.copy_from(p.param_rem, stream_);
  }
}

// The bucket's parameters from every rank's piece: this rank's chunk in, all chunks out; the remainder (the same on
// every rank) copied. On the communication thread or, without one, here.
void Reducer::gather_bucket(size_t bucket) {
  Pieces& p = pieces_[bucket];
  if (p.param_chunk.numel())
    pg_.allgather(p.kept_param_chunk, p.param_split, {.stream = stream_, .what = fmt::format("params bucket {}", bucket)})
        ->block(stream_);
  if (p.param_rem.numel()) p.param_rem.copy_from(p.kept_param_rem, stream_);
}

void Reducer::start_gather(size_t bucket) {
  {
    const ThreadAllocationsPaused paused;  // parameters, not the step's activations
    param_views_[bucket].storage().reserve();
  }
  resident_bytes_ += param_views_[bucket].bytes();
  peak_bytes_ = std::max(peak_bytes_, resident_bytes_);
  if (comm_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gathered_[bucket] = Gathered::kPending;
      queue_.push_back({Task::kGather, bucket});
    }
    cv_.notify_all();
    return;
  }
  if (pg_.asynchronous()) {  // enqueued on the group's stream; the compute stream waits for it in wait_gather
    Pieces& p = pieces_[bucket];
    if (p.param_chunk.numel())
      gather_work_[bucket] = pg_.allgather(p.kept_param_chunk, p.param_split,
                                           {.stream = stream_, .what = fmt::format("params bucket {}", bucket)});
    if (p.param_rem.numel()) p.param_rem.copy_from(p.kept_param_rem, stream_);
    set_gathered(bucket, Gathered::kPending);
    return;
  }
  gather_bucket(bucket);
  set_gathered(bucket, Gathered::kYes);
}

void Reducer::wait_gather(size_t bucket) {
  if (pg_.asynchronous()) {
    if (gather_work_[bucket]) gather_work_[bucket]->block(stream_);
    gather_work_[bucket].reset();
    set_gathered(bucket, Gathered::kYes);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return gathered_[bucket] == Gathered::kYes || error_ != nullptr; });
  if (gathered_[bucket] != Gathered::kYes) std::rethrow_exception(error_);
}

void Reducer::need_params(size_t bucket) {
  Gathered g = gathered(bucket);
  if (g == Gathered::kNo) {
    start_gather(bucket);
    g = gathered(bucket);
  }
  if (g == Gathered::kPending) wait_gather(bucket);
}

void Reducer::release_params(size_t bucket) {
  const Gathered g = gathered(bucket);
  if (g == Gathered::kNo) return;
  if (g == Gathered::kPending) wait_gather(bucket);
  {
    const ThreadAllocationsPaused paused;
    param_views_[bucket].storage().release();
  }
  resident_bytes_ -= param_views_[bucket].bytes();
  set_gathered(bucket, Gathered::kNo);
}

void Reducer::begin_pass(int pass) {
  pass_ = pass;
  left_ = users_;
}

void Reducer::use_params(size_t first_param, size_t end_param) {
  std::vector<size_t>& order = order_[pass_];
  std::vector<size_t>& pos = order_pos_[pass_];
  for_each_bucket_of(first_param, end_param, [&](size_t b) {
    need_params(b);
    if (!recorded_[pass_]) {  // the first pass of its kind records the order buckets are first used in
      if (pos[b] == kNone) {
        pos[b] = order.size();
        order.push_back(b);
      }
    } else if (pos[b] != kNone && pos[b] + 1 < order.size() && gathered(order[pos[b] + 1]) == Gathered::kNo) {
      start_gather(order[pos[b] + 1]);  // prefetch: the next bucket's gather runs while this one's modules compute
    }
  });
}

void Reducer::done_with_params(size_t first_param, size_t end_param) {
  for_each_bucket_of(first_param, end_param, [&](size_t b) {
    if (left_[b] > 0 && --left_[b] == 0) release_params(b);
  });
}

void Reducer::end_pass() {
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
  recorded_[pass_] = true;
}

void Reducer::for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (params_sharded()) need_params(b);
    fn(buckets_[b], param_views_[b]);
    if (params_sharded()) release_params(b);
  }
}

void Reducer::with_full_params(const std::function<void()>& fn, bool changed) {
  if (!params_sharded()) {
    fn();
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (gathered(b) == Gathered::kNo) start_gather(b);
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

Reducer::~Reducer() {
  if (held()) model_.set_param_hooks({});  // the model may outlive this reducer
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (comm_thread_.joinable()) comm_thread_.join();
}

void Reducer::comm_loop(int cuda_device) {
  try {
    if (cuda_device >= 0) cuda::set_device(cuda_device);  // staging GPU buckets from this thread
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const Task task = queue_.front();
    queue_.pop_front();
    const size_t b = task.bucket;
    const bool failed = error_ != nullptr;
    lock.unlock();
    // After a failure nothing more is sent: the step is lost, and finish() reports the first error.
    std::exception_ptr err;
    if (!failed) {
      try {
        if (task.kind == Task::kGather) {
          gather_bucket(b);
        } else {
          for (const auto& w : reduce(b)) w->block(stream_);
          settle(b);
        }
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (task.kind == Task::kGather) {
      if (!err && !failed) gathered_[b] = Gathered::kYes;  // else its waiter sees error_
    } else {
      ++done_;
    }
    cv_.notify_all();
  }
}

// A bucket's all-reduce, as hang reports name it: "allreduce #9412 (bucket 0, step 4711)".
std::string Reducer::bucket_label(size_t bucket) { return fmt::format("bucket {}", bucket); }

std::vector<std::shared_ptr<comm::Work>> Reducer::reduce(size_t bucket) {
  if (held()) {  // a bucket backward never wrote (parameters without gradients) holds zeros
    hold_bucket(bucket);
    const ThreadAllocationsPaused paused;
    if (compressed()) wire_views_[bucket].storage().reserve();
  }
  // Persistent (a backend may keep state per buffer address: Gloo's two-rank rings) only where the bucket's memory
  // stays put: stages 2 and 3 release it and reserve it again, at another address, every step.
  const comm::AllreduceOptions avg{.op = comm::ReduceOp::Avg, .stream = stream_, .persistent = !held(),
                                   .what = bucket_label(bucket)};
  comm::AllreduceOptions sum = avg;
  sum.op = comm::ReduceOp::Sum;  // bf16: the gradients were divided by the world size when rounded
  if (compressed()) to_bfloat16(views_[bucket], wire_views_[bucket], static_cast<float>(pg_.size()), stream_);
  if (!sharded_) {
    if (compressed()) return {pg_.allreduce(wire_views_[bucket], sum)};
    return {pg_.allreduce(views_[bucket], avg)};
  }
  Pieces& p = pieces_[bucket];
  Tensor &split = compressed() ? p.wire_split : p.split, &chunk = compressed() ? p.wire_chunk : p.chunk,
         &rem = compressed() ? p.wire_rem : p.rem;
  const comm::AllreduceOptions& op = compressed() ? sum : avg;
  std::vector<std::shared_ptr<comm::Work>> works;
  if (chunk.numel()) works.push_back(pg_.reduce_scatter(split, chunk, op));  // in place: this rank's chunk
  if (rem.numel()) works.push_back(pg_.allreduce(rem, op));
  return works;
}

void Reducer::settle(size_t bucket) {
  if (!sharded_) {
    if (compressed()) from_bfloat16(wire_views_[bucket], views_[bucket], stream_);
    return;
  }
  Pieces& p = pieces_[bucket];
  if (compressed()) {
    if (p.chunk.numel()) from_bfloat16(p.wire_chunk, p.chunk, stream_);
    if (p.rem.numel()) from_bfloat16(p.wire_rem, p.rem, stream_);
  }
  if (!held()) return;
  // Stage 2: this rank's averaged pieces move to the gradient shard; the bucket's storage goes.
  if (p.chunk.numel()) p.kept_chunk.copy_from(p.chunk, stream_);
  if (p.rem.numel()) p.kept_rem.copy_from(p.rem, stream_);
  drop_bucket(bucket);
}

void Reducer::reduce_bf16(Tensor& grads, Tensor& wire, const std::string& what) {
  to_bfloat16(grads, wire, static_cast<float>(pg_.size()), stream_);
  pg_.allreduce(wire, {.op = comm::ReduceOp::Sum, .stream = stream_, .persistent = true, .what = what})->block(stream_);
  from_bfloat16(wire, grads, stream_);
}

void Reducer::begin(bool sync) {
  active_ = sync && pg_.size() > 1;
  next_launch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].end_param - buckets_[b].first_param;
  works_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
  launched_ = done_ = 0;
}

void Reducer::grads_ready(size_t first_param, size_t end_param) {
  if (!active_ || !opts_.overlap) return;
  for (size_t p = first_param; p < end_param; ++p) {
    size_t& m = missing_[bucket_of_param_[p]];
    DPT_CHECK_GT(m, 0u);  // a parameter reported twice in one backward
    --m;
  }
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) launch(next_launch_++);
}

void Reducer::launch(size_t bucket) {
  if (pg_.asynchronous()) {  // enqueued now; blocked on and settled in finish()
    works_.push_back(reduce(bucket));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({Task::kReduce, bucket});
    ++launched_;
  }
  cv_.notify_all();
}

void Reducer::finish() {
  if (!active_) return;
  active_ = false;
  if (!opts_.overlap) {
    if (sharded_) {  // bucket by bucket, now
      for (size_t b = 0; b < buckets_.size(); ++b) {
        for (const auto& w : reduce(b)) w->block(stream_);
        settle(b);
      }
    } else if (compressed()) {
      reduce_bf16(grads_, wire_, "all gradients");
    } else {
      pg_.allreduce(grads_, {.op = comm::ReduceOp::Avg, .stream = stream_, .persistent = true,
                             .what = "all gradients"})->block(stream_);
    }
    return;
  }
  // Buckets backward never completed (parameters without gradients) go now, still in order.
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  for (size_t b = 0; b < works_.size(); ++b) {  // asynchronous group: works_[b] is bucket b's
    for (const auto& w : works_[b]) w->block(stream_);
    settle(b);
  }
  works_.clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == launched_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;  // the group itself stays broken; the caller decides
    std::rethrow_exception(e);
  }
}

void Reducer::for_each_owned(const std::function<void(float*, size_t)>& fn) {
  for (Tensor& g : owned_grads_) fn(g.data<float>(), g.numel());
}

double Reducer::sharded_sum_squares(models::Kernels& k) {
  Tensor sums = Tensor::zeros({static_cast<int64_t>(owned_.size())}, DType::F64, device_);
  for (size_t i = 0; i < owned_.size(); ++i)
    if (!owned_by_all_[i] || pg_.rank() == 0)
      k.sum_squares_to(owned_grads_[i].data<float>(), owned_grads_[i].numel(), sums.data<double>() + i);
  pg_.allreduce(sums, {.op = comm::ReduceOp::Sum, .stream = stream_, .what = "gradient norm"})->block(stream_);
  const Tensor host = sums.to(Device::cpu());  // synchronises the stream
  double total = 0.0;  // in piece order: the same on every rank
  for (size_t i = 0; i < owned_.size(); ++i) total += host.data<double>()[i];
  return total;
}

void Reducer::sum_squares_to(models::Kernels& k, Tensor& out) {
  if (!sharded_) {
    k.sum_squares_to(grads_.data<float>(), grads_.numel(), out.data<double>());
    return;
  }
  Tensor host = Tensor::empty({1}, DType::F64);
  host.data<double>()[0] = sharded_sum_squares(k);
  out.copy_from(host, stream_);
}

double Reducer::sum_squares(models::Kernels& k) {
  return sharded_ ? sharded_sum_squares(k) : k.sum_squares(grads_.data<float>(), grads_.numel());
}

void Reducer::gather_params() {
  if (!sharded_ || params_sharded()) return;  // stage 3: each bucket is gathered when a module needs it
  for (size_t b = 0; b < pieces_.size(); ++b) {
    Pieces& p = pieces_[b];
    if (p.param_chunk.numel() == 0) continue;
    pg_.allgather(p.param_chunk, p.param_split, {.stream = stream_, .what = fmt::format("params bucket {}", b)})
        ->block(stream_);
  }
}

void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers,
                    Reducer* reducer) {
  if (pg.size() == 1) return;
  uLong crc_value = crc32(0L, nullptr, 0);
  auto add = [&](const Tensor& part) {
    const Tensor host = part.to(Device::cpu());
    crc_value = crc32(crc_value, static_cast<const Bytef*>(host.raw()), static_cast<uInt>(host.bytes()));
  };
  if (reducer)
    reducer->for_each_gathered([&](const Bucket&, const Tensor& params) { add(params); });
  else
    for (const Tensor& part : model.param_storage()) add(part);  // the flat buffer, or its parts in offset order
  if (with_buffers && model.buffers().numel()) {
    const Tensor b = model.buffers().to(Device::cpu());
    crc_value = crc32(crc_value, static_cast<const Bytef*>(b.raw()), static_cast<uInt>(b.bytes()));
  }
  const auto crc = static_cast<int64_t>(crc_value);
  Tensor c = Tensor::empty({2}, DType::I64);
  c.data<int64_t>()[0] = crc;
  c.data<int64_t>()[1] = -crc;
  pg.allreduce(c, {.op = comm::ReduceOp::Max, .what = "replica check"})->wait();
  if (c.data<int64_t>()[0] != -c.data<int64_t>()[1])
    DPT_THROW(InternalError, "[rank {}] parameters{} differ between ranks {} (CRC32 {:08x} here)", pg.rank(),
              with_buffers ? " or buffers" : "", epoch > 0 ? fmt::format("after epoch {}", epoch) : "at the start",
              static_cast<uint32_t>(crc));
}

std::string bucket_summary(const std::vector<Bucket>& buckets) {
  std::vector<std::string> parts;
  for (const auto& b : buckets) parts.push_back(fmt::format("{:.2f} MB", static_cast<double>(b.count) * 4 / 1e6));
  return fmt::format("sizes {} (last layers first)", fmt::join(parts, ", "));
}

}  // namespace dpt::trainer
