// trainer/parallel/comm_thread.cpp: the communication thread's queue.
#include "trainer/parallel/comm_thread.h"

#include "core/cuda.h"

namespace dpt::trainer {

CommThread::CommThread(int cuda_device) : thread_([this, cuda_device] { loop(cuda_device); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommThread::submit(std::function<void()> job) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    ticket = ++submitted_;
  }
  cv_.notify_all();
  return ticket;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket || error_ != nullptr; });
  // Jobs run in order: with an error pending, every ticket before the failed one has run.
  if (error_ && ticket >= failed_from_) std::rethrow_exception(error_);
}

void CommThread::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == submitted_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CommThread::loop(int cuda_device) {
  std::exception_ptr setup_error;
  try {
    if (cuda_device >= 0) cuda::set_device(cuda_device);
  } catch (...) {
    setup_error = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (setup_error) {
    error_ = setup_error;
    failed_from_ = 1;
  }
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    const uint64_t ticket = done_ + 1;
    const bool skip = error_ != nullptr;  // after a failure nothing more is sent
    lock.unlock();
    std::exception_ptr err;
    if (!skip) {
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
    }
    job = nullptr;
    lock.lock();
    if (err && !error_) {
      error_ = err;
      failed_from_ = ticket;
    }
    done_ = ticket;
    cv_.notify_all();
  }
}

}  // namespace dpt::trainer
