// tests/unit/data/test_loader.cpp: Loader batches (order, sizes, resume, contents), shutdown mid-epoch,
// exceptions from the producer; SyntheticDataset determinism.
#include <catch2/catch.hpp>

#include <chrono>
#include <algorithm>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "core/check.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/subset.h"
#include "data/synthetic.h"

using namespace dpt;
using namespace dpt::data;

namespace {

// Example i has features (i, i + 0.5, ...) and label i % 7: batches can be checked in closed form.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(size_t n, size_t features = 3) : n_(n), features_(features) {}
  size_t size() const override { return n_; }
  size_t feature_count() const override { return features_; }
  int num_classes() const override { return 7; }
  std::string name() const override { return "counting"; }
  int32_t get(size_t index, float* x) const override {
    for (size_t j = 0; j < features_; ++j) x[j] = static_cast<float>(index) + 0.5f * static_cast<float>(j);
    return static_cast<int32_t>(index % 7);
  }

 private:
  size_t n_, features_;
};

// Throws an IoError when asked for example `bad`.
class ThrowingDataset : public CountingDataset {
 public:
  ThrowingDataset(size_t n, size_t bad) : CountingDataset(n), bad_(bad) {}
  int32_t get(size_t index, float* x) const override {
    if (index == bad_) DPT_THROW(IoError, "example {} is unreadable", index);
    return CountingDataset::get(index, x);
  }

 private:
  size_t bad_;
};

// Sleeps in every get(), so that the producer is always mid-batch.
class SlowDataset : public CountingDataset {
 public:
  using CountingDataset::CountingDataset;
  int32_t get(size_t index, float* x) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return CountingDataset::get(index, x);
  }
};

// Example `bad` carries label `label` (out of range for 7 classes).
class BadLabelDataset : public CountingDataset {
 public:
  BadLabelDataset(size_t n, size_t bad, int32_t label) : CountingDataset(n), bad_(bad), label_(label) {}
  int32_t get(size_t index, float* x) const override {
    const int32_t y = CountingDataset::get(index, x);
    return index == bad_ ? label_ : y;
  }

 private:
  size_t bad_;
  int32_t label_;
};

// Records the examples it is asked to prefetch, in the order asked (several threads may ask).
class PrefetchSpy : public CountingDataset {
 public:
  using CountingDataset::CountingDataset;
  void prefetch(size_t index) const override {
    std::lock_guard<std::mutex> lock(mu_);
    asked_.push_back(index);
  }
  std::vector<size_t> asked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<size_t> asked_;
};

std::vector<size_t> reversed(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = n - 1 - i;
  return v;
}

}  // namespace

TEST_CASE("batches cover the indices in order with the right sizes", "[data][loader]") {
  CountingDataset ds(50);
  for (size_t n : {0, 1, 10, 23, 24}) {
    for (size_t batch : {1, 4, 8, 30}) {
      for (bool drop_last : {false, true}) {
        for (size_t prefetch : {1, 2, 5}) {
          INFO("n " << n << " batch " << batch << " drop_last " << drop_last << " prefetch " << prefetch);
          auto indices = reversed(n);
          Loader loader(ds, indices, {batch, drop_last, prefetch});
          const size_t full = n / batch;
          const size_t expected_batches = drop_last || n % batch == 0 ? full : full + 1;
          REQUIRE(loader.num_batches() == expected_batches);
          size_t pos = 0, count = 0;
          while (auto b = loader.next()) {
            REQUIRE(b->index == count);
            const size_t expected_size = std::min(batch, n - count * batch);
            REQUIRE(b->size == expected_size);
            REQUIRE(b->features.shape() == std::vector<int64_t>{static_cast<int64_t>(expected_size), 3});
            REQUIRE(b->labels.shape() == std::vector<int64_t>{static_cast<int64_t>(expected_size)});
            REQUIRE(b->features.dtype() == DType::F32);
            REQUIRE(b->labels.dtype() == DType::I32);
            const float* x = b->features.data<float>();
            const int32_t* y = b->labels.data<int32_t>();
            for (size_t k = 0; k < b->size; ++k, ++pos) {
              const size_t i = indices[pos];
              REQUIRE(y[k] == static_cast<int32_t>(i % 7));
              REQUIRE(x[k * 3] == static_cast<float>(i));
              REQUIRE(x[k * 3 + 2] == static_cast<float>(i) + 1.0f);
            }
            ++count;
          }
          REQUIRE(count == expected_batches);
          REQUIRE(pos == (drop_last ? full * batch : n));
          REQUIRE_FALSE(loader.next().has_value());  // stays at the end
          REQUIRE(loader.wait_seconds() >= 0.0);
        }
      }
    }
  }
}

