// comm/nccl_backend.cpp: NcclProcessGroup: NCCL collectives on a communication stream, Work handles over
// CUDA events, and the watchdog that aborts the communicator on error or timeout. Built with DPT_WITH_CUDA.
// A timeout's reason starts with kHangPrefix (main() exits with its hang code), and names the collective with
// TracedGroup's label when it has one ("allreduce #12 (bucket 0, step 3): allreduce(avg) of 1000 f32").
#include "comm/nccl_backend.h"

#include <nccl.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/collective_checks.h"
#include "core/cuda.h"
#include "core/cuda_check.h"

// NCCL's own message, plus the communicator's last error detail when there is one.
#define DPT_NCCL_CHECK(expr, comm)                                                                         \
  do {                                                                                                     \
    const ncclResult_t dpt_r_ = (expr);                                                                    \
    if (dpt_r_ != ncclSuccess) {                                                                           \
      const char* dpt_last_ = ncclGetLastError(comm);                                                      \
      throw ::dpt::CommError(::dpt::detail::located(                                                       \
          __FILE__, __LINE__,                                                                              \
          fmt::format("NCCL error in {}: {}{}{}", #expr, ncclGetErrorString(dpt_r_),                       \
                      dpt_last_ && *dpt_last_ ? ": " : "", dpt_last_ ? dpt_last_ : "")));                  \
    }                                                                                                      \
  } while (0)

namespace dpt::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_message(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::BF16: return ncclBfloat16;
  }
  DPT_THROW(UnsupportedError, "backend nccl does not support dtype {}", dtype_name(d));
}

// "allreduce #12 (bucket 0, step 3): allreduce(avg) of 1000 f32" with TracedGroup's label, else `base` alone.
std::string labelled(const std::string& label, std::string base) {
  return label.empty() ? base : fmt::format("{}: {}", label, base);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  DPT_THROW(UnsupportedError, "backend nccl does not support reduce op {}", reduce_op_name(op));
}

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  DPT_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

