// comm/mpi_backend.cpp: MpiProcessGroup: MPI start-up and shut-down (counted across groups), the rank/size
// check against the launcher's environment, and the collectives over a duplicate of MPI_COMM_WORLD.
#include "comm/mpi_backend.h"

#include <climits>
#include <cstring>
#include <exception>

#include <spdlog/spdlog.h>

#include "comm/collective_checks.h"
#include "comm/mpi_check.h"
#include "core/bfloat16.h"
#include "core/check.h"

namespace dpt::comm {

namespace detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    len = snprintf(text, sizeof(text), "MPI error code %d", code);
  }
  std::string rank = ::dpt::detail::rank_prefix();
  if (rank.empty()) {
    int initialized = 0;
    int finalized = 0;
    int r = -1;
    if (MPI_Initialized(&initialized) == MPI_SUCCESS && initialized && MPI_Finalized(&finalized) == MPI_SUCCESS &&
        !finalized && MPI_Comm_rank(MPI_COMM_WORLD, &r) == MPI_SUCCESS) {
      rank = fmt::format("[rank {}] ", r);
    }
  }
  throw CommError(fmt::format("{}{} failed: {} ({})", rank, call, std::string(text, static_cast<size_t>(len)),
                              ::dpt::detail::location(file, line)));
}

}  // namespace detail

namespace {

// MPI is process-wide: count the groups, and remember whether one of them initialised MPI.
struct MpiLifetime {
  std::mutex mu;
  int live_groups = 0;
  bool we_initialized = false;
};
MpiLifetime& lifetime() {
  static MpiLifetime l;
  return l;
}

// The MPI type of one element, so counts are element counts (not bytes) and reach INT_MAX elements.
MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16: return MPI_UINT16_T;  // moved as bits; summed by the bf16 operator (bf16_sum_op)
  }
  DPT_CHECK(false, "no MPI type for {}", dtype_name(d));
  return MPI_DATATYPE_NULL;
}

// The bfloat16 sum (MPI has no bfloat16 type): a commutative user operator over 2-byte elements moved as
// MPI_UINT16_T; inout[i] = in[i] + inout[i], the addition in float32 rounded back to bfloat16.
void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const BFloat16*>(in);
  auto* b = static_cast<BFloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_add(a[i], b[i]);
}

// MPI counts are int.
int mpi_count(const char* op, size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) {
    DPT_THROW(UnsupportedError, "backend mpi does not support {} of more than {} elements (got {})", op, INT_MAX, n);
  }
  return static_cast<int>(n);
}

}  // namespace

struct MpiProcessGroup::Impl {
  int rank = 0;
  int size = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL;  // bf16_sum_op, for BF16 allreduce
  bool failed = false;  // a collective failed: peers may be stuck, so do not finalise

  ~Impl() {
    // MPI_Op_free is local; it must come before MPI_Finalize.
    if (bf16_sum != MPI_OP_NULL) {
      int rc = MPI_Op_free(&bf16_sum);
      if (rc != MPI_SUCCESS) spdlog::warn("MPI_Op_free failed with code {}", rc);
    }
    // MPI_Comm_free and MPI_Finalize synchronise with the other ranks: skip them when this rank is failing.
    bool failing = failed || std::uncaught_exceptions() > 0;
    if (comm != MPI_COMM_NULL && !failing) {
      int rc = MPI_Comm_free(&comm);
      if (rc != MPI_SUCCESS) spdlog::warn("MPI_Comm_free failed with code {}", rc);
    }
    auto& l = lifetime();
    std::lock_guard lock(l.mu);
    if (--l.live_groups > 0 || !l.we_initialized) return;
    if (failing) {
      spdlog::warn("not calling MPI_Finalize: this rank is failing and the others may never reach it");
      return;
    }
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) spdlog::warn("MPI_Finalize failed with code {}", rc);
  }
};

std::unique_ptr<MpiProcessGroup::Impl> MpiProcessGroup::start(const DistEnv* expected) {
  auto& l = lifetime();
  {
    std::lock_guard lock(l.mu);
    int initialized = 0;
    int finalized = 0;
    DPT_MPI_CHECK(MPI_Initialized(&initialized));
    DPT_MPI_CHECK(MPI_Finalized(&finalized));
    if (finalized) {
      DPT_THROW(CommError, "MPI was already finalised in this process: MPI can be started once per process");
    }
    if (!initialized) {
      int provided = 0;
      // Errors inside MPI_Init_thread are fatal by MPI's default handler; nothing to catch there.
      DPT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
      l.we_initialized = true;
      if (provided < MPI_THREAD_SERIALIZED) {
        spdlog::warn("MPI provides thread level {} < MPI_THREAD_SERIALIZED: call collectives from the main thread",
                     provided);
      }
    }
    ++l.live_groups;
  }
  auto impl = std::make_unique<Impl>();  // from here its destructor balances live_groups
  DPT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  // Our own communicator: our collectives cannot match messages of other MPI users in this process.
  DPT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm));
  DPT_MPI_CHECK(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN));
  DPT_MPI_CHECK(MPI_Comm_rank(impl->comm, &impl->rank));
  DPT_MPI_CHECK(MPI_Comm_size(impl->comm, &impl->size));
  DPT_MPI_CHECK(MPI_Op_create(&bf16_sum_op, /*commute=*/1, &impl->bf16_sum));
  if (expected && (expected->rank != impl->rank || expected->world_size != impl->size)) {
    DPT_THROW(ConfigError,
              "MPI says this process is rank {} of {}, but the environment (launcher {}) says rank {} of {}: the mpi "
              "backend needs the processes started by mpirun (or srun with a PMI plugin); use backend gloo otherwise",
              impl->rank, impl->size, launcher_name(expected->launcher), expected->rank, expected->world_size);
  }
  return impl;
}

