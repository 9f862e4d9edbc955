// tests/unit/trainer/test_step_graph.cpp: train.cuda_graph on the CPU: the config's refusals, the run's
// (cuda_graph_refusal: the device, the world size, the accumulation), and StepGraphPlan's decisions of when a step runs
// eagerly, is captured, or launches the graph (the graph itself: unit_gpu [cuda_graph][trainer], gpu-check's
// train_cuda_gpt_graph).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/check.h"
#include "trainer/config.h"
#include "trainer/step_graph.h"

using namespace dpt;
using namespace dpt::trainer;
using Action = StepGraphPlan::Action;

namespace {

std::vector<std::string> fast_gpt(std::vector<std::string> more = {}) {
  std::vector<std::string> o{"model.name=gpt", "data.dataset=tokens", "train.precision=bf16",
                             "train.bf16_activations=true"};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

}  // namespace

TEST_CASE("train.cuda_graph: off by default, and the config refuses what a graph cannot replay",
          "[trainer][cuda_graph]") {
  CHECK(!load_config("", {}).train.cuda_graph);
  CHECK(load_config("", fast_gpt({"train.cuda_graph=true"})).train.cuda_graph);
  CHECK(load_config("", fast_gpt({"train.cuda_graph=true", "model.name=llama"})).train.cuda_graph);
  REQUIRE_THROWS_AS(load_config("", {"train.cuda_graph=true"}), ConfigError);
  REQUIRE_THROWS_WITH(load_config("", {"model.name=gpt", "data.dataset=tokens", "train.cuda_graph=true"}),
                      Catch::Contains("train.cuda_graph = true needs train.bf16_activations = true"));
  REQUIRE_THROWS_WITH(load_config("", fast_gpt({"train.cuda_graph=true", "dist.zero=1"})),
                      Catch::Contains("train.cuda_graph = true with dist.zero = 1: ZeRO's buckets"));
  REQUIRE_THROWS_WITH(load_config("", fast_gpt({"train.cuda_graph=true", "train.accum_steps=2"})),
                      Catch::Contains("train.cuda_graph = true with train.accum_steps = 2"));
}

TEST_CASE("train.cuda_graph applies to one rank's GPU step of one micro-batch only", "[trainer][cuda_graph]") {
  CHECK(cuda_graph_refusal(Device::cuda(0), 1, 1).empty());
  CHECK_THAT(cuda_graph_refusal(Device::cpu(), 1, 1), Catch::Contains("this run trains on cpu"));
  CHECK_THAT(cuda_graph_refusal(Device::cuda(0), 2, 1), Catch::Contains("2 ranks: the gradient buckets' collectives"));
  CHECK_THAT(cuda_graph_refusal(Device::cuda(0), 1, 4), Catch::Contains("4 micro-batches a step"));
}

TEST_CASE("the step graph is captured after an eager step of the same shape and choice, and dropped when they change",
          "[trainer][cuda_graph]") {
  StepGraphPlan p;
  // The run's first step rounds the parameters (no update yet); the second reads the update's copy: both eager.
  CHECK(p.next(64, false) == Action::eager);
  CHECK(p.next(64, true) == Action::eager);
  CHECK(!p.has_graph());
  CHECK(p.next(64, true) == Action::capture);
  CHECK(p.has_graph());
  CHECK(p.next(64, true) == Action::launch);
  CHECK(p.next(64, true) == Action::launch);
  // A short last batch: eagerly, the graph dropped; the full batch after it primes again before a capture.
  CHECK(p.next(32, true) == Action::eager);
  CHECK(!p.has_graph());
  CHECK(p.next(64, true) == Action::eager);
  CHECK(p.next(64, true) == Action::capture);
  // Something wrote the parameters (the copy dropped): that forward rounds, which the graph does not.
  CHECK(p.next(64, false) == Action::eager);
  CHECK(p.next(64, true) == Action::eager);
  CHECK(p.next(64, true) == Action::capture);
  // An epoch's start, an evaluation, a checkpoint, train.autotune: captured again after one eager step.
  p.invalidate();
  CHECK(!p.has_graph());
  CHECK(p.next(64, true) == Action::eager);
  CHECK(p.next(64, true) == Action::capture);
  CHECK(p.next(64, true) == Action::launch);
  // A step that must run eagerly (a fault injected between its loss and backward) drops the graph and primes.
  CHECK(p.next(64, true, /*eager_only=*/true) == Action::eager);
  CHECK(!p.has_graph());
  CHECK(p.next(64, true) == Action::capture);
  // Invalidated before any step: never a capture without an eager step first.
  StepGraphPlan q;
  q.invalidate();
  CHECK(q.next(8, false) == Action::eager);
  CHECK(q.next(8, false) == Action::capture);  // SGD: every forward rounds, and so does the graph's
  CHECK(q.next(8, false) == Action::launch);
}
