// tests/unit/trainer/test_data_parallel.cpp: the data-parallel strategies (trainer/parallel/) and what they share.
// assign_buckets, the pure function behind the buckets: reverse parameter order, contiguous slices covering the
// buffer exactly once, caps (a smaller first one), oversized parameters alone, never split; ZeRO's chunks of a
// bucket and the pieces a rank owns; the communication thread's order and errors; the factory's choice. Then the
// strategies themselves on Gloo groups (ranks as threads): grad_dtype = bf16 against fp32: equal where the values are
// exact in bfloat16, within bfloat16's rounding elsewhere, the same bits on every rank; with and without overlap, 2
// and 3 ranks; ZeRO stages 1-3 against DDP and each other.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "comm/gloo_backend.h"
#include "comm/store.h"
#include "core/check.h"
#include "models/gpt/gpt.h"
#include "models/model.h"
#include "trainer/parallel/factory.h"
#include "tests/support/gloo_ranks.h"

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

TEST_CASE("assign_buckets: reverse order, caps, a smaller first bucket", "[parallel]") {
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

TEST_CASE("assign_buckets: edge cases", "[parallel]") {
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

TEST_CASE("chunks_of and owned_pieces: every element owned once by one rank or by all", "[parallel]") {
  const trainer::Chunks c = trainer::chunks_of(23, 3, 2);
  CHECK(c.q == 7);
  CHECK(c.split == 21);
  CHECK(c.mine == 14);
  CHECK(c.rem == 2);
  CHECK(trainer::chunks_of(2, 3, 1).q == 0);
  CHECK(trainer::chunks_of(2, 3, 1).rem == 2);
  CHECK_THROWS_AS(trainer::chunks_of(5, 2, 2), InternalError);
  // The MLP 5-7-3's 64-byte buckets: 3, 21, 7 and 35 elements (last first).
  const std::vector<Bucket> buckets = assign_buckets({35, 7, 21, 3}, 64, 64);
  REQUIRE(buckets.size() == 4);
  for (const size_t world : {1u, 2u, 3u, 5u}) {
    INFO("world " << world);
    std::vector<int> owners(66, 0), by_all(66, 0);
    for (size_t rank = 0; rank < world; ++rank) {
      const trainer::OwnedPieces p = trainer::owned_pieces(buckets, world, rank);
      REQUIRE(p.ranges.size() == p.by_all.size());
      for (size_t i = 0; i < p.ranges.size(); ++i) {
        if (i > 0) REQUIRE(p.ranges[i].offset >= p.ranges[i - 1].offset + p.ranges[i - 1].count);  // increasing
        CHECK(p.index_at(p.ranges[i].offset) == i);
        for (size_t e = p.ranges[i].offset; e < p.ranges[i].offset + p.ranges[i].count; ++e)
          ++(p.by_all[i] ? by_all : owners)[e];
      }
      CHECK_THROWS_AS(p.index_at(p.ranges.back().offset + 1), InternalError);
    }
    for (size_t e = 0; e < 66; ++e) {
      INFO("element " << e);
      REQUIRE(((owners[e] == 1 && by_all[e] == 0) || (owners[e] == 0 && by_all[e] == static_cast<int>(world))));
    }
  }
}

TEST_CASE("CommThread: jobs in order, waits by ticket, the first error and nothing after it", "[parallel]") {
  trainer::CommThread thread;
  std::vector<int> ran;  // written by the thread only, read after a wait
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 50; ++i) tickets.push_back(thread.submit([&ran, i] { ran.push_back(i); }));
  for (size_t i = 0; i < tickets.size(); ++i) REQUIRE(tickets[i] == i + 1);
  thread.wait(tickets[9]);
  REQUIRE(ran.size() >= 10);
  thread.wait_all();
  std::vector<int> want(50);
  std::iota(want.begin(), want.end(), 0);
  CHECK(ran == want);
  // A failure: the jobs before it ran, the ones after it are skipped; wait() on either side of it says so.
  std::atomic<bool> release{false};
  const uint64_t ok = thread.submit([&] {
    while (!release) std::this_thread::yield();
  });
  const uint64_t bad = thread.submit([] { throw std::runtime_error("collective failed"); });
  std::atomic<int> after{0};
  const uint64_t skipped = thread.submit([&] { ++after; });
  release = true;
  thread.wait(ok);
  CHECK_THROWS_WITH(thread.wait(skipped), "collective failed");
  CHECK_THROWS_WITH(thread.wait(bad), "collective failed");
  CHECK_THROWS_WITH(thread.wait_all(), "collective failed");
  CHECK(after == 0);
  // Taken by wait_all: jobs run again.
  const uint64_t again = thread.submit([&] { ++after; });
  thread.wait(again);
  thread.wait_all();
  CHECK(after == 1);
}

TEST_CASE("GradCodec: fp32 sends the gradients with Avg, bf16 a rounded copy of grads / world with Sum",
          "[parallel][bf16]") {
  const trainer::GradCodec f32(DType::F32, 4, nullptr);
  CHECK_FALSE(f32.wire_buffer(8, Device::cpu()).defined());
  CHECK(f32.options("bucket 0", true).op == comm::ReduceOp::Avg);
  CHECK(f32.options("bucket 0", true).persistent);
  CHECK(f32.options("bucket 0", false).what == "bucket 0");
  Tensor g = Tensor::empty({3}), none;
  g.data<float>()[0] = 1.0f;
  g.data<float>()[1] = 3.0f + 1.0f / 128;  // / 4: 0.75 + 2^-9, half a bfloat16 step above 0.75
  g.data<float>()[2] = -8.0f;
  CHECK(&f32.on_wire(g, none) == &g);
  f32.encode(g, none);  // nothing to do, nothing touched
  f32.decode(none, g);
  CHECK(g.data<float>()[1] == 3.0f + 1.0f / 128);

  const trainer::GradCodec bf16(DType::BF16, 4, nullptr);
  CHECK(bf16.options("x", false).op == comm::ReduceOp::Sum);
  Tensor wire = bf16.wire_buffer(3, Device::cpu());
  REQUIRE(wire.dtype() == DType::BF16);
  CHECK(&bf16.on_wire(g, wire) == &wire);
  bf16.encode(g, wire);
  Tensor back = Tensor::empty({3});
  bf16.decode(wire, back);
  CHECK(back.data<float>()[0] == 0.25f);
  CHECK(back.data<float>()[1] == 0.75f);  // the tie rounded to the even neighbour
  CHECK(back.data<float>()[2] == -2.0f);
  CHECK_FALSE(trainer::GradCodec(DType::BF16, 1, nullptr).wire_buffer(3, Device::cpu()).defined());  // one rank
  CHECK_THROWS_AS(trainer::GradCodec(DType::F64, 2, nullptr), InternalError);
}


namespace {

using dpt::test::run_gloo_ranks;

// One step of the strategy over gradients g(rank, i): begin, every parameter reported in backward order,
// finish. Returns the reduced gradients.
std::vector<float> reduce_once(comm::ProcessGroup& pg, DType grad_dtype, bool overlap,
                               const std::function<float(int, size_t)>& g, size_t* buckets = nullptr) {
  auto model = models::make_mlp(5, {7}, 3);  // 66 parameters in 4 tensors
  float* grads = model->grads().data<float>();
  for (size_t i = 0; i < model->grads().numel(); ++i) grads[i] = g(pg.rank(), i);
  // 64-byte buckets: one parameter tensor each, so several buckets go through the per-bucket path.
  const auto dp = trainer::make_data_parallel(pg, *model, nullptr,
                           {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64, .overlap = overlap,
                            .grad_dtype = grad_dtype});
  if (buckets) *buckets = dp->buckets().size();
  dp->begin_backward(true);
  for (size_t p = model->named_params().size(); p-- > 0;) dp->grads_ready(p, p + 1);
  dp->finish_backward();
  return std::vector<float>(grads, grads + model->grads().numel());
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// A rank-specific gradient spanning several binades, most of which bfloat16 cannot hold exactly.
float random_grad(int rank, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const float unit = static_cast<float>(static_cast<double>(x % 1000003) / 1000003.0 * 2.0 - 1.0);
  return std::ldexp(unit, static_cast<int>(i % 9) - 4);
}

}  // namespace

TEST_CASE("DataParallel grad_dtype bf16: exact values unchanged, others within bfloat16 rounding of fp32",
          "[parallel][bf16][multirank]") {
  const int size = GENERATE(2, 3);
  const bool overlap = GENERATE(true, false);
  INFO("world size " << size << ", overlap " << overlap);
  std::mutex mu;
  std::vector<std::string> fails;
  std::vector<std::vector<float>> results(static_cast<size_t>(size));
  auto fail = [&](std::string what) {
    std::lock_guard lock(mu);
    if (fails.size() < 20) fails.push_back(std::move(what));
  };
  std::string errors = run_gloo_ranks(size, [&](comm::ProcessGroup& pg) {
    const int w = pg.size();
    // Exact: g = w (r + 1) k / 2, k = i % 5 + 1: g / w and every partial sum are exact in bfloat16, so bf16
    // gives fp32's average bit for bit: k (w + 1) / 4 * w ... = k w (w + 1) / 4.
    auto exact = [&](int r, size_t i) { return static_cast<float>(w * (r + 1) * static_cast<int>(i % 5 + 1)) * 0.5f; };
    size_t nb = 0;
    const auto f32 = reduce_once(pg, DType::F32, overlap, exact, &nb);
    const auto b16 = reduce_once(pg, DType::BF16, overlap, exact);
    if (nb < 3) fail(fmt::format("only {} bucket(s)", nb));
    for (size_t i = 0; i < f32.size(); ++i) {
      const float want = static_cast<float>(static_cast<int>(i % 5 + 1) * w * (w + 1)) / 4.0f;
      if (f32[i] != want || bits(b16[i]) != bits(f32[i])) {
        fail(fmt::format("rank {} exact: element {}: fp32 {} bf16 {}, expected {}", pg.rank(), i, f32[i], b16[i], want));
        break;
      }
    }
    // Rounded: within the rounding of g / w to bfloat16 (2^-8 of it) and of w - 1 bfloat16 additions
    // (2^-8 of each partial sum), against fp32's average; every value a bfloat16; some differ from fp32.
    const auto r32 = reduce_once(pg, DType::F32, overlap, random_grad);
    const auto r16 = reduce_once(pg, DType::BF16, overlap, random_grad);
    size_t differ = 0;
    for (size_t i = 0; i < r32.size(); ++i) {
      double mean_abs = 0.0;
      for (int q = 0; q < w; ++q) mean_abs += std::fabs(random_grad(q, i)) / w;
      const double tol = w * 0x1p-8 * mean_abs * 1.01 + 1e-6 * mean_abs;
      if (std::fabs(static_cast<double>(r16[i]) - r32[i]) > tol) {
        fail(fmt::format("rank {} rounded: element {}: bf16 {} fp32 {}, more than {} apart", pg.rank(), i, r16[i],
                         r32[i], tol));
        break;
      }
      if ((bits(r16[i]) & 0xFFFFu) != 0) {
        fail(fmt::format("rank {} rounded: element {}: {} is not a bfloat16 value", pg.rank(), i, r16[i]));
        break;
      }
      differ += r16[i] != r32[i];
    }
    if (differ < r32.size() / 2)
      fail(fmt::format("rank {}: only {} of {} elements differ from fp32", pg.rank(), differ, r32.size()));
    std::lock_guard lock(mu);
    results[static_cast<size_t>(pg.rank())] = r16;
  });
  REQUIRE(errors == "");
  CHECK(fmt::format("{}", fmt::join(fails, "\n")) == "");
  for (int r = 1; r < size; ++r) {  // replicas stay identical: the same bits on every rank
    REQUIRE(results[static_cast<size_t>(r)].size() == results[0].size());
    CHECK(std::memcmp(results[static_cast<size_t>(r)].data(), results[0].data(), results[0].size() * 4) == 0);
  }
}

TEST_CASE("DataParallel grad_dtype bf16 on one rank leaves the gradients alone", "[parallel][bf16]") {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(5));
  comm::GlooProcessGroup pg(store, 0, 1);
  const auto out = reduce_once(pg, DType::BF16, true, random_grad);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == random_grad(0, i));
  auto model = models::make_mlp(2, {2}, 2);
  CHECK_THROWS_AS(trainer::make_data_parallel(pg, *model, nullptr, {.grad_dtype = DType::F64}), InternalError);
}

