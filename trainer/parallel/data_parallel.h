// trainer/parallel/data_parallel.h: the data-parallel strategy: the one interface through which the Trainer, the
// optimizer and the checkpoint see how the model is replicated or sharded over the ranks (dist.zero), and its
// three implementations, chosen by make_data_parallel() (factory.h):
//   ddp.h   DDP (dist.zero = 0, and any stage on one rank): every rank holds everything; each bucket of
//           gradients is all-reduced (averaged) as soon as backward has produced all of its gradients, while
//           backward goes on with earlier layers.
//   zero.h  ZeRO stages 1 and 2: each bucket is reduce-scattered instead; a rank updates (and keeps optimizer
//           state for) its pieces only, then the parameters are all-gathered; stage 2 keeps only its pieces'
//           gradients between steps.
//   fsdp.h  ZeRO stage 3 (FSDP's FULL_SHARD): stage 2 with the parameters sharded too, each bucket gathered around
//           the modules that use it.
// What they share lives beside them: buckets.h (which parameters a bucket holds, and its chunks), codec.h (the
// gradients' wire format, dist.grad_dtype), comm_thread.h (the thread that runs host groups' collectives).
//
// The Trainer calls a strategy at the moments of a step, in this order:
//   begin_backward(sync)     before a micro-batch's backward (sync = false: gradient accumulation, no communication)
//   grads_ready(first, end)  backward's hook (Model::GradsReady): buckets that became complete are launched
//   finish_backward()        every rank holds the averaged gradients (its pieces of them)
//   the update               for_each_owned, sum_squares(_to), and the optimizer over owned() / shard_grads() /
//                            shard_params()
//   after_update()           every rank gets the updated parameters it needs
// and around checkpoints and checks: with_full_params(), for_each_gathered(), model_state_on_host(). The hooks
// before and after a module's forward and backward (Model::ParamHooks) are the strategy's own: it installs them.
//
// How a bucket's collectives overlap backward depends on the group: an asynchronous group (NCCL) enqueues them on its
// communication stream after an event on the compute stream, and the optimizer's stream waits on their Work; a host
// group (Gloo, MPI) runs them on the strategy's CommThread. dist.overlap = false: everything after backward.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "models/model.h"
#include "trainer/parallel/buckets.h"
#include "trainer/parallel/codec.h"
#include "trainer/parallel/comm_thread.h"
#include "trainer/shard.h"

namespace dpt::trainer {

struct DataParallelOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  bool overlap = true;
  DType grad_dtype = DType::F32;  // F32 | BF16: what the collectives carry (codec.h)
  int zero = 0;                   // 0: DDP; 1, 2, 3: ZeRO stage 1, 2, 3; no effect on one rank
};

class DataParallel {
 public:
  virtual ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // "ddp", "zero-1", "zero-2", "fsdp": which strategy this is.
  virtual std::string name() const = 0;
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // ---- the moments of a step
  // Starts a micro-batch's backward. sync = false (the first K-1 micro-batches of gradient accumulation): no
  // communication; gradients just accumulate.
  void begin_backward(bool sync);
  // Backward's hook (Model::GradsReady): launches every bucket that has become complete, in bucket order.
  void grads_ready(size_t first_param, size_t end_param);
  // Every rank holds the averaged gradients of owned(): on the CPU when this returns; on a GPU for work enqueued on
  // the stream afterwards. Rethrows a failed collective. A no-op on one rank or when not syncing.
  void finish_backward();
  // After the optimizer has updated owned(): every rank gets the parameters it needs for the next step (ZeRO stages
  // 1, 2: every bucket all-gathered; DDP, stage 3: nothing). Collective.
  virtual void after_update() {}

  // ---- what the update reads
  // The pieces of the flat parameter and gradient buffers this rank updates, in increasing offset: DDP the whole
  // buffer; ZeRO its chunk of every bucket and every bucket's remainder (buckets.h). After finish_backward() their
  // gradients are averaged.
  const std::vector<FlatRange>& owned() const { return owned_; }
  // Each piece's averaged gradient, in the order of owned(): views into Model::grads(), or into shard_grads().
  const std::vector<Tensor>& owned_grads() const { return owned_grads_; }
  // ZeRO stages 2, 3: the pieces' gradients back to back (the optimizer state's layout); undefined otherwise.
  const Tensor& shard_grads() const { return shard_grads_; }
  // ZeRO stage 3: the pieces' parameters back to back (what the optimizer updates); undefined otherwise.
  const Tensor& shard_params() const { return shard_params_; }
  // fn(gradients, count) for each piece of owned(): to scale or clip them.
  void for_each_owned(const std::function<void(float*, size_t)>& fn);
  // The sum of squares of the averaged gradients (the global norm squared, the same on every rank), into `out` (one
  // double on the gradients' device). DDP: one kernel, no host synchronisation. ZeRO (collective): each rank sums
  // its chunks (rank 0 the remainders too: every rank holds them, they count once), the partial sums are summed over
  // the ranks, in a fixed order on the host.
  virtual void sum_squares_to(models::Kernels& k, Tensor& out) = 0;
  // The same, returned to the host (synchronises).
  virtual double sum_squares(models::Kernels& k) = 0;

