// bench/loader_bench.cpp: dpt-loader-bench, how fast dptrain's Loader fills batches, consuming nothing else: what the
// loader alone can deliver to a training step.
//
// Each epoch reads the training split in the DistributedSampler's shuffled order for that epoch (one rank), in
// batches from a number of threads, as the trainer does.
//  - Without --config: Fashion-MNIST in memory, with and without Dataset::prefetch, side by side: the two modes
//    alternate epoch by epoch, so that both see the same machine ("prefetch" is the data set as the trainer reads
//    it; "no prefetch" the same data set behind a wrapper that forwards get() and drops the hint; the GPU's MLP at
//    batch 1024 asks about a million examples a second). Prints one line per epoch and a table of each mode's
//    median examples/s and their ratio.
//  - With --config FILE [key=value ...]: the training set dptrain would read with that config (an image folder:
//    decoding and the random transforms in the workers), data.workers threads and train.batch_size (--workers and
//    --batch override them), at most --max-batches batches an epoch; scripts/bench/loader_bench.sh sets it beside
//    torchvision's ImageFolder and DataLoader. Prints one line per epoch and the median examples/s.
// Exit status: 0, or 1 when the two modes' batches differ (the hint must change no byte) or the data cannot be read,
// 2 for a bad command line or config.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cli_checks.h"
#include "core/cuda.h"
#include "data/idx.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "trainer/config.h"
#include "trainer/datasets.h"

namespace {

using namespace dpt;
using namespace dpt::data;

// The base data set without the hint: every call but prefetch() forwarded.
class WithoutPrefetch final : public Dataset {
 public:
  explicit WithoutPrefetch(const Dataset& base) : base_(base) {}
  size_t size() const override { return base_.size(); }
  size_t feature_count() const override { return base_.feature_count(); }
  int num_classes() const override { return base_.num_classes(); }
  std::string name() const override { return base_.name(); }
  std::vector<int64_t> sample_shape() const override { return base_.sample_shape(); }
  int32_t get(size_t index, float* features) const override { return base_.get(index, features); }

