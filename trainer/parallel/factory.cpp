// trainer/parallel/factory.cpp: DDP, ZeRO or FSDP from dist.zero and the world size.
#include "trainer/parallel/factory.h"

#include "core/check.h"
#include "trainer/parallel/ddp.h"
#include "trainer/parallel/fsdp.h"
#include "trainer/parallel/zero.h"

namespace dpt::trainer {

std::unique_ptr<DataParallel> make_data_parallel(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream,
                                                 const DataParallelOptions& opts) {
  DPT_CHECK(opts.zero >= 0 && opts.zero <= 3, "ZeRO stage {}: the strategies shard for stages 0 to 3", opts.zero);
  if (opts.zero == 0 || pg.size() == 1) return std::make_unique<Ddp>(pg, model, stream, opts);
  if (opts.zero == 3) return std::make_unique<Fsdp>(pg, model, stream, opts);
  return std::make_unique<Zero>(pg, model, stream, opts);
}

}  // namespace dpt::trainer
