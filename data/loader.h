// data/loader.h: batches of one epoch, prepared by a background thread ahead of the training step.
//
// The producer thread fills up to `prefetch` batches into a bounded queue (mutex + two condition
// variables); next() takes them in order. With `workers` > 1, workers - 1 helper threads (created once, with
// the Loader) fill each batch's rows together with the producer, each claiming the next row from an atomic
// counter: images decode in parallel, and row k still holds example k. An exception thrown while producing
// (from Dataset::get, say) is carried over and rethrown by next() once the batches before it have been
// handed out; with several workers, the one of the batch's earliest failing row, as with one. Destroying a
// Loader stops and joins the producer and the helpers wherever they are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"

namespace dpt::data {

struct Batch {
  Tensor features;  // [size, feature_count] F32
  Tensor labels;    // [size] I32
  size_t size = 0;
  size_t index = 0;  // batch number within this epoch
  // The full-capacity buffers `features` and `labels` are views of (a last partial batch is shorter), kept
  // so the Loader can reuse them (Loader::recycle).
  Tensor features_buffer, labels_buffer;
};

struct LoaderOptions {
  size_t batch_size = 64;
  bool drop_last = false;  // drop the final partial batch
  size_t prefetch = 2;     // batches prepared ahead (>= 1)
  // Batches in page-locked host memory, so their copies to the GPU run asynchronously (PyTorch's
  // pin_memory). Pinned allocations are slow: hand batches back with recycle() to reuse them.
  bool pin_memory = false;
  // Threads calling Dataset::get for a batch (>= 1): the producer and workers - 1 helpers. 1: the producer
  // alone. More pay where get() is costly (decoding images), not for in-memory data.
  size_t workers = 1;
};

// The one place batch memory is allocated: `capacity` rows, viewed as `size` rows; pinned when asked.
Batch allocate_batch(size_t size, size_t feature_count, size_t capacity = 0, bool pinned = false);

class Loader {
 public:
  // Iterates `indices` (this rank's order for one epoch) in batches, starting at batch `start_batch`
  // (resume). `dataset` must outlive the Loader. Throws ConfigError for batch_size, prefetch or workers 0
  // or a start_batch past num_batches(), InternalError for an index past the end of the data set.
  Loader(const Dataset& dataset, std::vector<size_t> indices, LoaderOptions opts, size_t start_batch = 0);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  size_t num_batches() const { return num_batches_; }  // total in the epoch, including skipped ones
  // Blocks until the next batch is ready; nullopt at the end; rethrows an exception from the producer.
  std::optional<Batch> next();
  // Total time next() spent blocked waiting for the producer (the data-wait metric). Consumer thread only.
  double wait_seconds() const { return wait_seconds_; }
  // Gives a batch's buffers back for the producer to fill again (the consumer is done with them: for a GPU,
  // its copy to the device has finished). Batches not recycled are simply freed.
  void recycle(Batch&& batch);

  // Each row's thread asks Dataset::prefetch for the example of the row kPrefetchRows x workers on (with several
  // workers, a thread's rows are about `workers` apart): its bytes are in the cache by the time they are read.
  static constexpr size_t kPrefetchRows = 2;

 private:
  void produce();
  bool fill(Batch& batch, size_t batch_index);  // false when stopped half way
  void fill_row(Batch& batch, size_t first, size_t k) const;  // row k from example indices_[first + k]
  void fill_rows();    // claims and fills rows of job_ until none is left (or stop, or a failure)
  void helper_loop();  // a helper thread: fill_rows() for every new job_

  // The batch being filled by several workers. The producer sets it up under job_mu_ and bumps
  // `generation`; helpers see the new generation, fill rows, and report `helpers_done`.
  struct Job {
    Batch* batch = nullptr;
    size_t first = 0;                // position in indices_ of row 0
    std::atomic<size_t> next{0};      // the next row to claim
    std::atomic<bool> failed{false};  // a row threw: claim no more (earlier rows are all claimed already)
    uint64_t generation = 0;
    size_t helpers_done = 0;
    size_t error_row = 0;  // the earliest failing row, when error is set
    std::exception_ptr error;
  };

  const Dataset& dataset_;
  std::vector<size_t> indices_;
  LoaderOptions opts_;
  // Rows of each batch buffer: opts_.batch_size, or the examples there are when fewer (a batch size past the data
  // set's, train.eval_batch_size = 1000 over 64 test examples, allocates no rows that can never be filled).
  size_t capacity_ = 0;
  size_t num_batches_ = 0;
  size_t start_batch_ = 0;
  int device_ = -1;  // pin_memory on a GPU: the CUDA device the producer thread allocates for

  std::mutex mu_;
  std::condition_variable ready_;  // a batch was queued, or the producer finished
  std::condition_variable space_;  // a batch was taken, or stop was asked
  std::deque<Batch> queue_;
  std::vector<Batch> free_;  // recycled buffers, reused by the producer
  bool producer_done_ = false;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  double wait_seconds_ = 0.0;

  std::mutex job_mu_;
  std::condition_variable job_ready_;  // a new job, or helpers_exit_
  std::condition_variable job_done_;   // a helper finished its part of the job
  Job job_;
  bool helpers_exit_ = false;
  std::vector<std::thread> helpers_;  // workers - 1 of them

  std::thread producer_;  // last: started once everything above exists
};

}  // namespace dpt::data