  // ---- the whole model: checkpoints, the broadcast at the start, the replica check
  // Runs fn with every parameter resident in the model (stage 3: all buckets gathered, then released; as FSDP's
  // summon_full_params). `changed`: fn wrote parameters (a load, a broadcast), so this rank's pieces are taken from
  // them after. Collective under stage 3; else just fn().
  virtual void with_full_params(const std::function<void()>& fn, bool changed);
  // fn(bucket, its parameters) for each bucket in turn, resident while fn runs (stage 3: gathered, then released, so
  // that one bucket at a time is held beyond the shard). Collective under stage 3.
  virtual void for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn);
  // Rank 0 (`lead`) gets a host copy of the whole model state, for a checkpoint; the other ranks nothing (but under
  // stage 3 they take part in the gathers).
  virtual std::vector<NamedTensor> model_state_on_host(bool lead);

  // ---- memory, and the log
  // Bytes of gradients this rank keeps between steps: the whole buffer, or (stages 2, 3) its shard.
  virtual size_t gradient_bytes() const;
  // Bytes of parameters this rank keeps between steps: the whole model, or (stage 3) its shard.
  virtual size_t param_bytes() const;
  // Stage 3: the most bytes of gathered buckets resident at once since the last reset_gathered_peak(); else 0.
  virtual size_t gathered_peak_bytes() const { return 0; }
  virtual void reset_gathered_peak() {}
  // What rank 0 logs once this strategy is built ("reducer: ..."), and once the optimizer exists ("zero: ...").
  virtual std::vector<std::string> setup_lines() const;
  virtual std::vector<std::string> shard_lines(size_t optimizer_state_bytes, int64_t accum_steps) const;

 protected:
  // Buckets over the model's parameters; the derived strategy sets up their gradients and owned().
  DataParallel(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts);
  // Each bucket's gradients and wire buffer as views of the model's flat gradient buffer and one wire buffer.
  void flat_bucket_views();
  // The communication thread, for host groups that overlap (called by the final strategy's constructor, once
  // reduce() and settle() can run); stop_comm() joins it (called by every strategy's destructor first).
  void start_comm();
  void stop_comm() { comm_.reset(); }
  // A bucket's collectives, started (bucket by bucket, during backward or after it); each returned Work is then
  // block()ed on the stream and settle() called: on the communication thread, or in finish_backward().
  virtual std::vector<std::shared_ptr<comm::Work>> reduce(size_t bucket) = 0;
  virtual void settle(size_t bucket) = 0;
  // dist.overlap = false: every bucket's gradients reduced now, after backward.
  virtual void reduce_after_backward() = 0;
  // How a bucket's gradients cross the ranks, as setup_lines() says it: DDP all-reduces them, ZeRO reduce-scatters.
  virtual const char* bucket_collective() const { return "all-reduced"; }
  // The label of a bucket's all-reduce (AllreduceOptions::what): "bucket N", as hang reports name it.
  static std::string bucket_label(size_t bucket);

  comm::ProcessGroup& pg_;
  models::Model& model_;
  const Device device_;
  const StreamHandle stream_;
  const DataParallelOptions opts_;
  const GradCodec codec_;
  std::vector<Bucket> buckets_;
  BucketMap map_;
  Tensor grads_;                    // the flat gradient buffer (undefined when each bucket has its own storage)
  std::vector<Tensor> views_;       // each bucket's gradients
  Tensor wire_;                     // the wire buffer of grads_ (codec.h; undefined when the wire is grads_)
  std::vector<Tensor> wire_views_;  // each bucket's wire buffer
  std::vector<FlatRange> owned_;
  std::vector<Tensor> owned_grads_;
  Tensor shard_grads_, shard_params_;
  std::unique_ptr<CommThread> comm_;

 private:
  void launch(size_t bucket);

  std::vector<size_t> missing_;  // per bucket: parameters whose gradients are not ready yet
  size_t next_launch_ = 0;
  bool active_ = false;          // communicating this step (world > 1 and sync)
  std::vector<std::vector<std::shared_ptr<comm::Work>>> works_;  // asynchronous group: each bucket's, this step
};

// DDP's promise, checked once an epoch: every rank holds bit-identical parameters (a CRC32 of them, compared through
// a Max all-reduce of it and of its negation); at the start, after the broadcast, the buffers too (later each rank's
// forward moves its own BatchNorm statistics). InternalError naming `epoch` (0: at the start) when they differ.
// Collective. With `dp` the parameters are read bucket by bucket through it (for_each_gathered: under stage 3 a rank
// holds one bucket at a time beyond its shard); without, from the model's storage.
void check_replicas(const models::Model& model, comm::ProcessGroup& pg, int64_t epoch, bool with_buffers = false,
                    DataParallel* dp = nullptr);

}  // namespace dpt::trainer