namespace {

// As reduce_once, under dist.zero = `zero`: the strategy's owned pieces and the (whole) gradient buffer after finish().
struct Reduced {
  std::vector<trainer::FlatRange> owned;
  std::vector<float> grads;
};
Reduced reduce_zero(comm::ProcessGroup& pg, int zero, DType grad_dtype, bool overlap,
                    const std::function<float(int, size_t)>& g) {
  auto model = models::make_mlp(5, {7}, 3);  // 66 parameters: 64-byte buckets of 3, 21, 7 and 35
  float* grads = model->grads().data<float>();
  for (size_t i = 0; i < model->grads().numel(); ++i) grads[i] = g(pg.rank(), i);
  const auto dp = trainer::make_data_parallel(pg, *model, nullptr,
                           {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64, .overlap = overlap,
                            .grad_dtype = grad_dtype, .zero = zero});
  dp->begin_backward(true);
  for (size_t p = model->named_params().size(); p-- > 0;) dp->grads_ready(p, p + 1);
  dp->finish_backward();
  return {dp->owned(), std::vector<float>(grads, grads + model->grads().numel())};
}

}  // namespace

TEST_CASE("DataParallel zero = 1: each rank's pieces averaged as DDP's all-reduce, the pieces tiling the buffer",
          "[parallel][zero][multirank]") {
  const int size = GENERATE(2, 3);
  const bool overlap = GENERATE(true, false);
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  INFO("world size " << size << ", overlap " << overlap << ", " << dtype_name(dtype));
  std::mutex mu;
  std::vector<std::string> fails;
  std::vector<std::vector<trainer::FlatRange>> owned(static_cast<size_t>(size));
  auto fail = [&](std::string what) {
    std::lock_guard lock(mu);
    if (fails.size() < 20) fails.push_back(std::move(what));
  };
  std::string errors = run_gloo_ranks(size, [&](comm::ProcessGroup& pg) {
    // Exact values (as the bf16 test's): every order of additions gives the same bits, so ZeRO must give DDP's.
    auto exact = [&](int r, size_t i) { return static_cast<float>(pg.size() * (r + 1) * static_cast<int>(i % 5 + 1)) * 0.5f; };
    for (const auto& g : std::vector<std::function<float(int, size_t)>>{exact, random_grad}) {
      const Reduced ddp = reduce_zero(pg, 0, dtype, overlap, g), z = reduce_zero(pg, 1, dtype, overlap, g);
      if (ddp.owned != std::vector<trainer::FlatRange>{{0, ddp.grads.size()}}) fail("DDP owns more or less than all");
      size_t at = 0;
      for (const auto& r : z.owned) {
        if (r.offset < at) fail(fmt::format("rank {}: pieces overlap or are out of order at {}", pg.rank(), r.offset));
        at = r.offset + r.count;
        for (size_t i = r.offset; i < r.offset + r.count; ++i) {
          // 2 ranks: a + b is the same sum in every order; 3 ranks: Gloo's reduce-scatter (an all-reduce of a copy)
          // may add in another order than the bucket all-reduce, within fp32 (bf16) rounding of the sum.
          double sum_abs = 0.0;  // what the partial sums are bounded by
          for (int q = 0; q < size; ++q) sum_abs += std::fabs(g(q, i));
          const double tol = size == 2 ? 0.0 : (dtype == DType::BF16 ? 0x1p-7 : 0x1p-22) * sum_abs;
          if (std::fabs(static_cast<double>(z.grads[i]) - ddp.grads[i]) > tol) {
            fail(fmt::format("rank {} element {}: zero {} ddp {}", pg.rank(), i, z.grads[i], ddp.grads[i]));
            break;
          }
        }
      }
      std::lock_guard lock(mu);
      owned[static_cast<size_t>(pg.rank())] = z.owned;
    }
  });
  REQUIRE(errors == "");
  CHECK(fmt::format("{}", fmt::join(fails, "\n")) == "");
  // Every element is owned by exactly one rank, or (a bucket's remainder) by all of them.
  std::vector<int> owners(66, 0);
  for (const auto& pieces : owned)
    for (const auto& r : pieces)
      for (size_t i = r.offset; i < r.offset + r.count; ++i) ++owners[i];
  size_t shared = 0;
  for (int o : owners) {
    REQUIRE((o == 1 || o == size));
    shared += o == size;
  }
  // Buckets of 3, 21, 7 and 35 elements (one parameter each, last first): remainders mod 2 are 1+1+1+1, mod 3 are
  // 0+0+1+2.
  CHECK(shared == (size == 2 ? 4u : 3u));
}

