// comm/process_group.cpp: reduce_op_name and the ProcessGroup defaults, which fail with
// "backend X does not support Y" for the operations a backend leaves out.
#include "comm/process_group.h"

#include "core/check.h"

namespace dpt::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

void ProcessGroup::unsupported(const char* op) const {
  DPT_THROW(UnsupportedError, "backend {} does not support {}", backend(), op);
}

std::shared_ptr<Work> ProcessGroup::allreduce(Tensor&, const AllreduceOptions&) { unsupported("allreduce"); }
std::shared_ptr<Work> ProcessGroup::broadcast(Tensor&, const BroadcastOptions&) { unsupported("broadcast"); }
std::shared_ptr<Work> ProcessGroup::allgather(const Tensor&, Tensor&, const AllgatherOptions&) {
  unsupported("allgather");
}
std::shared_ptr<Work> ProcessGroup::reduce_scatter(const Tensor&, Tensor&, const AllreduceOptions&) {
  unsupported("reduce_scatter");
}
std::shared_ptr<Work> ProcessGroup::barrier() { unsupported("barrier"); }

}  // namespace dpt::comm
