// data/sampler.cpp: DistributedSampler (per-epoch global permutation, padded strided split) and eval_shard.
#include "data/sampler.h"

#include <numeric>

#include "core/check.h"
#include "data/random.h"

namespace dpt::data {
namespace {

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256** (Blackman and Vigna), seeded through splitmix64 as its authors recommend.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& word : s_) word = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  uint64_t below(uint64_t bound) { return uniform_below([this] { return next(); }, bound); }

 private:
  uint64_t s_[4];
};

void check_rank(int rank, int world_size, const char* what) {
  if (world_size < 1) DPT_THROW(ConfigError, "{}: world_size must be >= 1, got {}", what, world_size);
  if (rank < 0 || rank >= world_size) {
    DPT_THROW(ConfigError, "{}: rank must be in [0, {}), got {}", what, world_size, rank);
  }
}

}  // namespace

DistributedSampler::DistributedSampler(SamplerOptions opts) : opts_(opts) {
  check_rank(opts_.rank, opts_.world_size, "sampler");
  if (opts_.dataset_size == 0) DPT_THROW(ConfigError, "sampler: the data set is empty");
  const auto world = static_cast<size_t>(opts_.world_size);
  if (opts_.drop_last) {
    if (opts_.dataset_size < world) {
      DPT_THROW(ConfigError, "sampler: drop_last with {} examples and {} ranks leaves every rank with nothing",
                opts_.dataset_size, world);
    }
    num_samples_ = opts_.dataset_size / world;
  } else {
    num_samples_ = (opts_.dataset_size + world - 1) / world;
  }
}

std::vector<size_t> DistributedSampler::permutation(size_t n, uint64_t seed, int64_t epoch) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  // One stream per (seed, epoch): mix each through splitmix64 so nearby seeds and epochs share nothing.
  uint64_t s = seed;
  uint64_t e = static_cast<uint64_t>(epoch) ^ 0x6A09E667F3BCC909ull;
  Xoshiro256 rng(splitmix64(s) ^ rotl(splitmix64(e), 32));
  for (size_t i = n; i > 1; --i) {
    const auto j = static_cast<size_t>(rng.below(i));
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

size_t DistributedSampler::num_samples(size_t start) const {
  const size_t n = opts_.dataset_size;
  if (start >= n)
    DPT_THROW(ConfigError, "sampler: position {} is past the epoch's {} examples", start, n);
  const size_t left = n - start, world = static_cast<size_t>(opts_.world_size);
  return opts_.drop_last ? left / world : (left + world - 1) / world;
}

std::vector<size_t> DistributedSampler::indices(int64_t epoch, size_t start) const {
  const size_t n = opts_.dataset_size;
  const size_t count = num_samples(start);
  std::vector<size_t> order;
  if (opts_.shuffle) {
    order = permutation(n, opts_.seed, epoch);
  } else {
    order.resize(n);
    std::iota(order.begin(), order.end(), size_t{0});
  }
  // Position p of the padded (or truncated) global order is order[p % n]: padding wraps to the start.
  const auto world = static_cast<size_t>(opts_.world_size);
  const auto rank = static_cast<size_t>(opts_.rank);
  std::vector<size_t> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = order[(start + rank + i * world) % n];
  return mine;
}

std::vector<size_t> eval_shard(size_t dataset_size, int rank, int world_size) {
  check_rank(rank, world_size, "eval_shard");
  std::vector<size_t> mine;
  mine.reserve(dataset_size / static_cast<size_t>(world_size) + 1);
  for (size_t i = static_cast<size_t>(rank); i < dataset_size; i += static_cast<size_t>(world_size)) mine.push_back(i);
  return mine;
}

}  // namespace dpt::data