TEST_CASE("DataParallel zero = 1: after_update gives every rank every rank's pieces", "[parallel][zero][multirank]") {
  const int size = GENERATE(2, 3);
  std::mutex mu;
  std::vector<std::vector<float>> after(static_cast<size_t>(size));
  std::vector<std::vector<trainer::FlatRange>> owned(static_cast<size_t>(size));
  std::string errors = run_gloo_ranks(size, [&](comm::ProcessGroup& pg) {
    auto model = models::make_mlp(5, {7}, 3);
    const auto dp = trainer::make_data_parallel(pg, *model, nullptr, {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64, .zero = 1});
    float* p = model->params().data<float>();
    // Outside its pieces a rank holds garbage (-rank - 1); inside, the element's index (the remainders: the same on
    // every rank, as an identical update leaves them).
    for (size_t i = 0; i < model->num_params(); ++i) p[i] = -static_cast<float>(pg.rank()) - 1.0f;
    for (const auto& r : dp->owned())
      for (size_t i = r.offset; i < r.offset + r.count; ++i) p[i] = static_cast<float>(i);
    dp->after_update();
    std::lock_guard lock(mu);
    after[static_cast<size_t>(pg.rank())].assign(p, p + model->num_params());
    owned[static_cast<size_t>(pg.rank())] = dp->owned();
  });
  REQUIRE(errors == "");
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < after[static_cast<size_t>(r)].size(); ++i)
      REQUIRE(after[static_cast<size_t>(r)][i] == static_cast<float>(i));
  CHECK(owned[0] != owned[1]);
}

