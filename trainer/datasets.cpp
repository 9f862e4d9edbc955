// trainer/datasets.cpp: the data sets of a config (trainer/datasets.h).
#include "trainer/datasets.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <chrono>
#include <exception>
#include <filesystem>
#include <thread>

#include "core/check.h"
#include "core/tensor.h"
#include "data/bpe.h"
#include "data/load_tokenizer.h"
#include "data/output_dir.h"
#include "data/augmented.h"
#include "data/export.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/subset.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "data/transforms.h"
#include "trainer/preemption.h"

namespace dpt::trainer {
namespace {

// `limit` examples spread evenly over `d` (image folders are sorted by class: every class keeps its share).
std::unique_ptr<data::Dataset> limited(std::unique_ptr<data::Dataset> d, int64_t limit) {
  if (limit <= 0 || static_cast<size_t>(limit) >= d->size()) return d;
  return std::make_unique<data::Subset>(std::shared_ptr<data::Dataset>(std::move(d)), static_cast<size_t>(limit),
                                        data::Subset::Spread{});
}

}  // namespace

std::vector<std::string> class_names(const DataConfig& d) {
  if (d.dataset == DatasetKind::fashion_mnist) return data::fashion_mnist_class_folders();
  if (d.dataset == DatasetKind::imagefolder) return data::list_class_folders(d.dir, data::kTrainSplit);
  return {};
}

Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed, Splits splits) {
  Datasets ds;
  const bool train = splits == Splits::both;
  const auto mode = data::parse_transform_mode(d.augment);
  if (d.dataset == DatasetKind::fashion_mnist) {
    if (mode == data::TransformMode::random_resized_crop)
      DPT_THROW(ConfigError, "data.augment = random_resized_crop is for image folders; Fashion-MNIST takes none or crop_flip");
    if (train) {
      auto train_set = data::load_fashion_mnist(d.dir, true, static_cast<size_t>(d.train_limit));
      if (mode == data::TransformMode::crop_flip) {
        const auto options = data::AugmentedDataset::crop_flip(*train_set, d.padding, seed);
        ds.train = std::make_unique<data::AugmentedDataset>(std::move(train_set), options);
      } else {
        ds.train = std::move(train_set);
      }
    }
    ds.test = data::load_fashion_mnist(d.dir, false, static_cast<size_t>(d.test_limit));
    ds.classes = class_names(d);
  } else if (token_data(d.dataset)) {
    if (train)
      ds.train = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "train", m.block_size, m.vocab_size),
                         d.train_limit);
    ds.test = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "val", m.block_size, m.vocab_size),
                      d.test_limit);
  } else if (d.dataset == DatasetKind::imagefolder) {
    data::ImageFolderOptions o;
    o.dir = d.dir;
    o.image_size = d.image_size;
    o.resize = d.resize;
    o.padding = d.padding;
    o.augment = mode;
    o.mean.assign(d.mean.begin(), d.mean.end());
    o.std.assign(d.std.begin(), d.std.end());
    o.channels = static_cast<int>(d.channels);
    o.skip_bad_images = d.skip_bad_images;
    o.seed = seed;
    if (train) ds.train = limited(data::make_image_folder(o, true), d.train_limit);
    auto test = data::make_image_folder(o, false);  // checks that train/, where it exists, has the same classes
    ds.classes = train ? class_names(d) : test->class_names();
    ds.test = limited(std::move(test), d.test_limit);
  } else {
    // One synthetic set split in two: the same labelling function, disjoint examples.
    const auto n_train = static_cast<size_t>(d.synthetic_train_size), n_test = static_cast<size_t>(d.synthetic_test_size);
    int64_t features = 1;
    for (int64_t dim : d.synthetic_shape) features *= dim;
    auto all = std::make_shared<data::SyntheticDataset>(n_train + n_test, static_cast<size_t>(features), 10, seed,
                                                        d.synthetic_shape);
    if (train) ds.train = std::make_unique<data::Subset>(all, 0, n_train);
    ds.test = std::make_unique<data::Subset>(all, n_train, n_test);
  }
  return ds;
}

std::unique_ptr<data::Tokenizer> jsonl_tokenizer(const Config& cfg) {
  if (!cfg.data.tokenizer.empty()) return data::open_tokenizer(cfg.data.tokenizer);
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path from(cfg.model.init_from);
  if (!cfg.model.init_from.empty() && fs::is_directory(from, ec) &&
      (fs::exists(from / data::kHfTokenizerFile, ec) || fs::exists(from / data::kBpeVocabFile, ec)))
    return data::load_tokenizer(from);
  return std::make_unique<data::ByteTokenizer>();
}

