// tests/unit/data/test_sampler.cpp: DistributedSampler partitions (or pads) each epoch across ranks, is
// deterministic in (seed, epoch), and 2 ranks x batch B see what 1 rank x batch 2B sees; eval_shard is exact.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "core/check.h"
#include "data/sampler.h"

using namespace dpt;
using namespace dpt::data;

namespace {

std::vector<size_t> identity(size_t n) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

DistributedSampler make(size_t n, int rank, int world, uint64_t seed = 7, bool shuffle = true, bool drop_last = false) {
  SamplerOptions o;
  o.dataset_size = n;
  o.rank = rank;
  o.world_size = world;
  o.seed = seed;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  return DistributedSampler(o);
}

}  // namespace

TEST_CASE("permutation is a permutation, deterministic in (n, seed, epoch)", "[data][sampler]") {
  for (size_t n : {0, 1, 2, 7, 10, 100, 101}) {
    auto p = DistributedSampler::permutation(n, 42, 3);
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    REQUIRE(sorted == identity(n));
    REQUIRE(DistributedSampler::permutation(n, 42, 3) == p);
  }
  auto a = DistributedSampler::permutation(100, 42, 0);
  REQUIRE(a != identity(100));
  REQUIRE(DistributedSampler::permutation(100, 42, 1) != a);   // another epoch
  REQUIRE(DistributedSampler::permutation(100, 43, 0) != a);   // another seed
  REQUIRE(DistributedSampler::permutation(100, 42, -1) != a);  // negative epochs are epochs too
}

TEST_CASE("permutation is the same on every platform (pinned values)", "[data][sampler]") {
  // Our own xoshiro256** + Fisher-Yates: these values may only change together with a deliberate format
  // change, since a resumed run on another machine must continue the same order.
  auto p = DistributedSampler::permutation(10, 1234, 5);
  INFO("permutation(10, 1234, 5) = " << fmt::format("{}", fmt::join(p, ", ")));
  // Computed by an independent Python transcription of xoshiro256** (splitmix64-seeded) + Fisher-Yates.
  REQUIRE(p == std::vector<size_t>{4, 2, 3, 9, 6, 5, 8, 0, 7, 1});
  REQUIRE(DistributedSampler::permutation(10, 0, -1) == std::vector<size_t>{2, 3, 8, 7, 1, 0, 9, 4, 6, 5});
}

TEST_CASE("permutation draws are roughly uniform", "[data][sampler]") {
  // Position 0 of a permutation of 4 over 4000 epochs: each value about 1000 times (binomial sd ~27).
  std::map<size_t, int> counts;
  for (int64_t e = 0; e < 4000; ++e) counts[DistributedSampler::permutation(4, 9, e)[0]]++;
  REQUIRE(counts.size() == 4);
  for (auto [value, count] : counts) {
    INFO("value " << value << " first " << count << " times");
    REQUIRE(count > 850);
    REQUIRE(count < 1150);
  }
}

TEST_CASE("ranks' slices partition or cover the data set", "[data][sampler]") {
  for (int world : {1, 2, 3}) {
    for (size_t n : {1, 2, 7, 10, 100, 101}) {
      for (bool drop_last : {false, true}) {
        for (int64_t epoch : {0, 1}) {
          INFO("world " << world << " n " << n << " drop_last " << drop_last << " epoch " << epoch);
          const auto w = static_cast<size_t>(world);
          if (drop_last && n < w) {
            REQUIRE_THROWS_AS(make(n, 0, world, 7, true, drop_last), ConfigError);
            continue;
          }
          std::map<size_t, int> seen;
          size_t total = 0;
          for (int r = 0; r < world; ++r) {
            auto s = make(n, r, world, 7, true, drop_last);
            const size_t expected = drop_last ? n / w : (n + w - 1) / w;
            REQUIRE(s.num_samples() == expected);
            REQUIRE(s.total_size() == expected * w);
            auto idx = s.indices(epoch);
            REQUIRE(idx.size() == expected);
            for (size_t i : idx) {
              REQUIRE(i < n);
              seen[i]++;
            }
            total += idx.size();
          }
          if (n % w == 0) {
            // Exact partition: everything exactly once.
            REQUIRE(total == n);
            REQUIRE(seen.size() == n);
            for (auto [i, c] : seen) REQUIRE(c == 1);
          } else if (drop_last) {
            REQUIRE(total == n / w * w);
            REQUIRE(seen.size() == total);  // no repeats; n % w examples left out
            for (auto [i, c] : seen) REQUIRE(c == 1);
          } else {
            // Padded: covers everything; wrapping repeats an example at most ceil(total/n) times (twice
            // once n >= world).
            REQUIRE(seen.size() == n);
            const int max_repeat = static_cast<int>((total + n - 1) / n);
            if (n >= w) REQUIRE(max_repeat == 2);
            for (auto [i, c] : seen) REQUIRE(c <= max_repeat);
          }
        }
      }
    }
  }
}

