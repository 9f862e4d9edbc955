// trainer/reducer.h: averages the model's flat gradient buffer across ranks after backward.
//
// This is the simple reduce-after-backward path: one all-reduce (Avg) over the whole contiguous buffer.
// The DDP engine issue adds buckets reduced while backward still runs; this class is where they go.
#pragma once

#include "comm/process_group.h"

namespace dpt::trainer {

class Reducer {
 public:
  // `stream`: the compute stream that produces the gradients and runs the optimizer (nullptr on the CPU).
  Reducer(comm::ProcessGroup& pg, Tensor grads, StreamHandle stream = nullptr)
      : pg_(pg), grads_(std::move(grads)), stream_(stream) {}
  // Every rank ends with the average gradient: on the CPU when this returns; on a GPU, for work enqueued on
  // the stream after this returns (the host does not wait). A no-op on one rank.
  void reduce();

 private:
  comm::ProcessGroup& pg_;
  Tensor grads_;
  StreamHandle stream_;
};

}  // namespace dpt::trainer
