// tests/unit/trainer/test_loss_scaler.cpp: LossScaler against torch.cuda.amp.GradScaler's rule.
#include <catch2/catch.hpp>

#include "trainer/loss_scaler.h"

using namespace dpt::trainer;

TEST_CASE("loss scaler: 65536 at first, halve and skip on an overflow, double after 2000 clean steps", "[amp]") {
  LossScaler s(true);
  REQUIRE(s.scale() == 65536.0);
  REQUIRE_FALSE(s.update(true));  // skipped
  REQUIRE(s.scale() == 32768.0);
  REQUIRE(s.skipped() == 1);
  for (int i = 0; i < 1999; ++i) REQUIRE(s.update(false));
  REQUIRE(s.scale() == 32768.0);
  REQUIRE(s.growth_tracker() == 1999);
  REQUIRE(s.update(false));  // the 2000th clean step in a row
  REQUIRE(s.scale() == 65536.0);
  REQUIRE(s.growth_tracker() == 0);
  // An overflow resets the clean-step count.
  for (int i = 0; i < 1500; ++i) s.update(false);
  REQUIRE_FALSE(s.update(true));
  REQUIRE(s.growth_tracker() == 0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  REQUIRE(s.scale() == 32768.0);
  REQUIRE(s.skipped() == 2);
}

TEST_CASE("loss scaler: disabled is scale 1 and never skips, and restore takes checkpointed state", "[amp]") {
  LossScaler off(false);
  REQUIRE(off.scale() == 1.0);
  REQUIRE(off.update(true));
  REQUIRE(off.skipped() == 0);
  LossScaler s(true, {.init_scale = 8.0, .growth_interval = 3});
  s.restore(1024.0, 2, 5);
  REQUIRE(s.scale() == 1024.0);
  REQUIRE(s.update(false));
  REQUIRE(s.scale() == 2048.0);
  REQUIRE(s.skipped() == 5);
  REQUIRE_THROWS(s.restore(-1.0, 0, 0));
}