namespace {

void log_jsonl_summary(const data::JsonlSummary& s, double seconds) {
  spdlog::info("tokenize: {} JSON Lines files, {:.1f} MB: {} documents ({} text, {} prompt/completion){}", s.files,
               s.bytes / 1e6, s.text_documents + s.prompt_documents, s.text_documents, s.prompt_documents,
               s.bad_lines == 0 ? std::string() : fmt::format("; skipped {} malformed lines", s.bad_lines));
  for (const std::string& bad : s.bad_line_examples) spdlog::warn("tokenize: skipped {}", bad);
  data::warn_dropped_bytes(s.dropped_bytes, s.dropped_examples, s.tokenizer);
  spdlog::info("tokenize: each document is {}its text (or prompt, then completion), then EOS = id {}; {}",
               s.bos >= 0 ? fmt::format("BOS = id {}, then ", s.bos) : "", s.eos, s.tokenizer);
  spdlog::info("tokenize: wrote train {} documents, {} tokens ({} trained) in {} shards; val {} documents, {} tokens "
               "({} trained) in {} shards; to {} in {:.2f} s",
               s.train_documents, s.train_tokens, s.train_trained, s.train_shards.size(), s.val_documents,
               s.val_tokens, s.val_trained, s.val_shards.size(), s.out_dir, seconds);
}

}  // namespace

