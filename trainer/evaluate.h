// trainer/evaluate.h: loss and accuracy over a whole test set on every rank of a group, each rank its exact
// share (the same numbers on any number of ranks): after each training epoch, and for `dptrain eval`.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/dataset.h"
#include "models/model.h"
#include "trainer/config.h"
#include "trainer/saved_run.h"
#include "trainer/task.h"

namespace dpt::trainer {

struct EvalResult {
  double loss = 0, acc = 0;
  double rows = 0;  // examples or tokens evaluated, over all ranks
};

// `model` in eval mode (BatchNorm: running statistics) over `test` in batches of t.eval_batch_size, `workers`
// loader threads; the sums all-reduced. Collective: every rank of `pg` calls it.
EvalResult evaluate(models::Model& model, Task& task, const data::Dataset& test, const TrainConfig& t,
                    size_t workers, comm::ProcessGroup& pg);

struct EvalReport {
  double loss = 0, acc = 0;  // mean loss and accuracy over every test example (image) or token
  double rows = 0;           // how many: each test example or window counted once across the ranks
  std::string unit;          // "samples" | "tokens"
  std::string model;         // the model's summary
};
// Evaluates the checkpoint's model on its config's test split (val shards for a GPT) on every rank of `pg`,
// each rank its exact share, the sums reduced: the same numbers on any number of ranks. Reads nothing of the
// training split (make_datasets' Splits::test: an image folder's train/ may be absent).
EvalReport evaluate_checkpoint(const SavedRun& target, comm::ProcessGroup& pg, Device device);

}  // namespace dpt::trainer