std::string nccl_version() {
  int v = 0;
  DPT_NCCL_CHECK(ncclGetVersion(&v), nullptr);
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

struct NcclProcessGroup::Impl {
  int rank = 0, device = 0;
  std::chrono::milliseconds timeout;
  std::function<void(const std::string&)> on_fatal;
  std::shared_ptr<void> keep_alive;
  std::unique_ptr<cuda::Stream> stream;

  std::mutex mu;  // NCCL calls on comm, abort, and `broken`
  ncclComm_t comm = nullptr;
  std::string broken;  // why the communicator was aborted; empty while healthy

  struct Pending {
    std::shared_ptr<cuda::Event> done;
    Clock::time_point deadline;
    std::string what;
    std::vector<Tensor> keep;  // the operation's tensors stay allocated until it has completed
  };
  std::mutex wmu;  // the watchdog's list
  std::condition_variable wcv;
  std::deque<Pending> pending;
  bool stop = false;
  std::thread watchdog;

  void throw_if_broken() {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.empty()) throw CommError(fmt::format("[rank {}] nccl process group is unusable: {}", rank, broken));
  }

  // Marks the group broken once (every later call refuses), reports why through on_fatal, then aborts the communicator
  // (so peers and our own stream stop waiting on it). on_fatal first: main()'s ends the process there, and
  // ncclCommAbort frees memory, which can wait for the device, so a kernel or stream that never finishes would
  // otherwise keep the process from ever reporting the hang.
  void abort_comm(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!broken.empty()) return;
      broken = why;
    }
    spdlog::error("nccl: {}; aborting the communicator", why);
    if (on_fatal) on_fatal(why);
    std::lock_guard<std::mutex> lock(mu);
    if (comm) {
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  // An asynchronous NCCL error (a peer failed, a network error), or "" while healthy.
  std::string async_error() {
    std::lock_guard<std::mutex> lock(mu);
    if (!comm) return "";
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) return fmt::format("ncclCommGetAsyncError failed: {}", nccl_message(q, comm));
    if (r != ncclSuccess && r != ncclInProgress) return fmt::format("asynchronous NCCL error: {}", nccl_message(r, comm));
    return "";
  }

  // The communicator is non-blocking: a call may return ncclInProgress, and nothing else may be called on it
  // until ncclCommGetAsyncError says it finished. Polls outside the lock, so the watchdog can abort meanwhile;
  // throws (aborting) on an error or when `deadline` passes.
  void settle(ncclResult_t r, const std::string& what, Clock::time_point deadline) {
    while (r == ncclInProgress) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      std::unique_lock<std::mutex> lock(mu);
      if (!comm) break;  // aborted meanwhile
      const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
      if (q != ncclSuccess) r = q;
      lock.unlock();
      if (r == ncclInProgress && Clock::now() > deadline) {
        const std::string why = fmt::format("{}{} did not start within dist.timeout_s = {:.0f} s", kHangPrefix, what,
                                            std::chrono::duration<double>(timeout).count());
        abort_comm(why);
        throw TimeoutError(fmt::format("[rank {}] nccl: {}", rank, why));
      }
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(mu);
        why = fmt::format("{} failed: {}", what, nccl_message(r, comm));
      }
      abort_comm(why);
      throw CommError(fmt::format("[rank {}] nccl: {}", rank, why));
    }
    throw_if_broken();
  }

  Clock::time_point deadline_from_now() const {
    return Clock::now() + (timeout.count() >= 0 ? timeout : std::chrono::hours(24 * 365));
  }

  void watch() {
    try {
      cuda::set_device(device);  // event queries from this thread
      std::unique_lock<std::mutex> lock(wmu);
      while (!stop) {
        wcv.wait_for(lock, std::chrono::milliseconds(100));
        while (!pending.empty() && pending.front().done->query()) pending.pop_front();
        if (pending.empty()) continue;
        const Pending oldest = pending.front();
        lock.unlock();
        std::string why = async_error();
        if (why.empty() && timeout.count() >= 0 && Clock::now() > oldest.deadline)
          why = fmt::format("{}{} did not finish within dist.timeout_s = {:.0f} s (a peer died or stopped calling it?)",
                            kHangPrefix, oldest.what, std::chrono::duration<double>(timeout).count());
        if (!why.empty()) abort_comm(why);
        lock.lock();
        if (!why.empty()) pending.clear();
      }
    } catch (const std::exception& e) {
      abort_comm(fmt::format("watchdog failed: {}", e.what()));
    }
  }

  void track(const std::shared_ptr<cuda::Event>& done, const std::string& what, std::vector<Tensor> keep) {
    std::lock_guard<std::mutex> lock(wmu);
    pending.push_back({done, deadline_from_now(), what, std::move(keep)});
  }
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclProcessGroup::Impl> impl, std::shared_ptr<cuda::Event> done, std::string what)
      : impl_(std::move(impl)), done_(std::move(done)), what_(std::move(what)) {}

  void wait(std::chrono::milliseconds timeout) override {
    const auto limit = timeout.count() >= 0 ? timeout : impl_->timeout;
    const auto start = Clock::now();
    while (!done_->query()) {
      if (std::string why = impl_->async_error(); !why.empty()) impl_->abort_comm(why);
      impl_->throw_if_broken();
      if (limit.count() >= 0 && Clock::now() - start > limit) {
        impl_->abort_comm(fmt::format("{}{} did not finish within {:.0f} s", kHangPrefix, what_,
                                      std::chrono::duration<double>(limit).count()));
        throw TimeoutError(fmt::format("[rank {}] nccl {} timed out after {:.0f} s", impl_->rank, what_,
                                       std::chrono::duration<double>(limit).count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    impl_->throw_if_broken();
  }

  void block(StreamHandle stream) override {
    impl_->throw_if_broken();
    if (stream)
      done_->block(stream);
    else
      wait(kNoTimeout);
  }

  bool completed() const override { return done_->query(); }

 private:
  std::shared_ptr<NcclProcessGroup::Impl> impl_;
  std::shared_ptr<cuda::Event> done_;
  std::string what_;
};

void check_device_tensor(const NcclProcessGroup::Impl& impl, const char* op, const Tensor& t) {
  if (!t.device().is_cuda() || t.device().index != impl.device)
    DPT_THROW(UnsupportedError, "backend nccl does not support {} on {} tensors: this rank's device is cuda:{}", op,
              t.device().str(), impl.device);
}

// Orders the communication stream after the caller's stream (or the whole device when none is named), runs
// `call` under the lock, records completion and hands it to the watchdog.
template <class F>
std::shared_ptr<Work> enqueue(const std::shared_ptr<NcclProcessGroup::Impl>& impl, const std::string& what,
                              StreamHandle caller, std::vector<Tensor> keep, F&& call) {
  impl->throw_if_broken();
  cuda::set_device(impl->device);
  const StreamHandle comm_stream = impl->stream->get();
  if (caller) {
    cuda::Event ready;  // destroyed at once; the runtime keeps it until the wait is resolved
    ready.record(caller);
    ready.block(comm_stream);
  } else {
    cuda::device_synchronize();
  }
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    if (!impl->broken.empty())
      throw CommError(fmt::format("[rank {}] nccl process group is unusable: {}", impl->rank, impl->broken));
    r = call(impl->comm, comm_stream);
  }
  impl->settle(r, what, impl->deadline_from_now());
  auto done = std::make_shared<cuda::Event>();
  done->record(comm_stream);
  impl->track(done, what, std::move(keep));
  return std::make_shared<NcclWork>(impl, std::move(done), what);
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(int rank, int size, int device, const std::string& unique_id,
                                   const NcclOptions& opts, std::shared_ptr<void> keep_alive)
    : ProcessGroup(rank, size), impl_(std::make_shared<Impl>()) {
  DPT_CHECK_EQ(unique_id.size(), sizeof(ncclUniqueId::internal));
  impl_->rank = rank;
  impl_->device = device;
  impl_->timeout = opts.timeout;
  impl_->on_fatal = opts.on_fatal;
  impl_->keep_alive = std::move(keep_alive);
  cuda::set_device(device);
  impl_->stream = std::make_unique<cuda::Stream>();
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  // Non-blocking: no NCCL call can then block the host for ever (init waiting for a peer that died, a
  // collective setting up connections), so the deadline and the watchdog can always abort.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    r = ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw CommError(::dpt::detail::located(__FILE__, __LINE__,
                                      fmt::format("ncclCommInitRankConfig (rank {} of {}, cuda:{}) failed: {}", rank,
                                                  size, device, nccl_message(r, impl_->comm))));
  }
  impl_->settle(r, fmt::format("joining the communicator (rank {} of {})", rank, size), impl_->deadline_from_now());
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->watch(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(impl_->wmu);
    impl_->stop = true;
  }
  impl_->wcv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  try {
    // Outstanding collectives get until the timeout to finish; then the communicator is finalised and
    // destroyed. If they do not finish (a peer is gone), it is aborted instead: never a hang on the way out.
    cuda::Event last;
    last.record(impl_->stream->get());
    const auto deadline = impl_->deadline_from_now();
    while (!last.query() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (!impl_->comm) return;
    if (!last.query()) {
      lock.unlock();
      impl_->abort_comm("collectives still running when the process group was destroyed");
      return;
    }
    ncclResult_t r = ncclCommFinalize(impl_->comm);
    lock.unlock();
    impl_->settle(r, "finalising the communicator", impl_->deadline_from_now());
    lock.lock();
    if (impl_->comm) (void)ncclCommDestroy(impl_->comm);
    impl_->comm = nullptr;
  } catch (const std::exception& e) {
    spdlog::warn("nccl: shutting down the communicator: {}", e.what());
  }
}

// Host tensors (the trainer's small bookkeeping reductions: loss sums, the resume step; predict's gathered text)
// take a round trip through the device: copied over, reduced or gathered, copied back before the call returns.
template <class F>
std::shared_ptr<Work> via_device(int device, Tensor& host, F&& collective) {
  Tensor on_device = host.to(Device::cuda(device));
  collective(on_device)->wait(kNoTimeout);
  host.copy_from(on_device);
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> NcclProcessGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  if (tensor.device().is_cpu())
    return via_device(impl_->device, tensor, [&](Tensor& t) { return allreduce(t, {.op = opts.op, .what = opts.what}); });
  check_device_tensor(*impl_, "allreduce", tensor);
  detail::check_reduce_dtype(backend(), "allreduce", tensor, opts.op);
  const std::string what = labelled(opts.what, fmt::format("allreduce({}) of {} {}", reduce_op_name(opts.op),
                                                           tensor.numel(), dtype_name(tensor.dtype())));
  return enqueue(impl_, what, opts.stream, {tensor}, [&](ncclComm_t comm, StreamHandle s) {
    return ncclAllReduce(tensor.raw(), tensor.raw(), tensor.numel(), nccl_type(tensor.dtype()), nccl_op(opts.op), comm, s);
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  if (tensor.device().is_cpu())
    return via_device(impl_->device, tensor, [&](Tensor& t) { return broadcast(t, {.root = opts.root, .what = opts.what}); });
  check_device_tensor(*impl_, "broadcast", tensor);
  detail::check_root(backend(), opts.root, size());
  const std::string what = labelled(opts.what, fmt::format("broadcast from rank {} of {} {}", opts.root,
                                                           tensor.numel(), dtype_name(tensor.dtype())));
  return enqueue(impl_, what, opts.stream, {tensor}, [&](ncclComm_t comm, StreamHandle s) {
    return ncclBroadcast(tensor.raw(), tensor.raw(), tensor.numel(), nccl_type(tensor.dtype()), opts.root, comm, s);
  });
}

std::shared_ptr<Work> NcclProcessGroup::allgather(const Tensor& input, Tensor& output,
                                                  const AllgatherOptions& opts) {
  if (input.device().is_cpu() && output.device().is_cpu()) {  // predict's text and sizes: over the device and back
    Tensor in_device = input.to(Device::cuda(impl_->device));
    return via_device(impl_->device, output,
                      [&](Tensor& out) { return allgather(in_device, out, {.what = opts.what}); });
  }
  check_device_tensor(*impl_, "allgather", input);
  check_device_tensor(*impl_, "allgather", output);
  detail::check_allgather_shapes(backend(), input, output, rank(), size());
  const std::string what =
      labelled(opts.what, fmt::format("allgather of {} {}", input.numel(), dtype_name(input.dtype())));
  // In place (the input is this rank's slot of the output) is NCCL's own in-place form: sendbuff == recvbuff +
  // rank * sendcount.
  return enqueue(impl_, what, opts.stream, {input, output}, [&](ncclComm_t comm, StreamHandle s) {
    return ncclAllGather(input.raw(), output.raw(), input.numel(), nccl_type(input.dtype()), comm, s);
  });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                                       const AllreduceOptions& opts) {
  check_device_tensor(*impl_, "reduce_scatter", input);
  check_device_tensor(*impl_, "reduce_scatter", output);
  detail::check_reduce_dtype(backend(), "reduce_scatter", output, opts.op);
  detail::check_reduce_scatter_shapes(backend(), input, output, size());
  const std::string what = labelled(opts.what, fmt::format("reduce_scatter({}) of {} {}", reduce_op_name(opts.op),
                                                           input.numel(), dtype_name(input.dtype())));
  return enqueue(impl_, what, opts.stream, {input, output}, [&](ncclComm_t comm, StreamHandle s) {
    return ncclReduceScatter(input.raw(), output.raw(), output.numel(), nccl_type(output.dtype()), nccl_op(opts.op),
                             comm, s);
  });
}

std::shared_ptr<Work> NcclProcessGroup::barrier() {
  // NCCL has no barrier: a one-element all-reduce that the host waits for.
  Tensor one = Tensor::zeros({1}, DType::F32, Device::cuda(impl_->device));
  auto work = enqueue(impl_, "barrier", nullptr, {one}, [&](ncclComm_t comm, StreamHandle s) {
    return ncclAllReduce(one.raw(), one.raw(), 1, ncclFloat32, ncclSum, comm, s);
  });
  work->wait(kNoTimeout);
  return work;
}

}  // namespace dpt::comm
