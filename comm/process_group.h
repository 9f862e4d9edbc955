// comm/process_group.h: the ProcessGroup interface (collectives returning Work handles) that every backend
// implements, and the options structs they take.
//
// Stream semantics. A collective's options name `stream`: the CUDA stream that produced the tensor and
// will consume the result (nullptr for host tensors, or "synchronise the device" for device ones).
//  - NCCL enqueues the operation on the group's own communication stream, after an event recorded on
//    `stream`, and returns at once. work->block(stream) orders later work on `stream` after the operation
//    without blocking the host (a watchdog thread enforces the timeout and aborts the communicator on an
//    error or timeout); work->wait() blocks the host until it is done.
//  - Gloo and MPI run on host memory and complete before they return; given a GPU tensor, they stage it
//    through pinned host memory (wait for `stream`, copy out, reduce, copy back on `stream`), which is
//    how several ranks share one GPU. Their Work is complete; wait() and block() return at once.
// Callers call wait() or block() before reading the output or reusing the input, whatever the backend.
//
// All ranks must issue the same collectives in the same order with the same counts and dtypes. An
// operation a backend does not implement throws UnsupportedError("backend X does not support Y").
// Nothing outside comm/ names NCCL, MPI or Gloo: callers pick a backend by name through init_process_group.
//
// Diagnostics: init_process_group wraps every backend in a TracedGroup (comm/traced_group.h), which numbers the
// collectives, and names the rank that is missing when one outlives the timeout. Callers help it with a label
// per collective (`what`: "bucket 1", "loss stats") and set_step(); neither changes what a collective does.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace dpt::comm {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// Default collective timeout; a collective that takes longer is a hang: TracedGroup's watchdog reports it and
// ends the process through InitOptions::on_fatal (Gloo also throws TimeoutError itself; MPI cannot tell).
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(5);
inline constexpr std::chrono::milliseconds kNoTimeout{-1};
// How the message on_fatal receives for a hang (a collective that outlived the timeout) begins: "hang: rank 1
// stuck before allreduce #9412 (bucket 0, step 4711); ranks 0,2 waited 30 s". main() gives it its own exit code.
inline constexpr std::string_view kHangPrefix = "hang: ";

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is done; throws the operation's error, or TimeoutError after `timeout`.
  virtual void wait(std::chrono::milliseconds timeout = kNoTimeout) = 0;
  // Work enqueued on `stream` after this call runs after the operation; the host does not wait. Throws the
  // operation's error if it is already known.
  virtual void block(StreamHandle stream) { wait(); }
  virtual bool completed() const = 0;
};

// A Work for operations that finished (or failed) before returning.
class CompletedWork : public Work {
 public:
  void wait(std::chrono::milliseconds = kNoTimeout) override {}
  bool completed() const override { return true; }
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  StreamHandle stream = nullptr;  // see "Stream semantics" above
  // The caller reuses this tensor's memory for every call for the group's lifetime (the gradient buckets),
  // and every rank makes its persistent calls in the same order: a backend may then keep per-buffer state
  // (Gloo keeps a ring with its buffers registered, faster than setting up each call).
  bool persistent = false;
  // A label for diagnostics ("bucket 1", "loss stats"); empty: the op's name alone. Backends may print it in
  // their errors (TracedGroup hands them "allreduce #9412 (bucket 1, step 4711)" in its place).
  std::string what;
};
struct BroadcastOptions {
  int root = 0;
  StreamHandle stream = nullptr;
  std::string what;  // as AllreduceOptions::what
};
struct AllgatherOptions {
  StreamHandle stream = nullptr;  // see "Stream semantics" above
  std::string what;               // as AllreduceOptions::what ("params bucket 3")
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;  // "gloo", "mpi", ...
  // True when collectives return before they complete (their Work finishes later, on the device): the
  // caller can go on computing meanwhile. False when they complete before returning (host backends): the
  // caller overlaps them by calling from another thread.
  virtual bool asynchronous() const { return false; }
  // The training step the following collectives belong to, for diagnostics only (a hang report names it); any
  // thread may call it. The backends ignore it; TracedGroup records it with each collective.
  virtual void set_step(int64_t step) {}

  // In place: every rank ends with op over all ranks' `tensor`. Avg divides the sum by size() (integer
  // tensors: Avg is not supported). Supported dtypes: F32, F64, I32, I64, and BF16 with Sum only: each
  // addition in float32 rounded back to bfloat16 (NCCL's ncclBfloat16 semantics), every rank ending with the
  // same bits; the order of the additions is the backend's.
  virtual std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {});
  // In place: every rank ends with the root's `tensor`.
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {});
  // `output` holds size() * input.numel() elements: rank r's input at offset r * input.numel(). In place when
  // `input` is this rank's slot of `output` (a view at offset rank() * input.numel()); any other overlap is an error.
  virtual std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {});
  // `input` holds size() * output.numel() elements; rank r gets op over all ranks of chunk r (the elements at
  // offset r * output.numel()). The ops and dtypes of allreduce; `output` may be this rank's chunk of `input`.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {});
  virtual std::shared_ptr<Work> barrier();

 protected:
  [[noreturn]] void unsupported(const char* op) const;

 private:
  int rank_;
  int size_;
};

}  // namespace dpt::comm
