// tests/unit/trainer/test_run_report.cpp: the progress line's durations and ETA, the straggler rule, the
// per-rank gather (1 rank here; the integration tests run it on 2) and the out-of-memory advice.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "trainer/report/run_report.h"

using namespace dpt::trainer;

TEST_CASE("format_duration", "[trainer][report]") {
  REQUIRE(format_duration(0) == "0s");
  REQUIRE(format_duration(44.6) == "45s");
  REQUIRE(format_duration(185) == "3m05s");
  REQUIRE(format_duration(2 * 3600 + 4 * 60 + 10) == "2h04m");
  REQUIRE(format_duration(3 * 86400 + 2 * 3600 + 59) == "3d02h");
  REQUIRE(format_duration(-1) == "?");
  REQUIRE(format_duration(std::numeric_limits<double>::infinity()) == "?");
}

TEST_CASE("estimate_eta extrapolates this epoch's pace", "[trainer][report]") {
  // 100 batches in 10 s: 0.1 s each. 50 left in the epoch, 250 in the run, 3 evaluations of 2 s to come.
  const Eta eta = estimate_eta(100, 10.0, 50, 250, 3, 2.0);
  REQUIRE(eta.epoch_s == Approx(5.0));
  REQUIRE(eta.run_s == Approx(25.0 + 6.0));
  const Eta none = estimate_eta(0, 0.0, 50, 250, 3, 2.0);  // nothing done yet: unknown
  REQUIRE(none.epoch_s < 0);
  REQUIRE(none.run_s < 0);
  REQUIRE(estimate_eta(10, 1.0, 0, 0, 0, 2.0).run_s == Approx(0.0));  // the last batch
}

TEST_CASE("work_left: what train.max_steps leaves of the epoch, the run and its evaluations", "[trainer][report]") {
  // 10 epochs of 32 batches, no accumulation, 10 steps done: without max_steps the whole of it.
  WorkLeft w = work_left(10, 0, 10, 10, 32, 32, 1, 0);
  REQUIRE(w.epoch_batches == 22);
  REQUIRE(w.run_batches == 22 + 9 * 32);
  REQUIRE(w.evaluations == 10);
  // max_steps = 100: epochs end at steps 32, 64 and 96, the stop at 100 evaluates once more: 4, not 10.
  w = work_left(10, 0, 10, 10, 32, 32, 1, 100);
  REQUIRE(w.run_batches == 90);
  REQUIRE(w.epoch_batches == 22);
  REQUIRE(w.evaluations == 4);
  // max_steps inside this epoch: the epoch ends there too (not at its last batch), after one evaluation. 1134
  // batches, 2 a step, 20 steps done of max_steps = 30: 20 batches left, in the epoch as in the run.
  w = work_left(20, 0, 5, 40, 1134, 1134, 2, 30);
  REQUIRE(w.run_batches == 20);
  REQUIRE(w.epoch_batches == 20);
  REQUIRE(w.evaluations == 1);
  // Exactly at an epoch's end: that epoch's evaluation is the last one.
  w = work_left(0, 0, 10, 0, 32, 32, 1, 32);
  REQUIRE(w.evaluations == 1);
  // The last epoch, max_steps beyond the run: the epochs decide.
  w = work_left(300, 9, 10, 12, 32, 32, 1, 1000);
  REQUIRE(w.epoch_batches == 20);
  REQUIRE(w.run_batches == 20);
  REQUIRE(w.evaluations == 1);
  // train.epochs = 2^63 - 1: the run's batches saturate (they once wrapped negative, an ETA of nothing left), and
  // train.max_steps = 3 leaves its 3 batches.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  w = work_left(0, 0, huge, 0, 4, 4, 1, 0);
  REQUIRE(w.run_batches == huge);
  w = work_left(0, 0, huge, 0, 4, 4, 1, 3);
  REQUIRE(w.run_batches == 3);
  REQUIRE(w.epoch_batches == 3);
  w = work_left(0, 0, 2, 0, 4, 4, 2, huge);  // max_steps x accumulation past int64: the epochs decide
  REQUIRE(w.run_batches == 8);
}

TEST_CASE("find_straggler names the slowest rank past 10% over the others' median", "[trainer][report]") {
  auto rank = [](double compute, double wait, int64_t steps) {
    return RankTiming{.compute_s = compute, .data_wait_s = wait, .comm_s = 0, .steps = steps};
  };
  REQUIRE_FALSE(find_straggler({rank(10, 0, 100)}));  // one rank: nobody to lag behind
  REQUIRE_FALSE(find_straggler({rank(10.0, 0, 100), rank(10.9, 0, 100)}));  // 9%: within the noise
  const auto s = find_straggler({rank(10, 0, 100), rank(10, 5, 100), rank(9, 1, 100), rank(11, 0, 100)});
  REQUIRE(s);
  REQUIRE(s->rank == 1);  // its data wait makes it slow: 0.15 s per step against a median of 0.1
  REQUIRE(s->others_median_s == Approx(0.1));
  REQUIRE(s->lag == Approx(0.5));
  REQUIRE(s->lost_s == Approx(5.0));
  // 50% slower, but only 0.25 s lost over the epoch (millisecond steps on a busy machine): not worth a warning.
  REQUIRE_FALSE(find_straggler({rank(0.5, 0, 500), rank(0.75, 0, 500)}));
  REQUIRE(find_straggler({rank(0.5, 0, 500), rank(0.75, 0, 500)}, 0.10, 0.2));
  // Step time is per step: a rank that did fewer steps (a resumed epoch) is not slower for it.
  REQUIRE_FALSE(find_straggler({rank(20.0, 0, 200), rank(10.0, 0, 100)}));
  REQUIRE(rank(3.0, 1.0, 8).step_time_s() == Approx(0.5));
}

