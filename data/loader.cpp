// data/loader.cpp: Loader: one producer thread (plus optional helpers filling rows), a bounded queue of
// prepared batches, in-order delivery.
#include "data/loader.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "core/cuda.h"

namespace dpt::data {

Batch allocate_batch(size_t size, size_t feature_count, size_t capacity, bool pinned) {
  capacity = std::max(capacity, size);
  const auto rows = static_cast<int64_t>(capacity), cols = static_cast<int64_t>(feature_count);
  Batch batch;
  batch.features_buffer = pinned ? Tensor::empty_pinned({rows, cols}) : Tensor::empty({rows, cols});
  batch.labels_buffer = pinned ? Tensor::empty_pinned({rows}, DType::I32) : Tensor::empty({rows}, DType::I32);
  batch.features = batch.features_buffer.view(0, {static_cast<int64_t>(size), cols});
  batch.labels = batch.labels_buffer.view(0, {static_cast<int64_t>(size)});
  batch.size = size;
  return batch;
}

void Loader::recycle(Batch&& batch) {
  if (!batch.features_buffer.defined() || batch.features_buffer.dim(0) != static_cast<int64_t>(capacity_))
    return;
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < opts_.prefetch + 4) free_.push_back(std::move(batch));
}

Loader::Loader(const Dataset& dataset, std::vector<size_t> indices, LoaderOptions opts, size_t start_batch)
    : dataset_(dataset), indices_(std::move(indices)), opts_(opts), start_batch_(start_batch) {
  if (opts_.batch_size == 0) DPT_THROW(ConfigError, "loader: batch_size must be >= 1, got 0");
  if (opts_.prefetch == 0) DPT_THROW(ConfigError, "loader: prefetch must be >= 1, got 0");
  if (opts_.workers == 0) DPT_THROW(ConfigError, "loader: workers must be >= 1, got 0");
  const size_t n = indices_.size();
  capacity_ = std::max<size_t>(1, std::min(opts_.batch_size, n));
  num_batches_ = opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
  if (start_batch_ > num_batches_) {
    DPT_THROW(ConfigError, "loader: cannot resume at batch {} of an epoch of {} batches ({} examples, batch size {})",
              start_batch_, num_batches_, n, opts_.batch_size);
  }
  const size_t size = dataset_.size();
  for (size_t i = 0; i < n; ++i) {
    DPT_CHECK(indices_[i] < size, "index {} at position {} is past the end of {} ({} examples)", indices_[i], i,
              dataset_.name(), size);
  }
  // The current CUDA device is per thread: pinned allocations on the producer thread must use the consumer's
  // device, or every rank would open a context on GPU 0.
  if (opts_.pin_memory && cuda::device_count() > 0) device_ = cuda::current_device();
  try {
    for (size_t w = 1; w < opts_.workers; ++w) helpers_.emplace_back([this] { helper_loop(); });
  } catch (...) {  // could not start a thread: stop those that did start
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      helpers_exit_ = true;
    }
    job_ready_.notify_all();
    for (auto& t : helpers_) t.join();
    throw;
  }
  producer_ = std::thread([this] { produce(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  space_.notify_all();
  if (producer_.joinable()) producer_.join();  // its helpers see stop_ and finish their rows first
  {
    std::lock_guard<std::mutex> lock(job_mu_);
    helpers_exit_ = true;
  }
  job_ready_.notify_all();
  for (auto& t : helpers_) t.join();
}

void Loader::fill_row(Batch& batch, size_t first, size_t k) const {
  // The example this thread is likely to read two rows on (rows are claimed in turn by `workers` threads), into the
  // cache now: in a shuffled epoch every image's first read otherwise waits for memory (Fashion-MNIST's get() ran
  // at 2.0 M examples a second in a shuffled order, 4.6 M with this hint, one thread of an AMD EPYC).
  const size_t ahead = first + k + kPrefetchRows * opts_.workers;
  if (ahead < indices_.size()) dataset_.prefetch(indices_[ahead]);
  const size_t features = dataset_.feature_count();
  int32_t& y = batch.labels.data<int32_t>()[k];
  y = dataset_.get(indices_[first + k], batch.features.data<float>() + k * features);
  // Checked here, for every device: a GPU loss kernel cannot throw, it would only train to NaN.
  const auto classes = static_cast<int32_t>(dataset_.num_classes());
  if ((y < 0 && y != kLeftOut) || y >= classes)
    DPT_THROW(IoError, "{}: example {} has label {}, outside [0, {})", dataset_.name(), indices_[first + k], y, classes);
}

bool Loader::fill(Batch& batch, size_t batch_index) {
  const size_t first = batch_index * opts_.batch_size;
  if (helpers_.empty()) {
    for (size_t k = 0; k < batch.size; ++k) {
      if (stop_.load(std::memory_order_relaxed)) return false;
      fill_row(batch, first, k);
    }
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(job_mu_);
    job_.batch = &batch;
    job_.first = first;
    job_.next.store(0);
    job_.failed.store(false);
    job_.helpers_done = 0;
    job_.error = nullptr;
    ++job_.generation;
  }
  job_ready_.notify_all();
  fill_rows();
  std::unique_lock<std::mutex> lock(job_mu_);
  job_done_.wait(lock, [this] { return job_.helpers_done == helpers_.size(); });
  if (job_.error) std::rethrow_exception(job_.error);
  return !stop_.load();
}

void Loader::fill_rows() {
  Batch& batch = *job_.batch;
  for (;;) {
    if (stop_.load(std::memory_order_relaxed) || job_.failed.load(std::memory_order_relaxed)) return;
    // Rows are claimed in increasing order, so when row k fails every earlier row is already claimed and
    // will be filled (or fail too): the earliest failure is the one a single worker would have met.
    const size_t k = job_.next.fetch_add(1);
    if (k >= batch.size) return;
    try {
      fill_row(batch, job_.first, k);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job_mu_);
      if (!job_.error || k < job_.error_row) {
        job_.error = std::current_exception();
        job_.error_row = k;
      }
      job_.failed.store(true);
    }
  }
}

void Loader::helper_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(job_mu_);
      job_ready_.wait(lock, [&] { return helpers_exit_ || job_.generation != seen; });
      if (helpers_exit_) return;
      seen = job_.generation;
    }
    fill_rows();
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      ++job_.helpers_done;
    }
    job_done_.notify_all();
  }
}

