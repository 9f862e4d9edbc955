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
//
// zero = 1 (dist.zero = 1, ZeRO stage 1: the optimizer state sharded; trainer/shard.h): each bucket of `count`
// elements is cut into world chunks of q = count / world; rank r owns chunk r, plus the bucket's remainder (the last
// count - world * q elements), which every rank owns. A bucket is reduce-scattered (Avg) where DDP all-reduces it,
// in place: this rank's chunk of the gradient buffer ends averaged, the other chunks hold stale local sums that
// nothing reads; the remainder is all-reduced. Same moment of backward, same thread or stream, bf16 on the wire as
// above. The optimizer then updates the owned pieces only (for_each_owned, owned()), and gather_params()
// all-gathers each bucket's parameters after the step. No buffer is added: backward still writes (and accumulates
// into) the whole gradient buffer.
//
// zero = 2 (ZeRO stage 2: the gradients sharded too): the same pieces, reduce-scattered the same way (the same
// numbers, bit for bit), but a rank keeps only its pieces' averaged gradients, back to back in a shard buffer of
// about 1/world of the model. Each bucket's gradients get a storage of their own (Model::split_grads), resident
// only from the moment backward is about to write them (Model::ParamHooks::before_backward: the first module of the bucket to run
// backward) until its reduce-scatter has settled and its pieces are copied into the shard; the bucket's bfloat16
// copy likewise. With gradient accumulation the buckets stay resident (and unreduced) over the K-1 silent
// micro-batches, as FSDP's no_sync keeps unsharded gradients: the communication saving costs the memory saving.
//
// zero = 3 (ZeRO stage 3, FSDP's FULL_SHARD: the parameters sharded too): each bucket's parameters get a storage of
// their own as well (Model::split_params), and a rank keeps only its pieces of them (shard_params(), which the
// optimizer updates). The Model's hooks gather a bucket (all-gather of the pieces, the remainder copied) before the
// first module using it runs forward or backward, and release it once every module using it has finished that pass
// (counted per pass: hook_ranges()); the first forward and the first backward record the order buckets are needed
// in, and later passes start the next bucket's gather (on the communication thread, or NCCL's stream) while the
// current one's modules compute: the prefetch. What needs the whole model (a checkpoint, the broadcast at the
// start, the replica check, loading a checkpoint) runs inside with_full_params(). Every collective of a step goes
// through the one communication thread in the order the main thread queued it, the same order on every rank.
#pragma once

#include <condition_variable>
#include <deque>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"
#include "trainer/shard.h"

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
  int zero = 0;                   // 0: DDP; 1, 2, 3: ZeRO stage 1, 2, 3 (see the file comment); no effect on one rank
};