TEST_CASE("straggler_warning names the collective the other ranks waited in", "[trainer][report]") {
  const RankTiming slow{.compute_s = 4.0, .data_wait_s = 1.0, .comm_s = 0, .steps = 100};
  const Straggler s{.rank = 1, .lag = 0.5, .others_median_s = 0.1, .lost_s = 2.5};
  const std::string ddp = straggler_warning(s, slow, 0);
  REQUIRE_THAT(ddp, Catch::Matchers::Contains("straggler: rank 1 took 50.0 ms per step (compute 40.0 ms, data wait "
                                              "10.0 ms), 50% more than the other ranks' median 100.0 ms; they waited "
                                              "2.5 s for it in the gradient all-reduce this epoch"));
  // ZeRO reduce-scatters the gradients and all-gathers the parameters: no all-reduce carries them.
  for (int64_t zero : {1, 2, 3}) {
    const std::string z = straggler_warning(s, slow, zero);
    REQUIRE_THAT(z, Catch::Matchers::Contains("reduce-scatter") && Catch::Matchers::Contains("all-gather"));
    REQUIRE_THAT(z, !Catch::Matchers::Contains("all-reduce"));
  }
}

TEST_CASE("out_of_memory_advice names the phase, the sizes and what to lower", "[trainer][report]") {
  MemoryFigures m{.params = 4 << 20, .grads = 4 << 20, .optimizer = 8 << 20, .activations = -1};
  std::string s = out_of_memory_advice("in the first training step (batch 256 per rank)", m, 256, 512, 1, dpt::models::Precision::F32);
  REQUIRE_THAT(s, Catch::Contains("while in the first training step"));
  REQUIRE_THAT(s, Catch::Contains("parameters 4.00 MiB, gradients 4.00 MiB, optimizer state 8.00 MiB"));
  REQUIRE_THAT(s, Catch::Contains("activations not measured yet"));
  REQUIRE_THAT(s, Catch::Contains("lower train.batch_size (now 256; raise train.accum_steps, now 1"));
  REQUIRE_THAT(s, Catch::Contains("train.precision = bf16"));
  REQUIRE_THAT(s, !Catch::Contains("eval_batch_size"));
  m.activations = 3 << 20;
  m.device_used = 70LL << 30;
  m.device_total = 80LL << 30;
  s = out_of_memory_advice("evaluating after epoch 2 (train.eval_batch_size 512)", m, 256, 512, 2, dpt::models::Precision::BF16);
  REQUIRE_THAT(s, Catch::Contains("activations 3.00 MiB"));
  REQUIRE_THAT(s, Catch::Contains("the device holds 70.0 GiB of 80.0 GiB"));
  REQUIRE_THAT(s, Catch::Contains("train.eval_batch_size (now 512)"));
  REQUIRE_THAT(s, !Catch::Contains("precision"));
  REQUIRE_THAT(s, !Catch::Contains("dist.zero"));  // one rank: nothing to shard over
  s = out_of_memory_advice("in the first training step (batch 8 per rank)", m, 8, 8, 1, dpt::models::Precision::F32, 2, 0);
  REQUIRE_THAT(s, Catch::Contains("shard the model's state over the 2 ranks with dist.zero = 3 (now 0;"));
  s = out_of_memory_advice("in the first training step (batch 8 per rank)", m, 8, 8, 1, dpt::models::Precision::F32, 2, 3);
  REQUIRE_THAT(s, !Catch::Contains("dist.zero"));  // sharded all it can
  // train.global_batch_size 64 on 2 ranks with train.batch_size 16: micro-batches of 16, 2 a step; accum_steps is
  // derived, so the advice is the largest micro-batch alone.
  s = out_of_memory_advice("in the first training step (batch 16 per rank)", m, 16, 8, 2, dpt::models::Precision::F32, 2,
                           3, 64, 16);
  REQUIRE_THAT(s, Catch::Contains("lower train.batch_size, the largest micro-batch (now 16: micro-batches of 16, 2 per "
                                  "step; train.global_batch_size 64 stays, in more of them)"));
  REQUIRE_THAT(s, !Catch::Contains("raise train.accum_steps"));
}