TEST_CASE("padding wraps around to the start of the permutation", "[data][sampler]") {
  // n = 7, world 3: total 9, global order = perm ++ perm[0..2); rank r takes positions r, r+3, r+6.
  auto perm = DistributedSampler::permutation(7, 7, 2);
  std::vector<size_t> padded = perm;
  padded.push_back(perm[0]);
  padded.push_back(perm[1]);
  for (int r = 0; r < 3; ++r) {
    auto idx = make(7, r, 3).indices(2);
    REQUIRE(idx == std::vector<size_t>{padded[r], padded[r + 3], padded[r + 6]});
  }
  // n = 1, world 3: the single example everywhere.
  for (int r = 0; r < 3; ++r) REQUIRE(make(1, r, 3).indices(0) == std::vector<size_t>{0});
}

TEST_CASE("orders reshuffle per epoch, repeat per (seed, epoch), differ per seed", "[data][sampler]") {
  for (int world : {1, 2, 3}) {
    for (int r = 0; r < world; ++r) {
      auto s = make(100, r, world, 11);
      REQUIRE(s.indices(0) == s.indices(0));
      REQUIRE(s.indices(0) != s.indices(1));
      REQUIRE(s.indices(5) == make(100, r, world, 11).indices(5));
      REQUIRE(s.indices(0) != make(100, r, world, 12).indices(0));
    }
  }
}

TEST_CASE("shuffle=false gives the identity order, strided", "[data][sampler]") {
  REQUIRE(make(10, 0, 1, 3, false).indices(4) == identity(10));
  REQUIRE(make(10, 0, 1, 3, false).indices(0) == make(10, 0, 1, 99, false).indices(9));
  REQUIRE(make(10, 0, 3, 3, false).indices(1) == std::vector<size_t>{0, 3, 6, 9});
  REQUIRE(make(10, 1, 3, 3, false).indices(1) == std::vector<size_t>{1, 4, 7, 0});  // padded with 0
  REQUIRE(make(10, 2, 3, 3, false).indices(1) == std::vector<size_t>{2, 5, 8, 1});  // padded with 1
  REQUIRE(make(10, 2, 3, 3, false, true).indices(1) == std::vector<size_t>{2, 5, 8});
}

TEST_CASE("2 ranks x batch B see the same examples per step as 1 rank x batch 2B", "[data][sampler]") {
  for (size_t n : {10, 11, 100, 101}) {
    for (size_t batch : {1, 3, 4}) {
      INFO("n " << n << " batch " << batch);
      auto one = make(n, 0, 1).indices(3);
      auto r0 = make(n, 0, 2).indices(3);
      auto r1 = make(n, 1, 2).indices(3);
      REQUIRE(r0.size() == r1.size());
      const size_t steps = (r0.size() + batch - 1) / batch;
      for (size_t k = 0; k < steps; ++k) {
        std::multiset<size_t> two_ranks;
        for (const auto* v : {&r0, &r1}) {
          for (size_t i = k * batch; i < std::min(v->size(), (k + 1) * batch); ++i) two_ranks.insert((*v)[i]);
        }
        std::multiset<size_t> one_rank;
        for (size_t i = k * 2 * batch; i < std::min(one.size(), (k + 1) * 2 * batch); ++i) one_rank.insert(one[i]);
        if (2 * (k + 1) * batch <= n) {
          REQUIRE(two_ranks == one_rank);
        } else {
          // The last step: with odd n the 2 ranks carry one padded example (the permutation's first) more.
          auto extra = two_ranks;
          for (size_t i : one_rank) {
            auto it = extra.find(i);
            REQUIRE(it != extra.end());
            extra.erase(it);
          }
          REQUIRE(extra.size() == n % 2);
          if (n % 2 == 1) REQUIRE(*extra.begin() == one[0]);
        }
      }
    }
  }
}

TEST_CASE("indices(epoch, 0) is indices(epoch), and a start deals the rest of the order strided", "[data][sampler]") {
  for (size_t n : {1, 7, 10, 101}) {
    for (int world : {1, 2, 3}) {
      if (static_cast<size_t>(world) > n) continue;
      for (int r = 0; r < world; ++r) {
        INFO("n " << n << " world " << world << " rank " << r);
        auto s = make(n, r, world);
        REQUIRE(s.indices(2, 0) == s.indices(2));
        REQUIRE(s.num_samples(0) == s.num_samples());
        const auto perm = DistributedSampler::permutation(n, 7, 2);
        for (size_t start : {size_t{0}, n / 2, n - 1}) {
          auto mine = s.indices(2, start);
          REQUIRE(mine.size() == s.num_samples(start));
          REQUIRE(mine.size() == (n - start + world - 1) / world);
          for (size_t i = 0; i < mine.size(); ++i) REQUIRE(mine[i] == perm[(start + r + i * world) % n]);
        }
      }
    }
  }
  // Padding after a start wraps to the order's beginning, as at start 0; drop_last truncates, possibly to nothing.
  REQUIRE(make(10, 1, 3, 3, false).indices(0, 5) == std::vector<size_t>{6, 9});
  REQUIRE(make(10, 2, 3, 3, false).indices(0, 5) == std::vector<size_t>{7, 0});  // padded with 0
  REQUIRE(make(10, 2, 3, 3, false, true).indices(0, 5) == std::vector<size_t>{7});
  REQUIRE(make(10, 1, 3, 3, false, true).num_samples(8) == 0);
  REQUIRE(make(10, 1, 3, 3, false, true).indices(0, 8).empty());
  REQUIRE_THROWS_AS(make(10, 0, 2).indices(0, 10), ConfigError);
  REQUIRE_THROWS_WITH(make(10, 0, 2).num_samples(11), Catch::Contains("position 11 is past the epoch's 10 examples"));
}

