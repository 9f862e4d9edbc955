// trainer/preemption.cpp: the stop-signal handler: one lock-free atomic and a clock_gettime, both
// async-signal-safe.
#include "trainer/preemption.h"

#include <atomic>
#include <csignal>
#include <ctime>

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

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or write in progress carries on
  for (int sig : {SIGUSR1, SIGTERM}) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return g_signal.load(); }

double seconds_since_stop_signal() {
  return g_signal.load() ? static_cast<double>(monotonic_ns() - g_when_ns.load()) * 1e-9 : 0.0;
}

void set_stop_signal(int sig) {
  g_signal.store(sig);
  g_when_ns.store(sig ? monotonic_ns() : 0);
}

}  // namespace dpt::trainer
