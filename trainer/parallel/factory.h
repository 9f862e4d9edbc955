// trainer/parallel/factory.h: the data-parallel strategy a run asks for (data_parallel.h).
#pragma once

#include <memory>

#include "trainer/parallel/data_parallel.h"

namespace dpt::trainer {

// The strategy for dist.zero = opts.zero on `pg`: DDP for stage 0 or one rank, ZeRO for stages 1 and 2, FSDP for
// stage 3. `stream`: the compute stream that produces the gradients and runs the optimizer (nullptr on the CPU).
// InternalError for a stage outside 0..3 or a gradient dtype other than F32, BF16.
std::unique_ptr<DataParallel> make_data_parallel(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream,
                                                 const DataParallelOptions& opts = {});

}  // namespace dpt::trainer
