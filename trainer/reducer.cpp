// trainer/reducer.cpp: gradient averaging.
#include "trainer/reducer.h"

namespace dpt::trainer {

void Reducer::reduce() {
  if (pg_.size() == 1) return;
  pg_.allreduce(grads_, {.op = comm::ReduceOp::Avg, .stream = stream_})->block(stream_);
}

}  // namespace dpt::trainer
