// data/sampler.h: which examples each rank reads, epoch by epoch.
//
// DistributedSampler follows torch.utils.data.DistributedSampler: one global permutation per epoch, drawn
// from (seed, epoch) and identical on every rank; padded (by wrapping around) or truncated to a multiple of
// the world size; rank r takes positions r, r+W, r+2W, ... The strided split is what makes W ranks with
// batch B see, step by step, the same examples as one rank with batch W*B. The permutation is our own
// Fisher-Yates over a xoshiro256** stream, so it is the same on every platform and standard library.
//
// A job resized in the middle of an epoch (a node lost, a node added) goes on from where the epoch's global order
// stands: its state is (epoch, the samples the job has consumed from that order), and the remaining positions are
// dealt to the new ranks the same strided way (indices(epoch, start)). Each step of W ranks x batch B consumes W*B
// consecutive positions of the order, so `start` is a step boundary at any world size, and every example of the
// epoch is used exactly once across any number of resizes (beyond that, the padding's repeats or drop_last's tail).
// torch's DistributedSampler restarts the epoch instead; torchtitan's loader state does not reshard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpt::data {

struct SamplerOptions {
  size_t dataset_size = 0;
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // truncate to a multiple of world_size instead of padding
};

class DistributedSampler {
 public:
  // Throws ConfigError unless world_size >= 1, 0 <= rank < world_size, dataset_size >= 1 and (with
  // drop_last) dataset_size >= world_size, so that every rank gets at least one example.
  explicit DistributedSampler(SamplerOptions opts);

  size_t num_samples() const { return num_samples_; }  // this rank's count per epoch
  size_t total_size() const { return num_samples_ * static_cast<size_t>(opts_.world_size); }
  const SamplerOptions& options() const { return opts_; }

  // This rank's count of the epoch's positions from `start` on (the same on every rank): the remaining
  // dataset_size - start positions, padded (by wrapping around the order) or truncated to a multiple of the world
  // size. num_samples(0) == num_samples(); 0 when drop_last leaves fewer than world_size. Throws ConfigError for a
  // start past the data set.
  size_t num_samples(size_t start) const;

  // This rank's ordered indices for `epoch`, from global position `start` of the epoch's order on (what the job
  // has consumed: 0 at an epoch's beginning): positions start + rank, start + rank + W, ..., num_samples(start) of
  // them, position p >= dataset_size wrapping to p - dataset_size. Reshuffles per epoch by itself.
  std::vector<size_t> indices(int64_t epoch, size_t start = 0) const;

  // The global permutation of 0..n-1 for (seed, epoch), the same on every platform.
  static std::vector<size_t> permutation(size_t n, uint64_t seed, int64_t epoch);

 private:
  SamplerOptions opts_;
  size_t num_samples_ = 0;
};

// Evaluation: exact shards, every example exactly once across ranks, no padding: rank r gets r, r+W, ...
// (so ranks may differ by one example). Throws ConfigError for a bad rank or world size.
std::vector<size_t> eval_shard(size_t dataset_size, int rank, int world_size);

}  // namespace dpt::data