 private:
  const Dataset& base_;
};

struct EpochResult {
  double seconds = 0;
  size_t examples = 0;
  uint64_t checksum = 0;  // over every batch's bytes, features and labels: the same for both modes
};

uint64_t fold(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;  // FNV-1a
  return h;
}

// One epoch of `order` (its first max_batches batches; 0: all).
EpochResult run_epoch(const Dataset& ds, std::vector<size_t> order, const LoaderOptions& opts, bool check,
                      size_t max_batches = 0) {
  if (max_batches > 0 && order.size() > max_batches * opts.batch_size) order.resize(max_batches * opts.batch_size);
  EpochResult r;
  r.checksum = 14695981039346656037ull;
  const auto start = std::chrono::steady_clock::now();
  Loader loader(ds, std::move(order), opts);
  while (auto b = loader.next()) {
    r.examples += b->size;
    if (check) {
      r.checksum = fold(r.checksum, b->features.raw(), b->size * ds.feature_count() * sizeof(float));
      r.checksum = fold(r.checksum, b->labels.raw(), b->size * sizeof(int32_t));
    }
    loader.recycle(std::move(*b));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// --config: the training set of a dptrain config, as the trainer reads it. Returns the exit status.
int run_config(const std::string& path, const std::vector<std::string>& overrides, size_t batch, size_t workers,
               int epochs, size_t max_batches, bool checksum) {
  trainer::Config cfg;
  trainer::Datasets ds;
  try {
    cfg = trainer::load_config(path, overrides);
    if (batch == 0) batch = static_cast<size_t>(cfg.train.batch_size);
    if (workers == 0) workers = static_cast<size_t>(cfg.data.workers);
    ds = trainer::make_datasets(cfg.data, cfg.model, static_cast<uint64_t>(cfg.train.seed));
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "dpt-loader-bench: %s\n", e.what());
    return 2;
  }
  const Dataset& train = *ds.train;
  const DistributedSampler sampler(
      {.dataset_size = train.size(), .seed = static_cast<uint64_t>(cfg.train.seed)});
  const LoaderOptions opts{.batch_size = batch, .prefetch = static_cast<size_t>(cfg.data.prefetch),
                           .pin_memory = cuda::device_count() > 0, .workers = workers};
  std::printf("# dpt-loader-bench: %s (%s), %zu examples of %zu floats, batch %zu, %zu worker(s), %s memory, %d "
              "epochs of at most %s batches\n", train.name().c_str(), path.c_str(), train.size(),
              train.feature_count(), batch, workers, opts.pin_memory ? "pinned" : "pageable", epochs,
              max_batches > 0 ? std::to_string(max_batches).c_str() : "all");
  std::vector<double> rate;
  for (int e = 0; e < epochs; ++e) {
    ds.train->set_epoch(e);
    const EpochResult r = run_epoch(train, sampler.indices(e), opts, checksum, max_batches);
    rate.push_back(static_cast<double>(r.examples) / r.seconds);
    std::printf("epoch %d: %zu examples in %.3f s, %.1f examples/s", e + 1, r.examples, r.seconds, rate.back());
    if (checksum) std::printf(", batches' FNV-1a %016llx", static_cast<unsigned long long>(r.checksum));
    std::printf("\n");
  }
  if (rate.size() > 1) rate.erase(rate.begin());
  std::printf("\nexamples/s (median of epochs %s): %.1f\n", epochs > 1 ? "2 on" : "1", median(rate));
  return 0;
}

// The options of the mode not chosen would be ignored: refuses them (false, with a message) rather than time
// something other than what was asked.
bool other_mode_options_absent(const CLI::App& app, bool with_config) {
  const std::vector<std::string> other = with_config ? std::vector<std::string>{"--data", "--seed"}
                                                     : std::vector<std::string>{"--max-batches", "--checksum"};
  for (const std::string& opt : other) {
    if (app.count(opt) > 0) {
      std::fprintf(stderr, "dpt-loader-bench: %s %s\n", opt.c_str(),
                   with_config ? "is for the Fashion-MNIST mode, not --config (set data.* keys)" : "needs --config");
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = kFashionMnistDir, config;
  std::vector<std::string> overrides;
  size_t batch = 0, workers = 0, max_batches = 0;
  bool checksum = false;
  int epochs = 6;
  uint64_t seed = 42;
  CLI::App app{"dpt-loader-bench: examples/s the Loader delivers in a shuffled order, consuming nothing else. "
               "Without --config, from Fashion-MNIST with and without Dataset::prefetch (the modes alternate epoch by "
               "epoch; the batches are checked to be the same); with it, from that config's training set"};
  app.add_option("--data", dir, "Fashion-MNIST directory (without --config)")->capture_default_str();
  app.add_option("-c,--config", config, "a dptrain config (TOML): time its training set as the trainer reads it");
  app.add_option("--batch", batch, "examples a batch (default: 1024; with --config, train.batch_size)")
      ->check(cli::Positive);
  app.add_option("--workers", workers, "the loader's threads (default: 1; with --config, data.workers)")
      ->check(cli::Positive);
  app.add_option("--epochs", epochs, "epochs (of each mode; the first is left out of the median when there are more)")
      ->capture_default_str()->check(cli::Positive);
  app.add_option("--max-batches", max_batches, "with --config: at most this many batches an epoch (0: all)")
      ->capture_default_str()->check(cli::NonNegative);
  app.add_flag("--checksum", checksum, "with --config: print each epoch's FNV-1a hash of its batches' bytes (a change "
               "that must not alter the data gives the same hashes; the hashing slows the epoch)");
  app.add_option("--seed", seed, "the sampler's seed (without --config; with it, train.seed)")->capture_default_str();
  app.add_option("overrides", overrides, "with --config: dptrain config overrides, key=value (data.dir=DIR ...)");
  app.footer("Exit status: 0; 1 when the two modes' batches differ or the data cannot be read; 2 for a bad command "
             "line or config.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the error and usage
    return rc == 0 ? 0 : 2;
  }
  if (!other_mode_options_absent(app, !config.empty())) return 2;
  if (config.empty() && !overrides.empty()) {
    std::fprintf(stderr, "dpt-loader-bench: key=value overrides need --config\n");
    return 2;
  }
  if (!config.empty()) {
    try {
      return run_config(config, overrides, batch, workers, epochs, max_batches, checksum);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dpt-loader-bench: %s\n", e.what());
      return 1;
    }
  }
  if (batch == 0) batch = 1024;
  if (workers == 0) workers = 1;

  try {
    const auto ds = load_fashion_mnist(dir, /*train=*/true);
    const WithoutPrefetch plain(*ds);
    const DistributedSampler sampler({.dataset_size = ds->size(), .seed = seed});
    const LoaderOptions opts{.batch_size = batch, .pin_memory = cuda::device_count() > 0, .workers = workers};
    std::printf("# dpt-loader-bench: %s, %zu examples of %zu floats, batch %zu, %zu worker(s), %s memory, %d epochs "
                "a mode\n", ds->name().c_str(), ds->size(), ds->feature_count(), batch, workers,
                opts.pin_memory ? "pinned" : "pageable", epochs);
    std::vector<double> rate[2];
    bool same = true;
    for (int e = 0; e < epochs; ++e) {
      const std::vector<size_t> order = sampler.indices(e);
      EpochResult r[2];
      for (int m = 0; m < 2; ++m) {  // in turn: prefetch first in even epochs, second in odd ones
        const int mode = (m + e) % 2;
        r[mode] = run_epoch(mode == 0 ? static_cast<const Dataset&>(*ds) : plain, order, opts, /*check=*/e == 0);
        rate[mode].push_back(static_cast<double>(r[mode].examples) / r[mode].seconds);
      }
      if (e == 0) same = r[0].checksum == r[1].checksum && r[0].examples == r[1].examples;
      std::printf("epoch %d: prefetch %.3f M examples/s, no prefetch %.3f M examples/s\n", e + 1, rate[0].back() / 1e6,
                  rate[1].back() / 1e6);
    }
    for (auto& v : rate)
      if (v.size() > 1) v.erase(v.begin());
    const double with = median(rate[0]), without = median(rate[1]);
    std::printf("\n| mode | examples/s (median of epochs %s) |\n|---|---:|\n", epochs > 1 ? "2 on" : "1");
    std::printf("| prefetch (the trainer's) | %.0f |\n| no prefetch | %.0f |\n", with, without);
    std::printf("\nprefetch / no prefetch: %.2f\n", with / without);
    if (!same) {
      std::fprintf(stderr, "dpt-loader-bench: the batches with and without prefetch differ\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpt-loader-bench: %s\n", e.what());
    return 1;
  }
}
