// trainer/feeder.h: Feeder: moves the Loader's host batches onto the training device.
//
// On the CPU a batch passes through (and goes back to its Loader for reuse at the next call). On a GPU the
// Loader fills pinned host batches; put() copies one into one of two device slots with cudaMemcpyAsync on
// the feeder's own copy stream, records an event, and makes the compute stream wait for it: the host goes
// on at once, so the copy of batch i+1 overlaps the compute of batch i. A slot is not overwritten before the
// compute that read it (two steps back) has passed step_done()'s event; a host batch goes back to the
// Loader once its copy has finished. Ordering is by events throughout; the host never waits for compute.
#pragma once

#include <array>
#include <memory>

#include "core/cuda.h"
#include "data/loader.h"

namespace dpt::trainer {

class Feeder {
 public:
  Feeder(Device device, StreamHandle compute);
  ~Feeder();
  Feeder(const Feeder&) = delete;
  Feeder& operator=(const Feeder&) = delete;

  // The batch on the device, valid until the put() after next. `loader` gets the host buffers back.
  const data::Batch& put(data::Batch&& host, data::Loader& loader);
  // Call once the step that used the last put() batch has been enqueued on the compute stream.
  void step_done();
  // Hands every host batch still held back to `loader` (waiting for their copies): before `loader` goes.
  void release(data::Loader& loader);

 private:
  struct Slot {
    data::Batch host;       // the host batch whose copy fills this slot
    bool holds_host = false;
    Tensor features, labels;  // device buffers, grown to the largest batch
    data::Batch device;     // views of them, as handed out
    std::unique_ptr<cuda::Event> copied, consumed;
    bool consumed_recorded = false;
  };

  Device device_;
  StreamHandle compute_;
  std::unique_ptr<cuda::Stream> copy_;
  std::array<Slot, 2> slots_;
  size_t next_ = 0;
  data::Batch passed_;  // CPU: the batch handed out last, recycled at the next put()
  bool holds_passed_ = false;
};

}  // namespace dpt::trainer
