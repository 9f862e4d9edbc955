// data/random.h: counter-based random numbers for the data layer: a value is a pure function of a key and a
// counter, so any example's randomness can be recomputed on any rank, thread or run without carrying state.
//
// mix64 is splitmix64's finaliser (Steele, Lea and Flood; the seeding generator xoshiro's authors
// recommend); CounterRng hashes (seed, epoch, index) into a key and counts up from there: the random
// transforms of example `index` in epoch `epoch` (data/transforms.h) and the synthetic features
// (data/synthetic.cpp) draw from it, the sampler's permutation seeds its xoshiro256** through it.
#pragma once

#include <cstdint>

namespace dpt::data {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, splitmix64's increment

// A bijective 64-bit mix (splitmix64's output function of x + kGolden): turns counters into bits that look
// independent.
constexpr uint64_t mix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// splitmix64 as a stateful generator: returns mix64(state), then advances state by kGolden.
inline uint64_t splitmix64(uint64_t& state) {
  const uint64_t z = mix64(state);
  state += kGolden;
  return z;
}

// Uniform in [0, bound), bound >= 1, from 64-bit draws of `next`, without modulo bias: rejects the lowest
// (2^64 mod bound) draws.
template <class Next>
uint64_t uniform_below(Next next, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

// The random draws of one example: key = hash of (seed, epoch, index, stream); draw k = mix64(key ^
// mix64(k)). Cheap to construct, so build one per example where it is needed.
class CounterRng {
 public:
  CounterRng(uint64_t seed, int64_t epoch, uint64_t index, uint64_t stream = 0)
      : key_(mix64(mix64(mix64(seed ^ mix64(stream)) ^ static_cast<uint64_t>(epoch)) ^ index)) {}

  uint64_t next() { return mix64(key_ ^ mix64(counter_++)); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  uint64_t below(uint64_t bound) { return uniform_below([this] { return next(); }, bound); }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace dpt::data
