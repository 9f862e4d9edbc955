// trainer/feeder.cpp: host batches to the device on a copy stream, double-buffered, ordered by events.
#include "trainer/feeder.h"

namespace dpt::trainer {

Feeder::Feeder(Device device, StreamHandle compute) : device_(device), compute_(compute) {
  if (!device_.is_cuda()) return;
  copy_ = std::make_unique<cuda::Stream>();
  for (auto& s : slots_) {
    s.copied = std::make_unique<cuda::Event>();
    s.consumed = std::make_unique<cuda::Event>();
  }
}

Feeder::~Feeder() {
  // Copies may still read pinned host buffers that are freed with the slots.
  if (copy_) {
    try {
      copy_->synchronize();
    } catch (...) {
    }
  }
}

const data::Batch& Feeder::put(data::Batch&& host, data::Loader& loader) {
  if (!device_.is_cuda()) {
    if (holds_passed_) loader.recycle(std::move(passed_));
    passed_ = std::move(host);
    holds_passed_ = true;
    return passed_;
  }
  Slot& s = slots_[next_++ % slots_.size()];
  if (s.holds_host) {
    s.copied->synchronize();  // long done: the compute of two steps ago waited for it
    loader.recycle(std::move(s.host));
    s.holds_host = false;
  }
  // The slot's device buffers may still be read by the compute that used them two steps ago.
  if (s.consumed_recorded) s.consumed->block(copy_->get());
  const auto rows = static_cast<int64_t>(host.size);
  const int64_t cols = host.features.dim(1);
  if (!s.features.defined() || s.features.dim(0) < rows || s.features.dim(1) != cols) {
    // Grown rarely (the first batch, or a larger one): make sure nothing still reads the old buffers.
    copy_->synchronize();
    cuda::stream_synchronize(compute_);
    s.features = Tensor::empty({rows, cols}, DType::F32, device_);
    s.labels = Tensor::empty({rows}, DType::I32, device_);
  }
  s.device.features = s.features.view(0, {rows, cols});
  s.device.labels = s.labels.view(0, {rows});
  s.device.size = host.size;
  s.device.index = host.index;
  s.device.features.copy_from(host.features, copy_->get());
  s.device.labels.copy_from(host.labels, copy_->get());
  s.copied->record(copy_->get());
  s.copied->block(compute_);
  s.host = std::move(host);
  s.holds_host = true;
  s.consumed_recorded = false;
  return s.device;
}

void Feeder::step_done() {
  if (!device_.is_cuda() || next_ == 0) return;
  Slot& s = slots_[(next_ - 1) % slots_.size()];
  s.consumed->record(compute_);
  s.consumed_recorded = true;
}

void Feeder::release(data::Loader& loader) {
  if (holds_passed_) {
    loader.recycle(std::move(passed_));
    holds_passed_ = false;
  }
  for (auto& s : slots_) {
    if (!s.holds_host) continue;
    s.copied->synchronize();
    loader.recycle(std::move(s.host));
    s.holds_host = false;
  }
}

}  // namespace dpt::trainer
