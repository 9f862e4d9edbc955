// Unit tests for trainer/preemption.h: the first SIGUSR1 or SIGTERM is recorded, later ones do not replace it.
#include <catch2/catch.hpp>

#include <csignal>

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
