// trainer/reducer.h: averages the model's flat gradient buffer across ranks after backward.
//
// This is the simple reduce-after-backward path: one all-reduce (Avg) over the whole contiguous buffer.
// The DDP engine issue adds buckets reduced while backward still runs; this class is where they go.
#pragma once

#include "comm/process_group.h"

namespace dpt::trainer {

class Reducer {
 public:
  Reducer(comm::ProcessGroup& pg, Tensor grads) : pg_(pg), grads_(std::move(grads)) {}
  // Blocks until every rank holds the average gradient. A no-op on one rank.
  void reduce();

 private:
  comm::ProcessGroup& pg_;
  Tensor grads_;
};

}  // namespace dpt::trainer
