// trainer/commands/plot.cpp: `dptrain plot`: a run's curves from RUN/metrics.jsonl, as one PNG drawn by gnuplot
// (trainer/report/plot.h).
#include <spdlog/spdlog.h>

#include "trainer/commands/commands.h"
#include "trainer/report/plot.h"

namespace dpt::trainer::commands {
namespace {

struct PlotArgs {
  std::string run, out, size = "1200x900", script;
};

void plot(const PlotArgs& a) {
  const PlotSize size = parse_plot_size(a.size);
  const PlotReport r = plot_run({.run = a.run, .out = a.out, .size = size, .script = a.script});
  if (r.malformed > 0)
    spdlog::warn("plot: skipped {} malformed line(s) of {} (the first: line {})", r.malformed, r.metrics,
                 r.first_malformed);
  if (!r.gnuplot_output.empty()) spdlog::warn("plot: gnuplot said: {}", r.gnuplot_output);
  spdlog::info("plot: {} record{} of {} \u2192 {} ({}x{})", r.records, r.records == 1 ? "" : "s", r.metrics, r.out,
               size.width, size.height);
}

}  // namespace

Command add_plot(CLI::App& root) {
  auto a = std::make_shared<PlotArgs>();
  CLI::App* cmd = root.add_subcommand(
      "plot", "draw a run's curves from RUN/metrics.jsonl into one PNG with gnuplot, then exit; trains nothing. "
              "Four panels against the optimizer step: loss (train: the progress lines' running mean of the epoch "
              "and each epoch's mean; test), test accuracy (a GPT: test perplexity), learning rate, throughput "
              "(samples/s or tokens/s of all ranks; MFU on a right axis when recorded)");
  cmd->footer(
      "Works during a run too: it draws what the file holds so far. Needs gnuplot with its pngcairo terminal\n"
      "(Debian: gnuplot-nox, installed by scripts/setup.sh); GNUPLOT=PATH chooses another.\n"
      "Exit codes: 0 drawn, 1 gnuplot missing or failed (its output in the message), 2 no metrics file, an empty\n"
      "one or one without progress or epoch records, or a bad option.\n"
      "Example: dptrain plot runs/fmnist_mlp          (writes runs/fmnist_mlp/curves.png)\n"
      "         dptrain plot runs/gpt_tiny/metrics.jsonl --out /tmp/gpt.png --size 900x600");
  cmd->add_option("run", a->run,
                  "a run folder (the one holding metrics.jsonl: log.dir, by default the folder of checkpoint.dir) or "
                  "the path of a metrics file")
      ->required();
  cmd->add_option("--out", a->out,
                  "the PNG (written whole: OUT.tmp, then renamed); default: curves.png beside the metrics file");
  cmd->add_option("--size", a->size, "WIDTHxHEIGHT in pixels, each 200 to 10000")->capture_default_str();
  cmd->add_option("--script", a->script, "also write the gnuplot script (data inline) to this file");
  return {cmd, [a] { return run_alone([&] { plot(*a); }); }};
}

}  // namespace dpt::trainer::commands
