// trainer/preemption.cpp: the stop-signal handler: one lock-free atomic and a clock_gettime, both
// async-signal-safe.
#include "trainer/preemption.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <ctime>
#include <utility>

#include <pthread.h>

#include "core/tensor.h"

namespace dpt::trainer {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_when_ns{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) g_when_ns.store(monotonic_ns());
}

}  // namespace

namespace {
sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void hold_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void release_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or write in progress carries on
  for (int sig : {SIGUSR1, SIGTERM}) sigaction(sig, &sa, nullptr);
  release_stop_signals();  // after the handler: one held since main() began is recorded, not fatal
}

RendezvousStopWatch::RendezvousStopWatch(std::function<void(int)> on_stop) : on_stop_(std::move(on_stop)) {
  // A signal that came during the start-up (held until install_stop_handlers), at once: a rendezvous over before the
  // thread's first look (one process) would leave it to training's first step otherwise.
  if (const int sig = stop_signal()) on_stop_(sig);
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (armed_) {
      if (const int sig = stop_signal()) {
        lock.unlock();
        on_stop_(sig);  // ends the process
        return;
      }
      cv_.wait_for(lock, kPoll);
    }
  });
}

RendezvousStopWatch::~RendezvousStopWatch() { disarm(); }

void RendezvousStopWatch::disarm() {
  {
    std::lock_guard lock(mu_);
    armed_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int stop_signal() { return g_signal.load(); }

double seconds_since_stop_signal() {
  return g_signal.load() ? static_cast<double>(monotonic_ns() - g_when_ns.load()) * 1e-9 : 0.0;
}

void set_stop_signal(int sig) {
  g_signal.store(sig);
  g_when_ns.store(sig ? monotonic_ns() : 0);
}

StopAgreement::StopAgreement(comm::ProcessGroup& pg, int64_t step) : pg_(pg), next_(step + 1), last_step_(step) {}

int StopAgreement::poll(int64_t step) {
  if (pg_.size() == 1) return stop_signal();
  if (step < next_) return 0;
  const double since_last = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_t_).count();
  const double per_step = since_last / static_cast<double>(std::max<int64_t>(1, step - last_step_));
  const int64_t propose = per_step > 0 ? std::clamp<int64_t>(static_cast<int64_t>(kInterval / per_step), 1, 1000) : 1;
  Tensor t = Tensor::empty({2}, DType::I64);
  t.data<int64_t>()[0] = stop_signal();
  t.data<int64_t>()[1] = -propose;
  pg_.allreduce(t, {.op = comm::ReduceOp::Max, .what = "stop signal"})->wait();
  next_ = step - t.data<int64_t>()[1];
  last_step_ = step;
  last_t_ = std::chrono::steady_clock::now();
  return static_cast<int>(t.data<int64_t>()[0]);
}

}  // namespace dpt::trainer