bool MpiProcessGroup::finalized() {
  int done = 0;
  DPT_MPI_CHECK(MPI_Finalized(&done));
  return done != 0;
}

MpiProcessGroup::MpiProcessGroup(const DistEnv* expected) : MpiProcessGroup(start(expected)) {}

MpiProcessGroup::MpiProcessGroup(std::unique_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size), impl_(std::move(impl)) {}

MpiProcessGroup::~MpiProcessGroup() = default;

template <class F>
void MpiProcessGroup::run(const char* op, F&& f) {
  std::lock_guard lock(mu_);
  try {
    f();
  } catch (const CommError&) {
    impl_->failed = true;
    throw;
  }
}

std::shared_ptr<Work> MpiProcessGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  detail::check_host_tensor(backend(), "allreduce", tensor);
  detail::check_reduce_dtype(backend(), "allreduce", tensor, opts.op);
  if (tensor.numel() > 0) {
    int count = mpi_count("allreduce", tensor.numel());
    MPI_Op op = opts.op == ReduceOp::Max ? MPI_MAX : MPI_SUM;  // Avg: Sum, divided below
    if (tensor.dtype() == DType::BF16) op = impl_->bf16_sum;  // Sum only (checked above)
    run("allreduce", [&] {
      DPT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, tensor.raw(), count, mpi_type(tensor.dtype()), op, impl_->comm));
    });
    if (opts.op == ReduceOp::Avg) detail::divide_in_place(tensor, size());
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> MpiProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  detail::check_host_tensor(backend(), "broadcast", tensor);
  detail::check_root(backend(), opts.root, size());
  if (tensor.numel() > 0) {
    int count = mpi_count("broadcast", tensor.numel());
    run("broadcast", [&] {
      DPT_MPI_CHECK(MPI_Bcast(tensor.raw(), count, mpi_type(tensor.dtype()), opts.root, impl_->comm));
    });
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> MpiProcessGroup::allgather(const Tensor& input, Tensor& output, const AllgatherOptions&) {
  detail::check_host_tensor(backend(), "allgather", input);
  detail::check_host_tensor(backend(), "allgather", output);
  detail::check_allgather_shapes(backend(), input, output, rank(), size());
  if (input.numel() > 0) {
    int count = mpi_count("allgather", input.numel());
    mpi_count("allgather", output.numel());
    MPI_Datatype type = mpi_type(input.dtype());
    auto* out = static_cast<char*>(output.raw());
    const void* in = input.raw();
    // Already in this rank's slot of the output: MPI_IN_PLACE (MPI forbids overlapping send and receive buffers).
    if (in == out + static_cast<size_t>(rank()) * input.bytes()) in = MPI_IN_PLACE;
    run("allgather", [&] {
      DPT_MPI_CHECK(MPI_Allgather(in, count, type, out, count, type, impl_->comm));
    });
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                                      const AllreduceOptions& opts) {
  detail::check_host_tensor(backend(), "reduce_scatter", input);
  detail::check_host_tensor(backend(), "reduce_scatter", output);
  detail::check_reduce_dtype(backend(), "reduce_scatter", output, opts.op);
  detail::check_reduce_scatter_shapes(backend(), input, output, size());
  if (output.numel() > 0) {
    int count = mpi_count("reduce_scatter", output.numel());
    MPI_Op op = opts.op == ReduceOp::Max ? MPI_MAX : MPI_SUM;  // Avg: Sum, divided below
    if (output.dtype() == DType::BF16) op = impl_->bf16_sum;   // Sum only (checked above)
    // MPI forbids overlapping send and receive buffers (and its MPI_IN_PLACE means something else here): an output
    // inside the input is reduced into a temporary first.
    const auto* in_begin = static_cast<const char*>(input.raw());
    const auto* out_begin = static_cast<const char*>(output.raw());
    const bool overlap = out_begin < in_begin + input.bytes() && in_begin < out_begin + output.bytes();
    Tensor result = overlap ? Tensor::empty({static_cast<int64_t>(output.numel())}, output.dtype()) : output;
    run("reduce_scatter", [&] {
      DPT_MPI_CHECK(MPI_Reduce_scatter_block(input.raw(), result.raw(), count, mpi_type(output.dtype()), op,
                                             impl_->comm));
    });
    if (overlap) std::memcpy(output.raw(), result.raw(), output.bytes());
    if (opts.op == ReduceOp::Avg) detail::divide_in_place(output, size());
  }
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> MpiProcessGroup::barrier() {
  run("barrier", [&] { DPT_MPI_CHECK(MPI_Barrier(impl_->comm)); });
  return std::make_shared<CompletedWork>();
}

}  // namespace dpt::comm