TEST_CASE("start_batch resumes mid-epoch", "[data][loader]") {
  CountingDataset ds(100);
  std::vector<size_t> indices(100);
  std::iota(indices.begin(), indices.end(), size_t{0});
  Loader loader(ds, indices, {16, false, 2}, 3);
  REQUIRE(loader.num_batches() == 7);  // the whole epoch, skipped batches included
  std::vector<size_t> seen_index, seen_size;
  while (auto b = loader.next()) {
    seen_index.push_back(b->index);
    seen_size.push_back(b->size);
    REQUIRE(b->labels.data<int32_t>()[0] == static_cast<int32_t>((b->index * 16) % 7));
    REQUIRE(b->features.data<float>()[0] == static_cast<float>(b->index * 16));
  }
  REQUIRE(seen_index == std::vector<size_t>{3, 4, 5, 6});
  REQUIRE(seen_size == std::vector<size_t>{16, 16, 16, 4});

  Loader at_end(ds, indices, {16, false, 2}, 7);  // resuming exactly at the end: nothing left
  REQUIRE_FALSE(at_end.next().has_value());
  REQUIRE_THROWS_AS(Loader(ds, indices, {16, false, 2}, 8), ConfigError);
  REQUIRE_THROWS_AS(Loader(ds, indices, {16, true, 2}, 7), ConfigError);  // drop_last: 6 batches
}

TEST_CASE("features match Dataset::get on a sampler's order", "[data][loader]") {
  SyntheticDataset ds(37, 5, 4, 123);
  SamplerOptions so;
  so.dataset_size = ds.size();
  so.rank = 1;
  so.world_size = 3;
  so.seed = 5;
  DistributedSampler sampler(so);
  auto indices = sampler.indices(2);
  Loader loader(ds, indices, {4, false, 3});
  std::vector<float> x(5);
  size_t pos = 0;
  while (auto b = loader.next()) {
    for (size_t k = 0; k < b->size; ++k, ++pos) {
      const int32_t y = ds.get(indices[pos], x.data());
      REQUIRE(b->labels.data<int32_t>()[k] == y);
      for (size_t j = 0; j < 5; ++j) REQUIRE(b->features.data<float>()[k * 5 + j] == x[j]);
    }
  }
  REQUIRE(pos == sampler.num_samples());
}