// A job consuming its epoch in steps of W ranks x batch B, resized (to another world size and batch) after some of
// them: the examples of all the steps, across the resizes, are the epoch's, each exactly once, whenever the epoch's
// last segment needs no padding (and otherwise exactly once plus the last step's padding, taken from the start).
TEST_CASE("an epoch resized at step boundaries uses every example exactly once", "[data][sampler]") {
  struct Segment {
    int world;
    size_t batch;
    size_t steps;  // 0: to the epoch's end
  };
  const std::vector<std::vector<Segment>> plans = {
      {{2, 4, 5}, {1, 4, 0}},             // lose a rank
      {{1, 6, 3}, {2, 3, 0}},             // gain one
      {{2, 2, 7}, {3, 2, 4}, {1, 5, 0}},  // twice
      {{3, 1, 1}, {2, 8, 2}, {3, 3, 0}},
  };
  for (size_t n : {60, 61, 97}) {
    for (size_t p = 0; p < plans.size(); ++p) {
      INFO("n " << n << " plan " << p);
      std::map<size_t, int> used;
      size_t start = 0, padded = 0;
      for (const Segment& seg : plans[p]) {
        std::vector<std::vector<size_t>> ranks;
        for (int r = 0; r < seg.world; ++r) ranks.push_back(make(n, r, seg.world).indices(5, start));
        const size_t per_rank = ranks[0].size();
        const size_t steps = seg.steps ? seg.steps : (per_rank + seg.batch - 1) / seg.batch;
        for (size_t k = 0; k < steps; ++k) {
          for (const auto& mine : ranks) {
            REQUIRE(mine.size() == per_rank);
            for (size_t i = k * seg.batch; i < std::min(per_rank, (k + 1) * seg.batch); ++i) used[mine[i]]++;
          }
        }
        if (seg.steps) {
          REQUIRE(steps * seg.batch < per_rank);  // the plan resizes mid-epoch
          start += steps * seg.batch * static_cast<size_t>(seg.world);
        } else {
          padded = per_rank * static_cast<size_t>(seg.world) - (n - start);
        }
      }
      REQUIRE(used.size() == n);
      size_t twice = 0;
      const auto perm = DistributedSampler::permutation(n, 7, 5);
      for (size_t i = 0; i < n; ++i) {
        REQUIRE(used[i] >= 1);
        REQUIRE(used[i] <= 2);
        if (used[i] == 2) ++twice;
      }
      REQUIRE(twice == padded);
      for (size_t i = 0; i < padded; ++i) REQUIRE(used[perm[i]] == 2);  // the padding: the order's first examples
    }
  }
}

TEST_CASE("eval_shard partitions exactly, without padding", "[data][sampler]") {
  for (int world : {1, 2, 3, 4}) {
    for (size_t n : {0, 1, 2, 7, 10, 101}) {
      INFO("world " << world << " n " << n);
      std::vector<int> count(n, 0);
      for (int r = 0; r < world; ++r) {
        auto shard = eval_shard(n, r, world);
        REQUIRE(std::is_sorted(shard.begin(), shard.end()));
        const size_t expected = n / world + (static_cast<size_t>(r) < n % world ? 1 : 0);
        REQUIRE(shard.size() == expected);
        for (size_t i : shard) {
          REQUIRE(i < n);
          REQUIRE(i % world == static_cast<size_t>(r));
          count[i]++;
        }
      }
      for (int c : count) REQUIRE(c == 1);
    }
  }
}

TEST_CASE("bad sampler options throw ConfigError", "[data][sampler]") {
  REQUIRE_THROWS_AS(make(10, 0, 0), ConfigError);
  REQUIRE_THROWS_AS(make(10, 0, -1), ConfigError);
  REQUIRE_THROWS_AS(make(10, -1, 2), ConfigError);
  REQUIRE_THROWS_AS(make(10, 2, 2), ConfigError);
  REQUIRE_THROWS_AS(make(0, 0, 1), ConfigError);
  REQUIRE_THROWS_AS(make(2, 0, 3, 7, true, true), ConfigError);
  REQUIRE_THROWS_WITH(make(10, 2, 2), Catch::Contains("rank must be in [0, 2), got 2"));
  REQUIRE_THROWS_WITH(make(0, 0, 1), Catch::Contains("empty"));
  REQUIRE_THROWS_AS(eval_shard(10, 3, 3), ConfigError);
  REQUIRE_THROWS_AS(eval_shard(10, 0, 0), ConfigError);
}