// DDP's promise, checked once an epoch: every rank holds bit-identical parameters (a CRC32 of them, compared
// through a Max all-reduce of it and of its negation); at the start, after the broadcast, the buffers too (later
// each rank's forward moves its own BatchNorm statistics). InternalError naming `epoch` (0: at the start) when
// they differ. Collective.
// `reducer` (ZeRO stage 3, whose parameters are sharded): the parameters are gathered and checksummed bucket by
// bucket (Reducer::for_each_gathered), so that a rank holds one bucket at a time beyond its shard.
class Reducer;
void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers = false,
                    Reducer* reducer = nullptr);

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

  // ---- what the optimizer step reads (the same calls under DDP and ZeRO)
  bool sharded() const { return sharded_; }
  // The pieces of the flat parameter and gradient buffers this rank updates, in increasing offset: DDP the whole
  // buffer; ZeRO its chunk of every bucket and every bucket's remainder. After finish() their gradients are averaged.
  const std::vector<FlatRange>& owned() const { return owned_; }
  // Each piece's averaged gradient, in the order of owned(): views into Model::grads() (DDP: the whole buffer; stage
  // 1), or into the gradient shard (stage 2; the optimizer reads it through shard_grads()).
  const std::vector<Tensor>& owned_grads() const { return owned_grads_; }
  // Stage 2: the pieces' gradients back to back (the optimizer state's layout); undefined otherwise.
  const Tensor& shard_grads() const { return shard_grads_; }
  // Bytes of gradients this rank keeps between steps: the whole buffer, or (stage 2) its shard.
  size_t gradient_bytes() const;
  // Stage 3: the pieces' parameters back to back (what the optimizer updates); undefined otherwise.
  const Tensor& shard_params() const { return shard_params_; }
  // Bytes of parameters this rank keeps between steps: the whole model, or (stage 3) its shard; and (stage 3) the
  // most bytes of gathered buckets resident at once since the last reset_gathered_peak().
  size_t param_bytes() const;
  size_t gathered_peak_bytes() const { return peak_bytes_; }
  void reset_gathered_peak() { peak_bytes_ = resident_bytes_; }  // a new peak from now (the first step's)
  // Runs fn with every parameter resident in the model (stage 3: all buckets gathered, then released; as FSDP's
  // summon_full_params): to save, broadcast, check or load the whole model. `changed`: fn wrote parameters (a
  // load, a broadcast), so this rank's pieces are taken from them after. Collective under stage 3; else just fn().
  void with_full_params(const std::function<void()>& fn, bool changed);
  // fn(bucket, its parameters) for each bucket in turn, resident while fn runs (stage 3: gathered, then released, so
  // that one bucket at a time is held beyond the shard): to copy the whole model out bucket by bucket. Collective
  // under stage 3.
  void for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn);
  // fn(gradients, count) for each piece of owned() (DDP: once, the whole buffer): to scale or clip them.
  void for_each_owned(const std::function<void(float*, size_t)>& fn);
  // The sum of squares of the averaged gradients (the global norm squared, the same on every rank), into `out` (one
  // double on the gradients' device). DDP: one kernel, no host synchronisation. ZeRO (collective): each rank sums its
  // chunks (rank 0 the remainders too: every rank holds them, they count once), the partial sums are summed over
  // the ranks, in a fixed order on the host.
  void sum_squares_to(models::Kernels& k, Tensor& out);
  // The same, returned to the host (synchronises).
  double sum_squares(models::Kernels& k);
  // ZeRO: after the optimizer has updated the owned pieces, every rank gets every bucket's parameters (all-gathered
  // per bucket into Model::params(), ordered on the stream); a no-op under DDP. Collective.
  void gather_params();

 private:
  void launch(size_t bucket);
  void comm_loop(int cuda_device);
  bool compressed() const { return opts_.grad_dtype == DType::BF16; }
  // A bucket's collectives, started: DDP its all-reduce; ZeRO its reduce-scatter and its remainder's all-reduce;
  // bf16 rounds the bucket into the wire buffer first (on stream_). Each returned Work is then block()ed on stream_
  // and settle() called.
  std::vector<std::shared_ptr<comm::Work>> reduce(size_t bucket);
  // After a bucket's collectives: bf16 widens the result back to fp32 (under ZeRO: this rank's chunk, the remainder).
  void settle(size_t bucket);
  // ZeRO: the global sum of squares: one partial sum per piece of owned() (0 for remainders on ranks other than 0),
  // the partial sums summed over the ranks, then added on the host in piece order.
  double sharded_sum_squares(models::Kernels& k);
  // BF16, the whole buffer (DDP without overlap): round `grads` / world into `wire` (its bfloat16 copy), all-reduce
  // it, widen it back. Conversions run on stream_ (the CPU: at once); the widening is ordered after the sum by
  // its Work's block(stream_). `what`: the all-reduce's label.
  void reduce_bf16(Tensor& grads, Tensor& wire, const std::string& what);
  // Each bucket's gradients (views_, wire_views_) and parameters (param_views_): views of the model's flat buffers,
  // or (stages 2, 3) storages of their own.
  void bucket_views(models::Model& model);
  // Cuts the buckets into chunks (zero >= 1): owned_, owned_grads_ and pieces_.
  void shard_buckets(models::Model& model);
  // Stage 3: this rank's pieces of the parameters kept, the buckets released, each bucket's users counted.
  void setup_param_shard(const models::Model& model);
  // Stages 2 and 3: the model's ParamHooks (cleared again by the destructor).
  void install_hooks(models::Model& model);
  // Stage 2: the buckets' storages held only while needed.
  bool held() const { return sharded_ && opts_.zero >= 2; }
  void hold(size_t first_param, size_t end_param);  // before_backward: their buckets resident (zeroed when new)
  void hold_bucket(size_t bucket);
  void drop_bucket(size_t bucket);  // releases the bucket's gradients and bfloat16 copy
  // Stage 3.
  enum class Gathered : uint8_t { kNo, kPending, kYes };  // a bucket's parameters: released, being gathered, resident
  bool params_sharded() const { return sharded_ && opts_.zero >= 3; }
  // Calls fn(bucket) for each bucket holding parameters first_param..end_param, once each, in order (a bucket's
  // parameters are consecutive); allocates nothing, as it runs in every module's hooks.
  template <class Fn>
  void for_each_bucket_of(size_t first_param, size_t end_param, Fn&& fn) const {
    for (size_t p = first_param; p < end_param; ++p)
      if (p == first_param || bucket_of_param_[p] != bucket_of_param_[p - 1]) fn(bucket_of_param_[p]);
  }
  Gathered gathered(size_t bucket);
  void set_gathered(size_t bucket, Gathered g);
  void keep_params();                 // every bucket's pieces of this rank into shard_params_ (all resident)
  void gather_bucket(size_t bucket);  // the collective itself (communication thread or none)
  void start_gather(size_t bucket);   // reserves the storage and starts the gather
  void wait_gather(size_t bucket);
  void need_params(size_t bucket);    // resident when it returns
  void release_params(size_t bucket);
  void begin_pass(int pass);          // 0: forward, 1: backward
  void use_params(size_t first_param, size_t end_param);        // before_forward / before_backward
  void done_with_params(size_t first_param, size_t end_param);  // after_forward / after_backward
  void end_pass();
  // The label of a bucket's all-reduce (AllreduceOptions::what): "bucket N"; the whole buffer's is "all gradients".
  static std::string bucket_label(size_t bucket);

  comm::ProcessGroup& pg_;
  models::Model& model_;
  Device device_;
  Tensor grads_;                            // the flat gradient buffer (undefined under stage 2)
  StreamHandle stream_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<Tensor> views_;               // each bucket's slice of grads_ (stage 2: its own storage)
  Tensor wire_;                             // BF16: the bfloat16 copy of grads_ that is all-reduced
  std::vector<Tensor> wire_views_;          // BF16: each bucket's slice of wire_ (stage 2: its own storage)
  std::vector<size_t> bucket_of_param_;
  // ZeRO.
  bool sharded_ = false;
  std::vector<FlatRange> owned_;
  std::vector<bool> owned_by_all_;  // per piece of owned_: a remainder (every rank holds it)
  struct Pieces {  // a bucket under ZeRO, as views; q = count / world elements per chunk
    Tensor split, chunk, rem;                  // grads_: the world * q chunks, this rank's, the remainder
    Tensor wire_split, wire_chunk, wire_rem;   // bf16: the same pieces of wire_
    Tensor param_split, param_chunk, param_rem;  // the bucket's parameters: the all-gather's output, this rank's chunk
    Tensor kept_chunk, kept_rem;               // stage 2: where chunk and rem are kept (in shard_grads_)
    Tensor kept_param_chunk, kept_param_rem;   // stage 3: the same pieces of the parameters (in shard_params_)
  };
  std::vector<Tensor> owned_grads_;
  Tensor shard_grads_;                      // stage 2
  std::vector<Tensor> param_views_;         // each bucket's parameters: views of Model::params() (stage 3: own storage)
  Tensor shard_params_;                     // stage 3
  std::vector<Tensor> owned_params_;
  std::vector<Gathered> gathered_;          // per bucket (guarded by mu_: the communication thread sets kYes)
  std::vector<std::shared_ptr<comm::Work>> gather_work_;  // asynchronous group: each pending gather
  std::vector<int> users_, left_;           // per bucket: hooked modules using it; those yet to finish this pass
  static constexpr size_t kNone = ~size_t{0};
  std::vector<size_t> order_[2], order_pos_[2];  // per pass: buckets in order of first use; each one's place or kNone
  bool recorded_[2] = {false, false};
  int pass_ = 0;
  size_t resident_bytes_ = 0, peak_bytes_ = 0;
  std::vector<Pieces> pieces_;
  std::vector<size_t> missing_;             // per bucket: parameters whose gradients are not ready yet
  size_t next_launch_ = 0;
  bool active_ = false;                     // communicating this step (world > 1 and sync)
  std::vector<std::vector<std::shared_ptr<comm::Work>>> works_;  // asynchronous group: each bucket's, this step

  // Host groups: the communication thread and its queue of bucket indices.
  std::thread comm_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Task {
    enum Kind : uint8_t { kReduce, kGather } kind;
    size_t bucket;
  };
  std::deque<Task> queue_;  // launched, not yet taken by the thread
  size_t launched_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace dpt::trainer
