// trainer/parallel/fsdp.h: ZeRO stage 3 (dist.zero = 3; FSDP's FULL_SHARD): stage 2 (zero.h) with the parameters
// sharded too. Each bucket's parameters get a storage of their own (Model::split_params), and a rank keeps only its
// pieces of them (shard_params(), which the optimizer updates). The model's hooks gather a bucket (all-gather of the
// pieces, the remainder copied) before the first module using it runs forward or backward, and release it once
// every module using it has finished that pass (counted per pass: Model::hook_ranges()); the first forward and the
// first backward record the order buckets are needed in, and later passes start the next bucket's gather (on the
// communication thread, or NCCL's stream) while the current one's modules compute: the prefetch. What needs the whole
// model (a checkpoint, the broadcast at the start, the replica check, loading a checkpoint) runs inside
// with_full_params() or for_each_gathered(). Every collective of a step goes through the one communication thread in
// the order the main thread queued it, the same order on every rank.
#pragma once

#include <cstdint>

#include "trainer/parallel/zero.h"

namespace dpt::trainer {

class Fsdp final : public Zero {
 public:
  Fsdp(comm::ProcessGroup& pg, models::Model& model, StreamHandle stream, const DataParallelOptions& opts);
  ~Fsdp() override;
  std::string name() const override { return "fsdp"; }
  void after_update() override {}  // each bucket is gathered when a module needs it
  void with_full_params(const std::function<void()>& fn, bool changed) override;
  void for_each_gathered(const std::function<void(const Bucket&, const Tensor&)>& fn) override;
  std::vector<NamedTensor> model_state_on_host(bool lead) override;
  size_t param_bytes() const override { return shard_params_.bytes(); }
  size_t gathered_peak_bytes() const override { return peak_bytes_; }
  void reset_gathered_peak() override { peak_bytes_ = resident_bytes_; }  // a new peak from now (the first step's)
  std::vector<std::string> shard_lines(size_t optimizer_state_bytes, int64_t accum_steps) const override;

 private:
  enum class Gathered : uint8_t { kNo, kPending, kYes };  // a bucket's parameters: released, being gathered, resident
  void keep_params();                 // every bucket's pieces of this rank into shard_params_ (all resident)
  void gather_bucket(size_t bucket);  // the collective itself (communication thread or none)
  void start_gather(size_t bucket);   // reserves the storage and starts the gather
  void wait_gather(size_t bucket);
  void need_params(size_t bucket);    // resident when it returns
  void release_params(size_t bucket);
  // The model's hooks.
  void begin_pass(int pass);          // 0: forward, 1: backward
  void use_params(size_t first_param, size_t end_param);        // before_forward / before_backward
  void done_with_params(size_t first_param, size_t end_param);  // after_forward / after_backward
  void end_pass();

  std::vector<Tensor> param_views_;       // each bucket's parameters, in a storage of its own
  std::vector<Tensor> kept_param_chunk_, kept_param_rem_;  // where a bucket's pieces are kept (in shard_params_)
  std::vector<Gathered> gathered_;        // per bucket
  std::vector<uint64_t> gather_ticket_;   // host group with a communication thread: each pending gather's job
  std::vector<std::shared_ptr<comm::Work>> gather_work_;  // asynchronous group: each pending gather
  std::vector<int> users_, left_;         // per bucket: hooked modules using it; those yet to finish this pass
  static constexpr size_t kNone = ~size_t{0};
  std::vector<size_t> order_[2], order_pos_[2];  // per pass: buckets in order of first use; each one's place or kNone
  bool recorded_[2] = {false, false};
  int pass_ = 0;
  size_t resident_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace dpt::trainer