data::JsonlSummary tokenize_jsonl_logged(data::JsonlOptions o, const data::Tokenizer& tokenizer,
                                         double progress_interval_s, bool log) {
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  o.progress = [&](uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (log && done < total && std::chrono::duration<double>(now - last).count() > progress_interval_s) {
      last = now;
      spdlog::info("tokenize: {:.1f} of {:.1f} MB", done / 1e6, total / 1e6);
    }
  };
  data::JsonlSummary s = data::tokenize_jsonl(o, tokenizer);
  if (log) log_jsonl_summary(s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return s;
}

namespace {

// An exclusive flock on PATH (created if need be), held while the object lives: two jobs preparing one data.dir take
// turns, the second then finding the first's shards current. Where PATH cannot be created (a read-only folder of
// shards an evaluation reads) it goes on unlocked, with a warning: nothing can be written there either. While
// another job holds it, the wait polls every 0.1 s: it says what it waits for once a second has gone by, and gives up
// on a stop signal (StoppedBeforeTraining: trainer/preemption.h) or once `abandon` is set (a peer failed).
class FileLock {
 public:
  FileLock(const std::string& path, const std::string& what, const std::atomic<bool>* abandon) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      spdlog::warn("data: cannot create the lock file {} ({}): going on without it", path, std::strerror(errno));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    bool said = false;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      if (e != EWOULDBLOCK && e != EINTR) {
        release();
        DPT_THROW(IoError, "{}: cannot lock: {}", path, std::strerror(e));
      }
      if (const int sig = stop_signal()) {
        release();
        throw StoppedBeforeTraining(sig, fmt::format("{} while waiting {:.1f} s for {} (another job is {})",
                                                     sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM", waited(), path, what));
      }
      if (abandon && abandon->load(std::memory_order_relaxed)) {
        release();
        DPT_THROW(IoError, "{}: the wait for the lock abandoned: another rank failed", path);
      }
      if (!said && waited() >= 1.0) {
        spdlog::info("data: waiting for {}: another job is {} (SIGTERM or SIGUSR1 stops this run)", path, what);
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (said) spdlog::info("data: got {} after {:.1f} s", path, waited());
  }
  ~FileLock() { release(); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  void release() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
    fd_ = -1;
  }
  int fd_ = -1;
};

// Rank 0's part of prepare_data: reuse data.dir, or tokenize into it, holding DIR.lock (beside it) throughout. A
// tokenization stops (an Error, data.dir left as it was) once `abandon` is set (null: never).
void prepare_jsonl(const Config& cfg, bool log, bool records_may_be_gone, const std::atomic<bool>* abandon = nullptr) {
  const DataConfig& d = cfg.data;
  // Before anything: a data.dir that is or holds a record file would be replaced (deleting it) once its shards are
  // stale.
  data::check_output_apart(d.dir, d.jsonl, data::FolderRead::named_files, "data.dir", "data.jsonl");
  const FileLock lock(std::filesystem::path(d.dir).lexically_normal().string() + ".lock",
                      fmt::format("preparing data.dir = {}", d.dir), abandon);
  const std::unique_ptr<data::Tokenizer> tokenizer = jsonl_tokenizer(cfg);
  data::JsonlOptions o;
  o.inputs = d.jsonl;
  o.out_dir = d.dir;
  o.val_every = static_cast<size_t>(d.val_every);
  o.eos_token = d.eos_token;
  o.skip_bad_lines = d.skip_bad_lines;
  if (abandon) o.cancelled = [abandon] { return abandon->load(std::memory_order_relaxed); };
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool ours = fs::is_regular_file(fs::path(d.dir) / data::kJsonlSourceFile, ec);
  std::string why;
  try {
    if (data::jsonl_shards_current(o, *tokenizer, &why)) {
      if (log) spdlog::info("data: {} holds data.jsonl's token shards already ({}): reused", d.dir, data::kJsonlSourceFile);
      return;
    }
  } catch (const Error& e) {  // a record file gone (ConfigError, as a missing --input) or unreadable (IoError)
    if (!ours || !records_may_be_gone) throw;
    // An evaluation whose records are gone (elsewhere, a cleaned-up folder): the shards written from them still serve.
    // (Training never does this: a data.jsonl that names a missing file is an error there.)
    if (log) spdlog::warn("data: {}; reading the token shards {} holds, written from them earlier", e.what(), d.dir);
    return;
  }
  if (!ours && data::non_empty_directory(d.dir))
    DPT_THROW(ConfigError, "data.dir = {} holds files, and no {}: not shards that data.dataset = jsonl wrote; name a new "
              "or empty folder for them (nothing in it was changed)", d.dir, data::kJsonlSourceFile);
  if (ours && log) spdlog::warn("data: tokenizing data.jsonl into {} again: {}", d.dir, why);
  o.force = ours;
  tokenize_jsonl_logged(o, *tokenizer, 10.0, log);
}

}  // namespace

void prepare_data(const Config& cfg, comm::ProcessGroup& pg, bool records_may_be_gone, bool log) {
  if (cfg.data.dataset != DatasetKind::jsonl) return;
  const bool lead = pg.rank() == 0;
  if (pg.size() == 1) {
    prepare_jsonl(cfg, log, records_may_be_gone);
    return;
  }
  std::exception_ptr error;
  std::atomic<bool> done{false}, abandon{false};
  std::atomic<int> stop{0};  // the stop signal rank 0's wait for the lock gave up on
  std::thread worker;
  if (lead)
    worker = std::thread([&] {
      try {
        prepare_jsonl(cfg, log, records_may_be_gone, &abandon);
      } catch (const StoppedBeforeTraining& e) {
        stop = e.signal;
        error = std::current_exception();
      } catch (...) {
        error = std::current_exception();
      }
      done = true;
    });
  // Every rank: [rank 0 finished, rank 0 failed, the stop signal it gave up on], summed, every half second (rank 0
  // checks its worker more often).
  bool failed = false;
  int stopped_by = 0;
  try {
    for (;;) {
      if (lead)
        for (int i = 0; i < 10 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      Tensor flags = Tensor::empty({3}, DType::I64);
      flags.data<int64_t>()[0] = lead && done ? 1 : 0;
      flags.data<int64_t>()[1] = lead && done && error ? 1 : 0;
      flags.data<int64_t>()[2] = lead && done ? stop.load() : 0;
      pg.allreduce(flags, {.op = comm::ReduceOp::Sum, .what = "data preparation (rank 0 tokenizes data.jsonl)"})->wait();
      if (flags.data<int64_t>()[0] > 0) {
        failed = flags.data<int64_t>()[1] > 0;
        stopped_by = static_cast<int>(flags.data<int64_t>()[2]);
        break;
      }
    }
  } catch (...) {
    // A peer failed (or the collective timed out): nobody waits for the shards; the tokenization stops at its next
    // line instead of running to the end before this rank can leave.
    abandon = true;
    if (worker.joinable()) worker.join();
    throw;
  }
  if (worker.joinable()) worker.join();
  if (error) std::rethrow_exception(error);
  if (stopped_by)  // as rank 0: every rank stops as a stopped run does
    throw StoppedBeforeTraining(stopped_by, fmt::format("rank 0 stopped for {} while waiting for the lock on data.dir "
                                                        "= {}", stopped_by == SIGUSR1 ? "SIGUSR1" : "SIGTERM",
                                                        cfg.data.dir));
  if (failed)
    DPT_THROW(ConfigError, "data.dataset = jsonl: rank 0 could not prepare data.dir = {} (its log says why)",
              cfg.data.dir);
}

}  // namespace dpt::trainer