TEST_CASE("destroying a Loader mid-epoch does not hang", "[data][loader]") {
  const auto start = std::chrono::steady_clock::now();
  CountingDataset big(100000, 8);
  std::vector<size_t> indices(100000);
  std::iota(indices.begin(), indices.end(), size_t{0});
  {
    Loader never_read(big, indices, {64, false, 2});  // producer blocked on a full queue
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    Loader read_some(big, indices, {64, false, 2});
    REQUIRE(read_some.next().has_value());
    REQUIRE(read_some.next().has_value());
  }
  {
    SlowDataset slow(1000);
    std::vector<size_t> all(1000);
    std::iota(all.begin(), all.end(), size_t{0});
    Loader mid_batch(slow, all, {500, false, 2});  // one batch takes ~1 s: stop must cut it short
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(seconds < 0.5);
}

TEST_CASE("an exception in the producer is rethrown by next(), after the batches before it", "[data][loader]") {
  ThrowingDataset ds(40, 21);
  std::vector<size_t> indices(40);
  std::iota(indices.begin(), indices.end(), size_t{0});
  Loader loader(ds, indices, {8, false, 2});
  for (int b = 0; b < 2; ++b) REQUIRE(loader.next().has_value());  // batches 0 and 1: examples 0..15
  REQUIRE_THROWS_AS(loader.next(), IoError);                         // batch 2 holds example 21
  REQUIRE_THROWS_WITH(loader.next(), Catch::Contains("example 21 is unreadable"));
}

TEST_CASE("several workers: the same batches in the same order", "[data][loader]") {
  CountingDataset ds(61, 5);
  for (size_t workers : {2, 3, 8}) {
    for (size_t batch : {1, 7, 64}) {
      INFO("workers " << workers << " batch " << batch);
      auto indices = reversed(61);
      Loader one(ds, indices, {.batch_size = batch, .workers = 1});
      Loader many(ds, indices, {.batch_size = batch, .workers = workers});
      REQUIRE(many.num_batches() == one.num_batches());
      while (auto a = one.next()) {
        auto b = many.next();
        REQUIRE(b.has_value());
        REQUIRE(b->index == a->index);
        REQUIRE(b->size == a->size);
        for (size_t k = 0; k < a->size * 5; ++k) REQUIRE(b->features.data<float>()[k] == a->features.data<float>()[k]);
        for (size_t k = 0; k < a->size; ++k) REQUIRE(b->labels.data<int32_t>()[k] == a->labels.data<int32_t>()[k]);
        many.recycle(std::move(*b));
      }
      REQUIRE_FALSE(many.next().has_value());
    }
  }
}

namespace {
// Examples `slow_bad` (after a delay) and `fast_bad` (at once) both throw: with several workers the later
// row usually fails first in time, yet the earlier row's error is the one reported, as with one worker.
class TwoBadDataset : public CountingDataset {
 public:
  TwoBadDataset(size_t n, size_t slow_bad, size_t fast_bad) : CountingDataset(n), slow_(slow_bad), fast_(fast_bad) {}
  int32_t get(size_t index, float* x) const override {
    if (index == slow_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      DPT_THROW(IoError, "example {} is unreadable", index);
    }
    if (index == fast_) DPT_THROW(IoError, "example {} is unreadable", index);
    return CountingDataset::get(index, x);
  }

 private:
  size_t slow_, fast_;
};
}  // namespace

TEST_CASE("several workers: the earliest failing row's error, after the batches before it", "[data][loader]") {
  for (size_t workers : {1, 3}) {
    INFO("workers " << workers);
    TwoBadDataset ds(40, 17, 22);  // batch 2 (rows 16..23) holds both, at rows 1 and 6
    std::vector<size_t> indices(40);
    std::iota(indices.begin(), indices.end(), size_t{0});
    Loader loader(ds, indices, {.batch_size = 8, .workers = workers});
    for (int b = 0; b < 2; ++b) REQUIRE(loader.next().has_value());
    REQUIRE_THROWS_WITH(loader.next(), Catch::Contains("example 17 is unreadable"));
    REQUIRE_THROWS_WITH(loader.next(), Catch::Contains("example 17 is unreadable"));
  }
  // A bad label is an error of its row too.
  BadLabelDataset bad(20, 13, 9);
  std::vector<size_t> all(20);
  std::iota(all.begin(), all.end(), size_t{0});
  Loader loader(bad, all, {.batch_size = 10, .workers = 3});
  REQUIRE(loader.next().has_value());
  REQUIRE_THROWS_WITH(loader.next(), Catch::Contains("example 13 has label 9"));
}

TEST_CASE("several workers: destroying a Loader mid-batch does not hang", "[data][loader]") {
  const auto start = std::chrono::steady_clock::now();
  SlowDataset slow(3000);
  std::vector<size_t> all(3000);
  std::iota(all.begin(), all.end(), size_t{0});
  {
    Loader mid_batch(slow, all, {.batch_size = 1500, .prefetch = 2, .workers = 3});  // ~1 s per batch
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    CountingDataset fast(100000, 8);
    std::vector<size_t> indices(100000);
    std::iota(indices.begin(), indices.end(), size_t{0});
    Loader read_some(fast, indices, {.batch_size = 64, .prefetch = 2, .workers = 4});
    REQUIRE(read_some.next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // producer now blocked on a full queue
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(seconds < 0.5);
}

TEST_CASE("bad loader options and indices throw", "[data][loader]") {
  CountingDataset ds(10);
  REQUIRE_THROWS_AS(Loader(ds, {0, 1}, {0, false, 2}), ConfigError);
  REQUIRE_THROWS_AS(Loader(ds, {0, 1}, {4, false, 0}), ConfigError);
  REQUIRE_THROWS_WITH(Loader(ds, {0, 1}, {.batch_size = 4, .workers = 0}), Catch::Contains("workers must be >= 1"));
  REQUIRE_THROWS_WITH(Loader(ds, {0, 10}, {4, false, 2}), Catch::Contains("index 10 at position 1"));
}

TEST_CASE("wait_seconds counts the time next() waits for a slow producer", "[data][loader]") {
  SlowDataset slow(20);
  std::vector<size_t> all(20);
  std::iota(all.begin(), all.end(), size_t{0});
  Loader loader(slow, all, {10, false, 1});
  while (loader.next()) {
  }
  // 20 examples x 2 ms, of which next() waited for nearly all: at least the first batch's 20 ms.
  REQUIRE(loader.wait_seconds() > 0.015);
}

TEST_CASE("SyntheticDataset is deterministic, in range and learnable", "[data][synthetic]") {
  SyntheticDataset a(1000, 16, 4, 42), b(1000, 16, 4, 42), other(1000, 16, 4, 43);
  REQUIRE(a.size() == 1000);
  REQUIRE(a.feature_count() == 16);
  REQUIRE(a.num_classes() == 4);
  std::vector<float> xa(16), xb(16), xo(16);
  std::vector<size_t> per_class(4, 0);
  double sum = 0.0, sum_sq = 0.0;
  bool any_different = false;
  for (size_t i = 0; i < 1000; ++i) {
    const int32_t ya = a.get(i, xa.data());
    REQUIRE(b.get(i, xb.data()) == ya);
    REQUIRE(a.get(i, xb.data()) == ya);  // pure: asking again gives the same
    REQUIRE(xa == xb);
    other.get(i, xo.data());
    any_different = any_different || xo != xa;
    REQUIRE((ya >= 0 && ya < 4));
    per_class[static_cast<size_t>(ya)]++;
    for (float v : xa) {
      REQUIRE(std::isfinite(v));
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
  }
  REQUIRE(any_different);
  // Features ~ N(0, 1): over 16000 values, mean within ~4 sd (0.008 each) and variance near 1.
  REQUIRE(std::abs(sum / 16000) < 0.04);
  REQUIRE(std::abs(sum_sq / 16000 - 1.0) < 0.06);
  for (size_t c : per_class) REQUIRE(c > 100);  // every class present in quantity

  // Thread safe: the same values from another thread at once.
  std::vector<int32_t> labels_here(1000), labels_there(1000);
  std::thread t([&] {
    std::vector<float> x(16);
    for (size_t i = 0; i < 1000; ++i) labels_there[i] = a.get(i, x.data());
  });
  for (size_t i = 0; i < 1000; ++i) labels_here[i] = a.get(i, xa.data());
  t.join();
  REQUIRE(labels_here == labels_there);

  // Learnable: a linear rule fitted from the class means of examples 0..999 (nearest centroid by dot
  // product) labels the unseen examples 1000..1999 far better than chance (25%).
  SyntheticDataset more(2000, 16, 4, 42);
  std::vector<double> centroid(4 * 16, 0.0);
  for (size_t i = 0; i < 1000; ++i) {
    const int32_t y = more.get(i, xa.data());
    for (size_t j = 0; j < 16; ++j) centroid[static_cast<size_t>(y) * 16 + j] += xa[j];
  }
  size_t correct = 0;
  for (size_t i = 1000; i < 2000; ++i) {
    const int32_t y = more.get(i, xa.data());
    int32_t best = 0;
    double best_score = -1e300;
    for (int32_t c = 0; c < 4; ++c) {
      double score = 0.0;
      for (size_t j = 0; j < 16; ++j) score += centroid[static_cast<size_t>(c) * 16 + j] * xa[j];
      if (score > best_score) {
        best = c;
        best_score = score;
      }
    }
    correct += best == y ? 1 : 0;
  }
  INFO("nearest-centroid accuracy " << correct / 10.0 << "%");
  REQUIRE(correct > 700);

  REQUIRE_THROWS_AS(SyntheticDataset(10, 0, 2, 1), ConfigError);
  REQUIRE_THROWS_AS(SyntheticDataset(10, 4, 0, 1), ConfigError);
  REQUIRE_THROWS_AS(a.get(1000, xa.data()), InternalError);
}

TEST_CASE("recycled batches are refilled in place, partial last batches included", "[data][loader]") {
  SyntheticDataset ds(37, 5, 4, 7);
  std::vector<size_t> order(37);
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  // pin_memory asks for page-locked buffers; without a GPU they are plain host memory, with the same reuse.
  Loader loader(ds, order, {.batch_size = 8, .drop_last = false, .prefetch = 1, .pin_memory = true});
  std::set<const void*> buffers;
  std::vector<float> expect(5);
  size_t seen = 0;
  while (auto batch = loader.next()) {
    REQUIRE(batch->features.dim(0) == static_cast<int64_t>(batch->size));
    REQUIRE(batch->features_buffer.dim(0) == 8);  // full capacity, even for the last batch of 5
    REQUIRE(batch->features.raw() == batch->features_buffer.raw());
    for (size_t k = 0; k < batch->size; ++k) {
      const int32_t label = ds.get(order[seen + k], expect.data());
      REQUIRE(batch->labels.data<int32_t>()[k] == label);
      for (size_t f = 0; f < 5; ++f) REQUIRE(batch->features.data<float>()[k * 5 + f] == expect[f]);
    }
    seen += batch->size;
    buffers.insert(batch->features_buffer.raw());
    loader.recycle(std::move(*batch));
  }
  REQUIRE(seen == 37);
  // 5 batches through at most prefetch + 2 live buffers (queued, being filled, handed out): reuse happened.
  REQUIRE(buffers.size() <= 3);
}

TEST_CASE("a batch size past the examples allocates only their rows", "[data][loader]") {
  // train.eval_batch_size = 2^60 over 8 test examples once asked for 16 million TiB ("out of host memory"), and the
  // default 1000 over a few test examples for rows never filled.
  SyntheticDataset ds(37, 5, 4, 7);
  std::vector<size_t> order = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  for (const size_t batch_size : {size_t{1} << 60, size_t{1000}, size_t{10}}) {
    Loader loader(ds, order, {.batch_size = batch_size, .drop_last = false, .prefetch = 2});
    REQUIRE(loader.num_batches() == 1);
    auto batch = loader.next();
    REQUIRE(batch);
    REQUIRE(batch->size == order.size());
    REQUIRE(batch->features_buffer.dim(0) == static_cast<int64_t>(order.size()));
    std::vector<float> expect(5);
    for (size_t k = 0; k < order.size(); ++k)
      REQUIRE(batch->labels.data<int32_t>()[k] == ds.get(order[k], expect.data()));
    loader.recycle(std::move(*batch));
    REQUIRE(!loader.next());
  }
}

TEST_CASE("a label outside 0..classes-1 is an IoError naming the example, on every device", "[data][loader]") {
  // kLeftOut (-1, an example the data set leaves out: an evaluation's image that could not be decoded) passes, the
  // loss kernels' kIgnoreLabel.
  {
    BadLabelDataset ds(20, 13, kLeftOut);
    Loader loader(ds, reversed(20), {.batch_size = 4, .drop_last = false, .prefetch = 2});
    size_t left_out = 0;
    while (auto b = loader.next()) {
      const int32_t* y = b->labels.data<int32_t>();
      left_out += static_cast<size_t>(std::count(y, y + b->size, kLeftOut));
    }
    REQUIRE(left_out == 1);
  }
  for (int32_t label : {-2, 7, 1000}) {
    BadLabelDataset ds(20, 13, label);
    Loader loader(ds, reversed(20), {.batch_size = 4, .drop_last = false, .prefetch = 2});
    size_t batches = 0;
    try {
      while (loader.next()) ++batches;
      FAIL("no error for label " << label);
    } catch (const IoError& e) {
      REQUIRE_THAT(e.what(), Catch::Matchers::Contains("example 13 has label " + std::to_string(label)) &&
                                 Catch::Matchers::Contains("outside [0, 7)"));
    }
    REQUIRE(batches == 1);  // example 13 sits in the second batch of the reversed order (19..16, 15..12)
  }
}

TEST_CASE("the loader asks its data set to prefetch each example two of a thread's rows ahead", "[data][loader]") {
  const auto indices = reversed(61);
  const size_t ahead = Loader::kPrefetchRows;
  for (size_t workers : {1, 3}) {
    for (size_t start : {0, 2}) {
      INFO("workers " << workers << ", starting at batch " << start);
      PrefetchSpy spy(61, 5);
      CountingDataset plain(61, 5);
      Loader loader(spy, indices, {.batch_size = 7, .workers = workers}, start);
      Loader reference(plain, indices, {.batch_size = 7}, start);
      // The batches are the ones a data set without the hint gives.
      while (auto a = reference.next()) {
        auto b = loader.next();
        REQUIRE(b.has_value());
        REQUIRE(b->index == a->index);
        for (size_t k = 0; k < a->size * 5; ++k) REQUIRE(b->features.data<float>()[k] == a->features.data<float>()[k]);
      }
      REQUIRE_FALSE(loader.next().has_value());
      // Row r (from the first one read, start * 7) asks for the example of row r + 2 x workers, while there is one:
      // every example from that row on, each once (in order with one worker; several threads ask in any order).
      std::vector<size_t> asked = spy.asked();
      const std::vector<size_t> expected(indices.begin() + static_cast<std::ptrdiff_t>(start * 7 + ahead * workers),
                                         indices.end());
      if (workers > 1) std::sort(asked.begin(), asked.end(), std::greater<>());
      REQUIRE(asked == expected);
    }
  }
}

TEST_CASE("Subset passes a prefetch on to its base's example, and ignores one past its end", "[data][loader]") {
  auto spy = std::make_shared<PrefetchSpy>(20);
  Subset strided(spy, 1, 5, 3);  // examples 1, 4, 7, 10, 13
  strided.prefetch(2);
  strided.prefetch(4);
  strided.prefetch(5);  // past the end: nothing
  REQUIRE(spy->asked() == std::vector<size_t>{7, 13});
}
