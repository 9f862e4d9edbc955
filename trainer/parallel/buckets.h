// trainer/parallel/buckets.h: the gradient buckets as plain arithmetic, shared by every data-parallel strategy:
// which parameters a bucket holds (assign_buckets), which bucket holds a parameter (BucketMap), and how ZeRO cuts a
// bucket between the ranks (chunks_of, owned_pieces). Nothing here communicates or allocates a tensor.
//
// Buckets hold parameters in reverse order (backward produces the last layer's gradients first), each a contiguous
// slice of the flat parameter and gradient buffers (Model::params(), Model::grads()), so nothing is copied. The
// first bucket is small (at most 1 MB) so that communication starts early. Every rank launches the buckets in the
// same order (0, 1, ...).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

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

// "sizes 1.05 MB, 25.00 MB (last layers first)": the buckets' sizes, for the log.
std::string bucket_summary(const std::vector<Bucket>& buckets);

// Which bucket holds each of `num_params` parameters.
class BucketMap {
 public:
  BucketMap() = default;
  BucketMap(const std::vector<Bucket>& buckets, size_t num_params);
  size_t of(size_t param) const { return bucket_of_param_[param]; }
  // fn(bucket) for each bucket holding parameters [first_param, end_param), once each, in order (a bucket's
  // parameters are consecutive); allocates nothing, as it runs in every module's hooks.
  template <class Fn>
  void for_each(size_t first_param, size_t end_param, Fn&& fn) const {
    for (size_t p = first_param; p < end_param; ++p)
      if (p == first_param || bucket_of_param_[p] != bucket_of_param_[p - 1]) fn(bucket_of_param_[p]);
  }

 private:
  std::vector<size_t> bucket_of_param_;
};

// A bucket of `count` elements cut for `world` ranks (ZeRO): world chunks of q = count / world elements, rank r's
// the elements [r * q, (r + 1) * q) of the bucket; the last rem = count - world * q elements (the remainder) belong
// to every rank. Offsets are within the bucket.
struct Chunks {
  size_t q = 0;      // elements per chunk
  size_t split = 0;  // world * q: the chunks together, from the bucket's start
  size_t mine = 0;   // where this rank's chunk starts: rank * q
  size_t rem = 0;    // the remainder's elements, from `split` on
};
Chunks chunks_of(size_t count, size_t world, size_t rank);

// The pieces of the flat buffer a rank updates under ZeRO, in increasing offset: its chunk of every bucket and every
// bucket's remainder (by_all: a remainder, which every rank holds and updates alike).
struct OwnedPieces {
  std::vector<FlatRange> ranges;
  std::vector<bool> by_all;
  // The index in `ranges` of the piece starting at `offset` (InternalError if none).
  size_t index_at(size_t offset) const;
};
OwnedPieces owned_pieces(const std::vector<Bucket>& buckets, size_t world, size_t rank);

}  // namespace dpt::trainer
