// trainer/shard.h: what sharded data parallelism (dist.zero >= 1, ZeRO) splits between the ranks, as the
// optimizer, the data-parallel strategy (trainer/parallel/) and the checkpoint see it.
//
// Under ZeRO each rank owns pieces of the model's flat parameter buffer (Model::params(); the gradient buffer is
// laid out the same): its chunk of every gradient bucket, plus each bucket's last (count mod world) elements, which
// every rank owns (they are all-reduced, and updated identically everywhere). A rank keeps optimizer state for its
// pieces only; DDP (dist.zero = 0) is the one piece [0, num_params) on every rank.
#pragma once

#include <cstddef>
#include <vector>

#include "core/tensor.h"

namespace dpt::trainer {

// The elements [offset, offset + count) of the flat parameter (and gradient) buffer.
struct FlatRange {
  size_t offset = 0;
  size_t count = 0;
  bool operator==(const FlatRange&) const = default;
};

// One rank's optimizer state under ZeRO (or the whole state: one range).
struct OptimizerShard {
  std::vector<FlatRange> ranges;    // increasing offsets, not overlapping
  // Per slot ("momentum"; "exp_avg", "exp_avg_sq"): one 1-D float32 tensor of sum(ranges[i].count) elements, the
  // ranges' state back to back in the order of `ranges`. Empty for plain SGD without momentum.
  std::vector<NamedTensor> slots;
};

}  // namespace dpt::trainer