void Loader::produce() {
  try {
    if (device_ >= 0) cuda::set_device(device_);
    for (size_t b = start_batch_; b < num_batches_; ++b) {
      const size_t size = std::min(opts_.batch_size, indices_.size() - b * opts_.batch_size);
      Batch batch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!free_.empty()) {
          batch = std::move(free_.back());
          free_.pop_back();
        }
      }
      if (batch.features_buffer.defined()) {
        batch.features = batch.features_buffer.view(0, {static_cast<int64_t>(size), batch.features_buffer.dim(1)});
        batch.labels = batch.labels_buffer.view(0, {static_cast<int64_t>(size)});
        batch.size = size;
      } else {
        batch = allocate_batch(size, dataset_.feature_count(), capacity_, opts_.pin_memory);
      }
      batch.index = b;
      if (!fill(batch, b)) break;
      std::unique_lock<std::mutex> lock(mu_);
      space_.wait(lock, [this] { return stop_.load() || queue_.size() < opts_.prefetch; });
      if (stop_.load()) break;
      queue_.push_back(std::move(batch));
      lock.unlock();
      ready_.notify_one();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    producer_done_ = true;
  }
  ready_.notify_all();
}

std::optional<Batch> Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !producer_done_) {
    const auto start = std::chrono::steady_clock::now();
    ready_.wait(lock, [this] { return !queue_.empty() || producer_done_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (!queue_.empty()) {
    Batch batch = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    space_.notify_one();
    return batch;
  }
  if (error_) std::rethrow_exception(error_);
  return std::nullopt;
}

}  // namespace dpt::data