TEST_CASE("make_data_parallel: DDP for stage 0 or one rank, ZeRO for stages 1 and 2, FSDP for 3", "[parallel][multirank]") {
  std::mutex mu;
  std::vector<std::string> names;
  std::string errors = run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    for (int zero = 0; zero <= 3; ++zero) {
      auto model = models::make_mlp(5, {7}, 3);
      const auto dp = trainer::make_data_parallel(pg, *model, nullptr, {.zero = zero});
      std::lock_guard lock(mu);
      if (pg.rank() == 0) names.push_back(dp->name());
    }
  });
  REQUIRE(errors == "");
  CHECK(names == std::vector<std::string>{"ddp", "zero-1", "zero-2", "fsdp"});
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(5));
  comm::GlooProcessGroup one(store, 0, 1);
  auto model = models::make_mlp(5, {7}, 3);
  const auto dp = trainer::make_data_parallel(one, *model, nullptr, {.zero = 3});
  CHECK(dp->name() == "ddp");
  CHECK(dp->setup_lines() == std::vector<std::string>{"zero: dist.zero = 3 has no effect with one rank (nothing to shard)"});
  CHECK(dp->shard_lines(0, 1).empty());
  CHECK_THROWS_AS(trainer::make_data_parallel(one, *model, nullptr, {.zero = 4}), InternalError);
}

