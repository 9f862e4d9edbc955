// trainer/parallel/zero.h: ZeRO stages 1 and 2 (dist.zero = 1, 2 on more than one rank); the base of stage 3 (fsdp.h).
//
// Stage 1 (the optimizer state sharded; trainer/shard.h): each bucket is cut into the ranks' chunks and a remainder
// (buckets.h: Chunks); rank r owns chunk r and every remainder. A bucket is reduce-scattered (averaged) where DDP
// all-reduces it, in place: this rank's chunk of the gradient buffer ends averaged, the other chunks hold stale local
// sums that nothing reads; the remainder is all-reduced. Same moment of backward, same thread or stream, the same
// wire format (codec.h). The optimizer then updates the owned pieces only (owned()), and after_update() all-gathers
// each bucket's parameters. No buffer is added: backward still writes (and accumulates into) the whole gradient
// buffer.
//
// Stage 2 (the gradients sharded too): the same pieces, reduce-scattered the same way (the same numbers, bit for
// bit), but a rank keeps only its pieces' averaged gradients, back to back in shard_grads() (about 1/world of the
// model). Each bucket's gradients get a storage of their own (Model::split_grads), resident only from the moment
// backward is about to write them (Model::ParamHooks::before_backward: the first module of the bucket to run
// backward) until its reduce-scatter has settled and its pieces are copied into the shard; the bucket's wire buffer
// likewise. With gradient accumulation the buckets stay resident (and unreduced) over the K-1 silent micro-batches,
// as FSDP's no_sync keeps unsharded gradients: the communication saving costs the memory saving.
#pragma once

#include <utility>

#include "trainer/parallel/data_parallel.h"

namespace dpt::trainer {

class Zero : public DataParallel {
 public:
  Zero(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts);
  ~Zero() override;
  std::string name() const override;
  void after_update() override;
  void sum_squares_to(models::Kernels& k, Tensor& out) override;
  double sum_squares(models::Kernels& k) override;
  size_t gradient_bytes() const override;
  std::vector<std::string> shard_lines(size_t optimizer_state_bytes, int64_t accum_steps) const override;

 protected:
  // A bucket-sized tensor's views at a bucket's Chunks: the world chunks together, this rank's, the remainder.
  struct Pieces {
    Tensor split, chunk, rem;
  };
  static Pieces cut(const Tensor& bucket, const Chunks& c);
  // Each bucket's parameters, as Model::split_grads and split_params take them.
  std::vector<std::pair<size_t, size_t>> bucket_param_ranges() const;
  // Stage 2: the buckets' gradient storages held only while needed.
  bool held() const { return opts_.zero >= 2; }
  void hold(size_t first_param, size_t end_param);  // before_backward: their buckets resident (zeroed when new)

  std::vector<Chunks> chunks_;        // per bucket
  OwnedPieces pieces_;                // owned_, with which of them are remainders
  std::vector<Pieces> grad_pieces_;   // per bucket: its gradients'
  std::vector<Pieces> wire_pieces_;   // per bucket: its wire buffer's (bfloat16 only)
  std::vector<Pieces> param_pieces_;  // per bucket: its parameters' (stages 1, 2: views of Model::params())

 private:
  std::vector<std::shared_ptr<comm::Work>> reduce(size_t bucket) override;
  void settle(size_t bucket) override;
  void reduce_after_backward() override;
  const char* bucket_collective() const override { return "reduce-scattered"; }
  void hold_bucket(size_t bucket);
  void drop_bucket(size_t bucket);  // releases the bucket's gradients and wire buffer
  // The global sum of squares: one partial sum per piece of owned() (0 for remainders on ranks other than 0), the
  // partial sums summed over the ranks, then added on the host in piece order.
  double sharded_sum_squares(models::Kernels& k);

  std::vector<Tensor> kept_chunk_, kept_rem_;  // stage 2: where a bucket's averaged pieces are kept (in shard_grads_)
};

}  // namespace dpt::trainer
