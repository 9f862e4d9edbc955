// trainer/parallel/data_parallel.cpp: what every strategy shares: the buckets' launch as backward completes them,
// the whole-model views, the log lines; the replica check.
#include "trainer/parallel/data_parallel.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>

#include "core/check.h"
#include "core/cuda.h"
#include "trainer/checkpoint.h"

namespace dpt::trainer {

DataParallel::DataParallel(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream,
                           const DataParallelOptions& opts)
    : pg_(pg), model_(model), device_(model.device()), stream_(stream), opts_(opts),
      codec_(opts.grad_dtype, pg.size(), stream) {
  std::vector<size_t> sizes;
  for (const auto& np : model.named_params()) sizes.push_back(np.param.numel());
  buckets_ = assign_buckets(sizes, opts_.bucket_cap_bytes, std::min(opts_.first_bucket_cap_bytes, opts_.bucket_cap_bytes));
  map_ = BucketMap(buckets_, sizes.size());
  missing_.assign(buckets_.size(), 0);
}

DataParallel::~DataParallel() = default;

void DataParallel::flat_bucket_views() {
  grads_ = model_.grads();
  wire_ = codec_.wire_buffer(grads_.numel(), grads_.device());
  for (const Bucket& b : buckets_) {
    const std::vector<int64_t> shape{static_cast<int64_t>(b.count)};
    views_.push_back(grads_.view(b.offset, shape));
    wire_views_.push_back(wire_.defined() ? wire_.view(b.offset, shape) : Tensor());
  }
}

void DataParallel::start_comm() {
  if (pg_.size() > 1 && opts_.overlap && !pg_.asynchronous())
    comm_ = std::make_unique<CommThread>(stream_ ? cuda::current_device() : -1);
}

std::string DataParallel::bucket_label(size_t bucket) { return fmt::format("bucket {}", bucket); }

void DataParallel::begin_backward(bool sync) {
  active_ = sync && pg_.size() > 1;
  next_launch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].end_param - buckets_[b].first_param;
  works_.clear();
}

void DataParallel::grads_ready(size_t first_param, size_t end_param) {
  if (!active_ || !opts_.overlap) return;
  for (size_t p = first_param; p < end_param; ++p) {
    size_t& m = missing_[map_.of(p)];
    DPT_CHECK_GT(m, 0u);  // a parameter reported twice in one backward
    --m;
  }
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) launch(next_launch_++);
}

void DataParallel::launch(size_t bucket) {
  if (pg_.asynchronous()) {  // enqueued now; blocked on and settled in finish_backward()
    works_.push_back(reduce(bucket));
    return;
  }
  comm_->submit([this, bucket] {
    for (const auto& w : reduce(bucket)) w->block(stream_);
    settle(bucket);
  });
}

void DataParallel::finish_backward() {
  if (!active_) return;
  active_ = false;
  if (!opts_.overlap) {
    reduce_after_backward();
    return;
  }
  // Buckets backward never completed (parameters without gradients) go now, still in order.
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  for (size_t b = 0; b < works_.size(); ++b) {  // asynchronous group: works_[b] is bucket b's
    for (const auto& w : works_[b]) w->block(stream_);
    settle(b);
  }
  works_.clear();
  if (comm_) comm_->wait_all();
}

void DataParallel::for_each_owned(const std::function<void(float*, size_t)>& fn) {
  for (Tensor& g : owned_grads_) fn(g.data<float>(), g.numel());
}

void DataParallel::with_full_params(const std::function<void()>& fn, bool /*changed*/) { fn(); }

void DataParallel::for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn) {
  // Read through the const accessor: the mutable one would drop the update's bf16 copy (Model::params16_current),
  // and the next forward would round the parameters again for nothing (the epoch's replica check reads them here).
  const models::Model& model = model_;
  for (const Bucket& b : buckets_) fn(b, model.params().view(b.offset, {static_cast<int64_t>(b.count)}));
}

std::vector<NamedTensor> DataParallel::model_state_on_host(bool lead) {
  return lead ? on_host(model_.state()) : std::vector<NamedTensor>{};
}

size_t DataParallel::gradient_bytes() const { return grads_.bytes(); }

size_t DataParallel::param_bytes() const { return model_.num_params() * sizeof(float); }

std::vector<std::string> DataParallel::setup_lines() const {
  std::vector<std::string> lines;
  const int world = pg_.size();
  if (world > 1)
    lines.push_back(fmt::format("reducer: {} bucket(s) of gradients{} {} {} backward, {}", buckets_.size(),
                                opts_.overlap ? "" : ",", bucket_collective(), opts_.overlap ? "during" : "after",
                                bucket_summary(buckets_)));
  if (codec_.compressed())
    lines.push_back(world > 1 ? fmt::format("reducer: gradients {} in bf16 (dist.grad_dtype = bf16): divided "
                                            "by the {} ranks, rounded to bfloat16, summed in bfloat16, widened back to "
                                            "fp32; half the bytes of fp32", bucket_collective(), world)
                              : "reducer: dist.grad_dtype = bf16 has no effect with one rank (nothing is all-reduced)");
  return lines;
}

std::vector<std::string> DataParallel::shard_lines(size_t /*optimizer_state_bytes*/, int64_t /*accum_steps*/) const {
  return {};
}

void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers,
                    DataParallel* dp) {
  if (pg.size() == 1) return;
  uLong crc_value = crc32(0L, nullptr, 0);
  auto add = [&](const Tensor& part) {
    const Tensor host = part.to(Device::cpu());
    crc_value = crc32(crc_value, static_cast<const Bytef*>(host.raw()), static_cast<uInt>(host.bytes()));
  };
  if (dp)
    dp->for_each_gathered([&](const Bucket&, const Tensor& params) { add(params); });
  else
    for (const Tensor& part : model.param_storage()) add(part);  // the flat buffer, or its parts in offset order
  if (with_buffers && model.buffers().numel()) add(model.buffers());
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

}  // namespace dpt::trainer
