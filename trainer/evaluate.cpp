// trainer/evaluate.cpp: evaluation over a test set, and of a checkpoint (trainer/evaluate.h).
#include "trainer/evaluate.h"

#include "core/check.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "models/layers.h"
#include "trainer/build_model.h"
#include "trainer/config_check.h"
#include "trainer/datasets.h"
#include "trainer/feeder.h"
#include "trainer/model_registry.h"

static_assert(dpt::data::kLeftOut == dpt::models::kIgnoreLabel, "an example a data set leaves out is a masked target");

namespace dpt::trainer {

EvalResult evaluate(models::Model& model, Task& task, const data::Dataset& test, const TrainConfig& t,
                    size_t workers, comm::ProcessGroup& pg) {
  const Device device = model.device();
  data::LoaderOptions lo{.batch_size = static_cast<size_t>(t.eval_batch_size), .drop_last = false, .prefetch = 2,
                         .pin_memory = device.is_cuda(), .workers = workers};
  const std::vector<size_t> shard = data::eval_shard(test.size(), pg.rank(), pg.size());
  const size_t batches = (shard.size() + lo.batch_size - 1) / lo.batch_size;
  // ZeRO stage 3 gathers the parameters with the other ranks inside every forward: every rank runs as many forwards
  // as the rank with the most batches; a rank with fewer repeats its last batch, uncounted.
  size_t forwards = batches;
  if (model.params_split() && pg.size() > 1) {
    Tensor n = Tensor::empty({1}, DType::I64);
    n.data<int64_t>()[0] = static_cast<int64_t>(batches);
    pg.allreduce(n, {.op = comm::ReduceOp::Max, .what = "eval batches"})->wait();
    forwards = static_cast<size_t>(n.data<int64_t>()[0]);
    if (batches == 0 && forwards > 0)
      DPT_THROW(ConfigError, "the test set's {} examples leave rank {} of {} none to evaluate; with dist.zero = 3 every "
                "rank takes part in every forward: use at least {} test examples", test.size(), pg.rank(), pg.size(),
                pg.size());
  }
  data::Loader loader(test, shard, lo);
  Feeder feeder(device, model.kernels().stream());
  models::SoftmaxCrossEntropy loss;
  Tensor stats = Tensor::zeros({3}, DType::F64, device);  // loss sum, correct, targets: accumulated on the device
  model.set_training(false);  // BatchNorm: running statistics
  struct BackToTraining {
    models::Model& m;
    ~BackToTraining() { m.set_training(true); }
  } back{model};
  while (auto host = loader.next()) {
    const data::Batch& batch = feeder.put(std::move(*host), loader);
    task.prepare(batch);
    loss.accumulate(model.forward(task.input()), task.targets(), model.kernels(), stats, /*backward=*/false);
    feeder.step_done();
  }
  for (size_t i = batches; i < forwards; ++i) model.forward(task.input());  // the collective gathers, in step
  feeder.release(loader);
  Tensor sums = Tensor::empty({3}, DType::F64);
  const Tensor host_stats = stats.to(Device::cpu());
  double* s = sums.data<double>();
  s[0] = host_stats.data<double>()[0];
  s[1] = host_stats.data<double>()[1];
  s[2] = host_stats.data<double>()[2];  // the targets counted (masked tokens are not)
  pg.allreduce(sums, {.op = comm::ReduceOp::Sum, .what = "eval stats"})->wait();
  if (!(s[2] > 0.0))
    DPT_THROW(ConfigError, "{}: no target to evaluate: its loss masks (NAME.mask beside the shards) train no token "
              "of it, or (data.skip_bad_images) none of its images could be decoded", test.name());
  return {s[0] / s[2], s[1] / s[2], s[2]};
}

EvalReport evaluate_checkpoint(const SavedRun& target, comm::ProcessGroup& pg, Device device) {
  const Config& cfg = target.config;
  const LoadedCheckpoint& ck = target.checkpoint;
  prepare_data(cfg, pg, /*records_may_be_gone=*/true);
  Datasets ds = make_datasets(cfg.data, cfg.model, static_cast<uint64_t>(cfg.train.seed), Splits::test);
  check_same_classes(ck.path, ck.state.classes, ds.classes);
  check_same_data(ds, cfg.data, pg);
  const std::vector<int64_t> sample_shape = ds.test->sample_shape();
  auto model = build_model(cfg.model, sample_shape, ds.test->num_classes(), device);
  model->load_state([&](const std::string& name) { return ck.model.find(name); }, ck.path);
  model->set_precision(cfg.train.precision);
  std::unique_ptr<Task> task = make_task(model_card(cfg.model.name).input, cfg.model.block_size, sample_shape, device);
  const EvalResult ev = evaluate(*model, *task, *ds.test, cfg.train, static_cast<size_t>(cfg.data.workers), pg);
  return {ev.loss, ev.acc, ev.rows, task->unit(), model->summary()};
}

}  // namespace dpt::trainer
