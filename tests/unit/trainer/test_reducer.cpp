// tests/unit/trainer/test_reducer.cpp: assign_buckets, the pure function behind the reducer's buckets:
// reverse parameter order, contiguous slices covering the buffer exactly once, caps (a smaller first one),
// oversized parameters alone, never split.
#include <catch2/catch.hpp>

#include <numeric>

#include "core/check.h"
#include "trainer/reducer.h"

using namespace dpt;
using dpt::trainer::assign_buckets;
using dpt::trainer::Bucket;

namespace {

// Every bucket is the contiguous slice of its parameters; together they tile the buffer from the end.
void check_tiling(const std::vector<size_t>& sizes, const std::vector<Bucket>& buckets) {
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  size_t expect_end_param = sizes.size();
  for (const auto& b : buckets) {
    REQUIRE(b.end_param == expect_end_param);  // reverse order, no gaps
    REQUIRE(b.first_param < b.end_param);
    REQUIRE(b.offset == offsets[b.first_param]);
    REQUIRE(b.count == offsets[b.end_param] - offsets[b.first_param]);
    expect_end_param = b.first_param;
  }
  REQUIRE(expect_end_param == 0);
}

}  // namespace

TEST_CASE("assign_buckets: reverse order, caps, a smaller first bucket", "[reducer]") {
  // 4-byte elements; caps in bytes.
  const std::vector<size_t> sizes = {100, 10, 50, 50, 30, 5};  // forward order
  SECTION("everything fits in one bucket") {
    auto b = assign_buckets(sizes, 4 * 1000, 4 * 1000);
    REQUIRE(b.size() == 1);
    check_tiling(sizes, b);
  }
  SECTION("the first bucket is capped separately") {
    // First cap 4*40 bytes: params 5 (5) and 4 (30) fit (35), param 3 (50) does not.
    // Then cap 4*110: params 3, 2 (100) fit, param 1 (10) fits (110), param 0 (100) does not.
    auto b = assign_buckets(sizes, 4 * 110, 4 * 40);
    REQUIRE(b.size() == 3);
    check_tiling(sizes, b);
    CHECK(b[0].first_param == 4);
    CHECK(b[0].end_param == 6);
    CHECK(b[1].first_param == 1);
    CHECK(b[2].first_param == 0);
    CHECK(b[2].count == 100);
  }
  SECTION("a parameter larger than the cap gets a bucket of its own, unsplit") {
    auto b = assign_buckets(sizes, 4 * 20, 4 * 20);
    check_tiling(sizes, b);
    for (const auto& bk : b)
      if (bk.count > 20) CHECK(bk.end_param - bk.first_param == 1);
    REQUIRE(b.size() == 6);  // {5}, {30}, {50}, {50}, {10}, {100}: nothing fits beside anything
  }
}

TEST_CASE("assign_buckets: edge cases", "[reducer]") {
  CHECK(assign_buckets({}, 100, 100).empty());
  auto one = assign_buckets({7}, 4, 4);  // larger than the cap: alone
  REQUIRE(one.size() == 1);
  CHECK(one[0].count == 7);
  // Zero-size parameters join the bucket being filled; they never make one of their own.
  const std::vector<size_t> with_zero = {3, 0, 3, 0};
  auto z = assign_buckets(with_zero, 4 * 3, 4 * 3);
  check_tiling(with_zero, z);
  REQUIRE(z.size() == 2);
  // The MLP 784-512-512-10 with DDP's defaults (25 MB, first 1 MB): the last layer and the second layer's
  // bias (22 KB), then the rest (the second layer's 1 MB weight no longer fits the first bucket).
  const std::vector<size_t> mlp = {512 * 784, 512, 512 * 512, 512, 10 * 512, 10};
  auto d = assign_buckets(mlp, size_t{25} << 20, size_t{1} << 20);
  check_tiling(mlp, d);
  REQUIRE(d.size() == 2);
  CHECK(d[0].first_param == 3);
  CHECK_THROWS_AS(assign_buckets(mlp, 0, 1), InternalError);
}

