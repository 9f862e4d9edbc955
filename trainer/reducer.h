// trainer/reducer.h: DDP's gradient reducer: the flat gradient buffer cut into buckets, each all-reduced
// (averaged) as soon as backward has produced all of its gradients, while backward goes on with earlier
// layers; the optimizer step waits for all of them.
//
// Buckets hold parameters in reverse order (backward produces the last layer's gradients first), each a
// contiguous slice of the flat buffer, so nothing is copied. The first bucket is small (at most 1 MB) so
// communication starts early. Every rank launches the buckets in the same order (0, 1, ...).
// How a bucket's all-reduce overlaps backward depends on the group: an asynchronous group (NCCL) enqueues it
// on its communication stream after an event on the compute stream, and the optimizer's stream waits on its
// Work; a host group (Gloo, MPI) runs it on the reducer's communication thread.
// dist.overlap = false keeps the simple path: one all-reduce of the whole buffer after backward.
//
// grad_dtype = BF16 (dist.grad_dtype = bf16, PyTorch DDP's bf16_compress_hook): each bucket's float32
// gradients are divided by the world size and rounded to bfloat16 into a bfloat16 copy of the buffer, that
// copy is all-reduced with Sum (each addition in float32 rounded back to bfloat16), and the result widened back
// into the float32 bucket: half the bytes on the wire, at bfloat16's precision (a relative 2^-8 per rounding).
// The compress / all-reduce / widen of a bucket run where its float32 all-reduce would: on the communication
// thread for host groups; on the compute stream around the asynchronous all-reduce for NCCL (the widening
// in finish()). F32, the default, all-reduces the float32 buckets with Avg, as before.
#pragma once

#include <condition_variable>
#include <deque>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"

namespace dpt::trainer {

struct Bucket {
  size_t offset = 0;       // first element in the flat gradient buffer
  size_t count = 0;        // elements
  size_t first_param = 0;  // the parameters [first_param, end_param) of Model::named_params()
  size_t end_param = 0;
};

// Buckets over parameters of `sizes` elements (in forward order, laid out contiguously in that order),
// filled in reverse: bucket 0 holds the last parameters. A bucket takes parameters while its bytes stay
// within its cap (first_cap_bytes for bucket 0, cap_bytes for the others); a parameter larger than the cap
// gets a bucket of its own; parameters are never split, and zero-size ones join the bucket being filled.
std::vector<Bucket> assign_buckets(const std::vector<size_t>& sizes, size_t cap_bytes, size_t first_cap_bytes,
                                   size_t elem_bytes = sizeof(float));

struct ReducerOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  bool overlap = true;
  DType grad_dtype = DType::F32;  // F32 | BF16: what the all-reduce carries (see the file comment)
};

// DDP's promise, checked once an epoch: every rank holds bit-identical parameters (a CRC32 of them, compared
// through a Max all-reduce of it and of its negation); at the start, after the broadcast, the buffers too (later
// each rank's forward moves its own BatchNorm statistics). InternalError naming `epoch` (0: at the start) when
// they differ. Collective.
void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers = false);

// "sizes 1.05 MB, 25.00 MB (last layers first)": the buckets' sizes, for the log.
std::string bucket_summary(const std::vector<Bucket>& buckets);

class Reducer {
 public:
  // `stream`: the compute stream that produces the gradients and runs the optimizer (nullptr on the CPU).
  Reducer(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const ReducerOptions& opts = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Starts a micro-batch's backward. sync = false (the first K-1 micro-batches of gradient accumulation):
  // no communication; gradients just accumulate.
  void begin(bool sync);
  // Backward's hook (Model::GradsReady): launches every bucket that has become complete, in bucket order.
  void grads_ready(size_t first_param, size_t end_param);
  // Every rank holds the averaged gradients: on the CPU when this returns; on a GPU for work enqueued on
  // the stream afterwards. Rethrows a failed all-reduce. A no-op on one rank or when not syncing.
  void finish();

  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void launch(size_t bucket);
  void comm_loop(int cuda_device);
  bool compressed() const { return opts_.grad_dtype == DType::BF16; }
  // BF16, a bucket or the whole buffer: round `grads` / world into `wire` (its bfloat16 copy), all-reduce it,
  // widen it back. Conversions run on stream_ (the CPU: at once); the widening is ordered after the sum by
  // its Work's block(stream_). `what`: the all-reduce's label.
  void reduce_bf16(Tensor& grads, Tensor& wire, const std::string& what);
  // The label of a bucket's all-reduce (AllreduceOptions::what): "bucket N"; the whole buffer's is "all gradients".
  static std::string bucket_label(size_t bucket);

  comm::ProcessGroup& pg_;
  Tensor grads_;
  StreamHandle stream_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<Tensor> views_;               // each bucket's slice of grads_
  Tensor wire_;                             // BF16: the bfloat16 copy of grads_ that is all-reduced
  std::vector<Tensor> wire_views_;          // BF16: each bucket's slice of wire_
  std::vector<size_t> bucket_of_param_;
  std::vector<size_t> missing_;             // per bucket: parameters whose gradients are not ready yet
  size_t next_launch_ = 0;
  bool active_ = false;                     // communicating this step (world > 1 and sync)
  std::vector<std::shared_ptr<comm::Work>> works_;  // asynchronous group: launched this step

  // Host groups: the communication thread and its queue of bucket indices.
  std::thread comm_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;  // launched, not yet taken by the thread
  size_t launched_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace dpt::trainer
