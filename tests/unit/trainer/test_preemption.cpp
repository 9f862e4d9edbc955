// Unit tests for trainer/preemption.h: the first SIGUSR1 or SIGTERM is recorded, later ones do not replace it; one
// held since start-up is recorded by install_stop_handlers; RendezvousStopWatch acts on it until disarmed.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <pthread.h>

#include "trainer/preemption.h"

using namespace dpt::trainer;

namespace {
// Restores SIGUSR1's and SIGTERM's handlers when the test ends (the test process keeps its defaults).
struct SavedHandlers {
  struct sigaction usr1 {}, term {};
  SavedHandlers() {
    sigaction(SIGUSR1, nullptr, &usr1);
    sigaction(SIGTERM, nullptr, &term);
  }
  ~SavedHandlers() {
    sigaction(SIGUSR1, &usr1, nullptr);
    sigaction(SIGTERM, &term, nullptr);
    set_stop_signal(0);
  }
};
}  // namespace

TEST_CASE("the first stop signal is kept and the process lives on", "[preemption]") {
  SavedHandlers saved;
  set_stop_signal(0);
  install_stop_handlers();
  install_stop_handlers();  // idempotent
  CHECK(stop_signal() == 0);
  CHECK(seconds_since_stop_signal() == 0.0);
  REQUIRE(std::raise(SIGUSR1) == 0);  // delivered before raise returns (same thread)
  CHECK(stop_signal() == SIGUSR1);
  REQUIRE(std::raise(SIGTERM) == 0);  // a second signal (during the checkpoint): ignored
  CHECK(stop_signal() == SIGUSR1);
  CHECK(seconds_since_stop_signal() >= 0.0);
  CHECK(seconds_since_stop_signal() < 60.0);
  set_stop_signal(0);
  REQUIRE(std::raise(SIGTERM) == 0);
  CHECK(stop_signal() == SIGTERM);
  CHECK(kExitPreempted == 75);
}

TEST_CASE("a stop signal held since start-up is recorded when the handlers are installed", "[preemption]") {
  SavedHandlers saved;
  set_stop_signal(0);
  hold_stop_signals();  // as main() does before its libraries' initializers
  REQUIRE(std::raise(SIGTERM) == 0);  // held: neither fatal nor recorded yet
  CHECK(stop_signal() == 0);
  install_stop_handlers();  // the handler first, then the release: the pending SIGTERM is recorded
  CHECK(stop_signal() == SIGTERM);
  sigset_t now;
  REQUIRE(pthread_sigmask(SIG_BLOCK, nullptr, &now) == 0);
  CHECK_FALSE(sigismember(&now, SIGUSR1));
  CHECK_FALSE(sigismember(&now, SIGTERM));
  hold_stop_signals();
  release_stop_signals();
  REQUIRE(pthread_sigmask(SIG_BLOCK, nullptr, &now) == 0);
  CHECK_FALSE(sigismember(&now, SIGTERM));
}

TEST_CASE("RendezvousStopWatch calls on_stop soon after a stop signal, and never once disarmed", "[preemption]") {
  set_stop_signal(0);
  std::atomic<int> got{0};
  {
    RendezvousStopWatch watch([&](int sig) { got = sig; });  // dptrain's ends the process; this one returns
    std::this_thread::sleep_for(3 * RendezvousStopWatch::kPoll);
    CHECK(got == 0);
    const auto t0 = std::chrono::steady_clock::now();
    set_stop_signal(SIGUSR1);  // as the handler does
    while (got == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(got == SIGUSR1);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  }
  set_stop_signal(0);
  got = 0;
  {
    RendezvousStopWatch watch([&](int sig) { got = sig; });
    watch.disarm();  // the rendezvous is over: a later signal is the training's
    set_stop_signal(SIGTERM);
    std::this_thread::sleep_for(3 * RendezvousStopWatch::kPoll);
    CHECK(got == 0);
  }
  set_stop_signal(0);
}