// The "reducer:" lines name the collective that carries the buckets: ZeRO's reduce-scatter, not an all-reduce (they
// once said "all-reduced" under every stage, beside the "zero:" line's "reduce-scattered").
TEST_CASE("setup_lines: DDP's buckets all-reduced and ZeRO's reduce-scattered", "[parallel][multirank]") {
  std::mutex mu;
  std::vector<std::string> lines;  // rank 0's, per stage and wire type: its lines joined
  std::string errors = run_gloo_ranks(2, [&](comm::ProcessGroup& pg) {
    for (int zero = 0; zero <= 3; ++zero)
      for (const bool overlap : {false, true})
        for (const DType wire : {DType::F32, DType::BF16}) {
          auto model = models::make_mlp(5, {7}, 3);
          const auto dp =
              trainer::make_data_parallel(pg, *model, nullptr, {.overlap = overlap, .grad_dtype = wire, .zero = zero});
          std::string joined;
          for (const std::string& l : dp->setup_lines()) joined += l + "\n";
          std::lock_guard lock(mu);
          if (pg.rank() == 0) lines.push_back(joined);
        }
  });
  REQUIRE(errors == "");
  REQUIRE(lines.size() == 16);
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool ddp = i < 4, overlap = (i / 2) % 2 == 1, bf16 = i % 2 == 1;
    INFO(lines[i]);
    const std::string verb = ddp ? "all-reduced" : "reduce-scattered";
    CHECK(lines[i].find(fmt::format("bucket(s) of gradients{} {} {} backward", overlap ? "" : ",", verb,
                                    overlap ? "during" : "after")) != std::string::npos);
    CHECK((lines[i].find(fmt::format("reducer: gradients {} in bf16", verb)) != std::string::npos) == bf16);
    if (!ddp) CHECK(lines[i].find("all-reduced") == std::string::npos);
  }
}

