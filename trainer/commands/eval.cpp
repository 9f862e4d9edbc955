// trainer/commands/eval.cpp: `dptrain eval --checkpoint PATH`: a checkpoint's loss and accuracy on its test split,
// on every rank of the job, each its exact share (trainer/evaluate.h): the same numbers on any number of ranks.
#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "trainer/commands/commands.h"
#include "trainer/commands/job.h"
#include "trainer/evaluate.h"

namespace dpt::trainer::commands {
namespace {

struct EvalArgs {
  std::string checkpoint;
  std::vector<std::string> overrides;
  std::shared_ptr<const bool> print_config;
};

int eval_job(const EvalArgs& a) {
  std::optional<SavedRun> target;  // the checkpoint, and its config
  return run_job({
      .name = "dptrain eval",
      .print_config = *a.print_config,
      .overrides = a.overrides,
      .load_config =
          [&](std::string& origin) {
            target = load_saved_run(a.checkpoint, a.overrides);
            origin = target->checkpoint.path + "'s";
            return target->config;
          },
      .work =
          [&](Job& job) {
            const EvalReport r = evaluate_checkpoint(*target, *job.pg, job.device);
            if (job.env.rank == 0)
              spdlog::info("eval: {} (step {}, {}): loss {:.4f}{} accuracy {:.4f} over {:.0f} {} ({}) on {} rank(s)",
                           target->checkpoint.path, target->checkpoint.state.step, r.model, r.loss,
                           r.unit == "tokens" ? fmt::format(" perplexity {:.3f}", std::exp(r.loss)) : "", r.acc,
                           r.rows, r.unit, token_data(job.config.data.dataset) ? "the val shards" : "the test split",
                           job.env.world_size);
            return 0;
          },
  });
}

}  // namespace

Command add_eval(CLI::App& root, std::shared_ptr<bool> print_config) {
  auto a = std::make_shared<EvalArgs>();
  a->print_config = print_config;
  CLI::App* cmd = root.add_subcommand(
      "eval", "evaluate a checkpoint on its test split (a GPT: the val shards) on every rank of the job, each its "
              "exact share: loss (and perplexity for a GPT) and accuracy; trains nothing");
  cmd->footer(
      "Start it as training starts (dprun, mpirun, srun); the result does not depend on the number of ranks.\n"
      "Example: dprun --nproc-per-node 2 -- dptrain eval --checkpoint runs/gpt_tiny/checkpoints data.dir=runs/fortunes");
  add_checkpoint_option(*cmd, a->checkpoint);
  add_print_config_flag(*cmd, *print_config);
  cmd->add_option("overrides", a->overrides,
                  "overrides of the checkpoint's config, key=value (e.g. data.dir=... train.eval_batch_size=64)");
  return {cmd, [a] { return eval_job(*a); }};
}

}  // namespace dpt::trainer::commands
