// trainer/parallel/comm_thread.h: the one thread on which a strategy runs its collectives over a host group (Gloo,
// MPI), so that they overlap the compute on the main thread. Jobs run one at a time, in the order submitted: every
// rank submits the same jobs in the same order, so every rank issues the same collectives in the same order (two
// threads may not interleave collectives on one group). An asynchronous group (NCCL) needs no thread: its collectives
// are enqueued on the group's stream.
//
// After a job throws, the jobs after it are skipped (their collectives are never issued: the step is lost), and the
// first error is rethrown to the main thread by wait() or wait_all().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dpt::trainer {

class CommThread {
 public:
  // `cuda_device` >= 0: the thread makes that device current first (it stages GPU buffers); -1: none.
  explicit CommThread(int cuda_device = -1);
  // Stops the thread after the job it is running; jobs not yet started are dropped.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `job` and returns its ticket (1, 2, ... in submission order).
  uint64_t submit(std::function<void()> job);
  // Returns once job `ticket` has run. Rethrows the first error if that job failed or was skipped after a failure
  // (the error stays, for wait_all()).
  void wait(uint64_t ticket);
  // Returns once every submitted job has run or been skipped. Rethrows the first error and forgets it: later jobs
  // run again (the group itself may stay broken: the caller decides).
  void wait_all();

 private:
  void loop(int cuda_device);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // submitted, not yet taken
  uint64_t submitted_ = 0, done_ = 0;        // jobs finished (run or skipped), in order
  std::exception_ptr error_;                 // the first failure not yet taken by wait_all()
  uint64_t failed_from_ = 0;                 // the ticket of that failure: it and the jobs after it did not run
  bool stop_ = false;
  std::thread thread_;                       // last: started once the members above exist
};

}  // namespace dpt::trainer