TEST_CASE("DataParallel zero = 1 on one rank is DDP", "[parallel][zero]") {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(5));
  comm::GlooProcessGroup pg(store, 0, 1);
  const Reduced z = reduce_zero(pg, 1, DType::F32, true, random_grad);
  CHECK(z.owned == std::vector<trainer::FlatRange>{{0, 66}});
  for (size_t i = 0; i < z.grads.size(); ++i) REQUIRE(z.grads[i] == random_grad(0, i));
}

namespace {

// What a rank keeps after a ZeRO step: its pieces and their averaged gradients (owned_grads()).
struct Kept {
  std::vector<trainer::FlatRange> owned;
  std::vector<std::vector<float>> grads;
  size_t gradient_bytes = 0, param_bytes = 0;
  bool buckets_released = true;  // stage 2: no bucket's full gradients left resident after finish()
  bool params_released = true;   // stage 3: no bucket's parameters left resident after the passes
  std::vector<float> outputs;    // the forward's outputs (stage 3: from gathered parameters)
};

// A real backward of the MLP over `micro` micro-batches of rank-specific data (the first micro - 1 silent, as
// gradient accumulation), reduced at stage `zero`.
Kept backward_reduced(comm::ProcessGroup& pg, int zero, DType grad_dtype, bool overlap, int micro) {
  auto model = models::make_mlp(5, {7}, 3);  // 66 parameters: 64-byte buckets of 3, 21, 7 and 35
  model->init(3);
  const auto dp = trainer::make_data_parallel(pg, *model, nullptr,
                           {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64, .overlap = overlap,
                            .grad_dtype = grad_dtype, .zero = zero});
  Kept out;
  for (int step = 0; step < 2; ++step) {  // the second step reuses the released storages
    model->zero_grad();
    for (int m = 0; m < micro; ++m) {
      Tensor x = Tensor::empty({4, 5}), dy = Tensor::empty({4, 3});
      for (size_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = random_grad(pg.rank() + 7 * m + 31 * step, i);
      for (size_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = random_grad(pg.rank() + 5 * m + 17 * step, i + 100);
      const Tensor& y = model->forward(x);
      out.outputs.insert(out.outputs.end(), y.data<float>(), y.data<float>() + y.numel());
      dp->begin_backward(m == micro - 1);
      model->backward(dy, [&](size_t first, size_t end) { dp->grads_ready(first, end); });
    }
    dp->finish_backward();
  }
  out.owned = dp->owned();
  for (const Tensor& g : dp->owned_grads()) out.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
  out.gradient_bytes = dp->gradient_bytes();
  out.param_bytes = dp->param_bytes();
  if (model->grads_split())
    for (const auto& np : model->named_params()) out.buckets_released &= !np.grad.storage().resident();
  if (model->params_split())
    for (const auto& np : model->named_params()) out.params_released &= !np.param.storage().resident();
  return out;
}

}  // namespace

TEST_CASE("DataParallel zero = 2 and 3: the same forward and averaged pieces as stage 1, bit for bit, keeping only the shard",
          "[parallel][zero][multirank]") {
  const int size = GENERATE(2, 3);
  const bool overlap = GENERATE(true, false);
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  const int micro = GENERATE(1, 3);
  INFO("world size " << size << ", overlap " << overlap << ", " << dtype_name(dtype) << ", micro-batches " << micro);
  std::mutex mu;
  std::vector<std::string> fails;
  auto fail = [&](std::string what) {
    std::lock_guard lock(mu);
    if (fails.size() < 20) fails.push_back(std::move(what));
  };
  std::string errors = run_gloo_ranks(size, [&](comm::ProcessGroup& pg) {
    const Kept z1 = backward_reduced(pg, 1, dtype, overlap, micro);
    for (int stage : {2, 3}) {
      const Kept z = backward_reduced(pg, stage, dtype, overlap, micro);
      if (z1.owned != z.owned) fail(fmt::format("rank {}: stage {} owns other pieces than stage 1", pg.rank(), stage));
      if (z1.outputs != z.outputs) fail(fmt::format("rank {}: stage {}'s forward differs", pg.rank(), stage));
      size_t mine = 0;
      for (size_t i = 0; i < z.owned.size(); ++i) {
        mine += z.owned[i].count;
        if (z1.grads[i] != z.grads[i]) fail(fmt::format("rank {} piece {}: stage {}'s gradients differ", pg.rank(), i, stage));
      }
      if (z.gradient_bytes != mine * sizeof(float)) fail(fmt::format("stage {} keeps {} bytes of gradients", stage, z.gradient_bytes));
      if (z.param_bytes != (stage == 3 ? mine : 66) * sizeof(float))
        fail(fmt::format("stage {} keeps {} bytes of parameters", stage, z.param_bytes));
      if (!z.buckets_released) fail(fmt::format("rank {} stage {}: a bucket's gradients stayed resident", pg.rank(), stage));
      if (!z.params_released) fail(fmt::format("rank {} stage {}: a bucket's parameters stayed resident", pg.rank(), stage));
    }
    if (z1.gradient_bytes != 66 * sizeof(float)) fail(fmt::format("stage 1 keeps {} bytes", z1.gradient_bytes));
  });
  REQUIRE(errors == "");
  CHECK(fmt::format("{}", fmt::join(fails, "\n")) == "");
}

TEST_CASE("DataParallel zero = 2 on one rank is DDP: the gradients stay one flat buffer", "[parallel][zero]") {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(5));
  comm::GlooProcessGroup pg(store, 0, 1);
  const Kept z = backward_reduced(pg, 2, DType::F32, true, 1);
  CHECK(z.owned == std::vector<trainer::FlatRange>{{0, 66}});
  CHECK(z.gradient_bytes == 66 * sizeof(float));
}

TEST_CASE("DataParallel zero = 3: with_full_params gathers every rank's pieces, and keeps what it changed",
          "[parallel][zero][multirank]") {
  const int size = GENERATE(2, 3);
  std::mutex mu;
  std::vector<std::string> fails;
  auto fail = [&](std::string what) {
    std::lock_guard lock(mu);
    if (fails.size() < 20) fails.push_back(std::move(what));
  };
  std::string errors = run_gloo_ranks(size, [&](comm::ProcessGroup& pg) {
    auto model = models::make_mlp(5, {7}, 3);
    model->init(5);
    std::vector<float> initial(model->params().data<float>(), model->params().data<float>() + 66);
    const auto dp = trainer::make_data_parallel(pg, *model, nullptr, {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 64, .zero = 3});
    if (model->params().defined()) fail("the flat parameter buffer is still there");
    // A rank's shard holds its pieces of the initial model, back to back.
    size_t at = 0;
    for (const auto& r : dp->owned())
      for (size_t j = 0; j < r.count; ++j, ++at)
        if (dp->shard_params().data<float>()[at] != initial[r.offset + j]) fail("the shard is not the initial pieces");
    if (dp->shard_params().numel() != at) fail("the shard is not the pieces back to back");
    auto whole = [&] {
      std::vector<float> v;
      dp->with_full_params([&] {
        for (const auto& np : model->named_params()) v.insert(v.end(), np.param.data<float>(), np.param.data<float>() + np.param.numel());
      }, /*changed=*/false);
      return v;
    };
    if (whole() != initial) fail(fmt::format("rank {}: the gathered model is not the initial one", pg.rank()));
    for (const auto& np : model->named_params())
      if (np.param.storage().resident()) fail(fmt::format("rank {}: {} stayed gathered", pg.rank(), np.name));
    // A load (changed): every element set to its index, on every rank; the shard takes it, a gather gives it back.
    dp->with_full_params([&] {
      for (const auto& np : model->named_params())
        for (size_t i = 0; i < np.param.numel(); ++i) np.param.data<float>()[i] = static_cast<float>(np.offset + i);
    }, /*changed=*/true);
    std::vector<float> want(66);
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i);
    if (whole() != want) fail(fmt::format("rank {}: the loaded model did not come back", pg.rank()));
    // What the optimizer does: each rank changes its chunks in the shard (by its rank + 1; the remainders, which
    // every rank owns and updates alike, stay). A gather shows every chunk moved by its owner's rank + 1.
    const auto world = static_cast<size_t>(pg.size());
    auto remainder = [&](size_t e, const trainer::Bucket& b) { return e >= b.offset + world * (b.count / world); };
    at = 0;
    for (const auto& r : dp->owned()) {
      const trainer::Bucket& b = *std::find_if(dp->buckets().begin(), dp->buckets().end(),
                                               [&](const trainer::Bucket& x) { return x.offset <= r.offset && r.offset < x.offset + x.count; });
      for (size_t j = 0; j < r.count; ++j, ++at)
        if (!remainder(r.offset + j, b)) dp->shard_params().data<float>()[at] += static_cast<float>(pg.rank() + 1);
    }
    for (const trainer::Bucket& b : dp->buckets()) {
      const size_t q = b.count / world;
      for (size_t e = b.offset; e < b.offset + b.count; ++e)
        want[e] = static_cast<float>(e) + (remainder(e, b) ? 0.0f : static_cast<float>((e - b.offset) / q + 1));
    }
    if (whole() != want) fail(fmt::format("rank {}: the gathered chunks are not their owners'", pg.rank()));
  });
  REQUIRE(errors == "");
  CHECK(fmt::format("{}", fmt::join(fails, "\n")) == "");
}

// The epoch's replica check reads the parameters through for_each_gathered: reading must not drop the fast path's
// bf16 copy that the update wrote (the next forward would round the parameters again for nothing).
TEST_CASE("DataParallel::for_each_gathered reads the parameters without dropping the update's bf16 copy",
          "[parallel][bf16act]") {
  auto store = std::make_shared<comm::HashStore>(std::chrono::seconds(5));
  comm::GlooProcessGroup pg(store, 0, 1);
  auto model = models::make_gpt({.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = 50, .block_size = 8});
  model->init(3);
  model->set_bf16_activations(true);
  const auto dp = trainer::make_data_parallel(pg, *model, nullptr, {.bucket_cap_bytes = 4096});
  model->params16_written();  // as AdamW's fused pass marks it
  REQUIRE(model->params16_current());
  size_t seen = 0;
  dp->for_each_gathered([&](const trainer::Bucket&, const Tensor& params) { seen += params.numel(); });
  CHECK(seen == model->num_params());
  CHECK(model->params16_current());
  trainer::check_replicas(*model, pg, 1, false, dp.get());
  CHECK(model->params16_current());
}
