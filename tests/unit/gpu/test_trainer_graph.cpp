// tests/unit/gpu/test_trainer_graph.cpp: train.cuda_graph through dptrain's training loop (trainer::train on one rank
// of a Gloo group sharing the GPU): the same run with and without the step graph gives the same epoch losses, the
// same validation loss and the same checkpoint bytes (parameters and AdamW's state), bit for bit, while the graph run
// did launch graphs, captured again after each thing that drops one (an epoch's start, a checkpoint, a short last
// batch run eagerly). Ran, and passed, on an H200 on 2026-11-29.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/token_shards.h"
#include "gloo_threads.h"
#include "gpu_testing.h"
#include "tests/support/temp_dir.h"
#include "trainer/config.h"
#include "trainer/trainer.h"

using namespace dpt;
using namespace dpt::gpu_test;

namespace {

// Random byte tokens: `windows` training windows of 33 tokens' worth (block size 32), and 16 validation windows.
void write_shards(const std::string& dir, int64_t windows) {
  std::mt19937 rng(5);
  const auto tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& v : t) v = static_cast<int32_t>(rng() % 256);
    return t;
  };
  data::write_token_shard(dir + "/bytes_train_000000.bin", tokens(windows * 32 + 1));
  data::write_token_shard(dir + "/bytes_val_000000.bin", tokens(16 * 32 + 1));
}

struct Trained {
  trainer::RunResult result;
  std::string model, optimizer;  // the last checkpoint's files' bytes
};

// 2 epochs of 42 windows at batch 4: 10 full steps and a short one each, a checkpoint every 7 steps, AdamW with
// clipping and a warm-up (the learning rate changes every step: the graph's update reads it, and the step count for
// the bias corrections, from the block staged before each launch).
Trained train_run(const std::string& data_dir, const std::string& ckpt_dir, bool graph) {
  const trainer::Config cfg = trainer::load_config(
      "", {"model.name=gpt", "model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.block_size=32",
           "model.vocab_size=256", "data.dataset=tokens", "data.dir=" + data_dir, "data.test_limit=16",
           "train.device=cuda", "train.precision=bf16", "train.bf16_activations=true", "train.epochs=2",
           "train.batch_size=4", "train.optimizer=adamw", "train.lr=1e-3", "train.warmup_steps=5",
           "train.clip_grad_norm=1.0", "train.weight_decay=0.1", "train.progress_interval_s=1000",
           "checkpoint.every_steps=7", "checkpoint.dir=" + ckpt_dir,
           std::string("train.cuda_graph=") + (graph ? "true" : "false")});
  Trained t;
  run_gloo_ranks_on_gpu(1, [&](int, comm::ProcessGroup& pg) {
    trainer::RunOptions opts;
    opts.resume = "never";
    opts.device = gpu();
    t.result = trainer::train(cfg, opts, pg);
  });
  REQUIRE(!t.result.last_checkpoint.empty());
  t.model = test::read_file(t.result.last_checkpoint + "/model.safetensors");
  t.optimizer = test::read_file(t.result.last_checkpoint + "/optimizer.safetensors");
  return t;
}

}  // namespace

TEST_CASE("dptrain's GPT fast path with train.cuda_graph gives the eager run's losses and checkpoint bit for bit",
          "[gpu][trainer][cuda_graph]") {
  test::TempDir dir("cuda-graph-train");
  write_shards(dir.path.string(), 42);
  const Trained eager = train_run(dir.path.string(), (dir.path / "eager").string(), false);
  const Trained graph = train_run(dir.path.string(), (dir.path / "graph").string(), true);
  std::printf("cuda_graph trainer: %lld steps, %lld launched from %lld graph(s)\n",
              static_cast<long long>(graph.result.steps), static_cast<long long>(graph.result.cuda_graph_launches),
              static_cast<long long>(graph.result.cuda_graph_captures));
  std::fflush(stdout);
  CHECK(eager.result.cuda_graph_launches == 0);
  REQUIRE(graph.result.steps == 22);
  REQUIRE(eager.result.steps == 22);
  // Per epoch: eager at its first step and the one after (the copy's first read), after each checkpoint and at its
  // short last batch; the others from a graph. Epoch 1: 1, 2 eager, 3 captured, 4-7, checkpoint, 8 eager, 9
  // captured, 10, 11 (short) eager; epoch 2 (12-22): 12 eager, 13 captured, 14, checkpoint, 15 eager, 16 captured,
  // 17-21, checkpoint, 22 (short) eager.
  CHECK(graph.result.cuda_graph_captures == 4);
  CHECK(graph.result.cuda_graph_launches == 15);
  REQUIRE(graph.result.epochs.size() == eager.result.epochs.size());
  for (size_t e = 0; e < eager.result.epochs.size(); ++e) {
    CAPTURE(e);
    CHECK(std::isfinite(eager.result.epochs[e].train_loss));
    CHECK(graph.result.epochs[e].train_loss == eager.result.epochs[e].train_loss);
    CHECK(graph.result.epochs[e].test_loss == eager.result.epochs[e].test_loss);
  }
  CHECK(graph.result.last_checkpoint_step == eager.result.last_checkpoint_step);
  CHECK(graph.model.size() == eager.model.size());
  CHECK((graph.model == eager.model));  // the parameters' bytes (and their names, shapes, offsets)
  CHECK((graph.optimizer == eager.optimizer));  // AdamW's moments, and its step count
}
