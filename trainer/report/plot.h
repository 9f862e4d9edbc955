// trainer/report/plot.h: `dptrain plot`: a run's curves, drawn from its metrics file (trainer/report/metrics.h) into one PNG
// by gnuplot. Four panels against the optimizer step: loss (the progress records' running mean of the epoch, and
// the epoch records' train and test loss), test accuracy (a token run: test perplexity, exp(test_loss)), the
// learning rate, and throughput (MFU on a second axis when the records carry it). Two steps, so that the first
// is tested without gnuplot: read_curves turns the records into series, gnuplot_script into a script that
// holds its data inline; plot_run runs it through a gnuplot child process (the script on its stdin) and
// renames OUT.tmp to OUT, so OUT is whole or untouched.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace dpt::trainer {

struct CurvePoint {
  int64_t step = 0;   // optimizer steps done (x)
  double value = 0;
  int64_t epoch = 0;  // 1-based, from the record: a progress curve is broken where it changes
};
using Curve = std::vector<CurvePoint>;

// The series of one metrics file, in the file's order.
struct RunCurves {
  Curve progress_loss, train_loss, test_loss;  // progress `loss`; epoch `train_loss`, `test_loss`
  Curve test_acc;                              // epoch `test_acc`, in percent
  Curve test_ppl;                              // exp(test_loss) of each epoch record (finite ones)
  Curve progress_lr, epoch_lr;                 // `lr`
  Curve progress_rate, epoch_rate;             // `samples_per_s` or `tokens_per_s`
  Curve progress_mfu, epoch_mfu;               // `mfu_pct`, when present
  bool tokens = false;         // a record carried tokens_per_s: a token run (perplexity, tokens/s)
  size_t records = 0;          // progress and epoch records read
  size_t other_kinds = 0;      // records of other kinds, ignored
  size_t malformed = 0;        // lines that are not a JSON object with a string kind and an integer step
  size_t first_malformed = 0;  // its line number (1-based), 0 when none
  int64_t last_step = 0;       // the largest step of any record read
  int64_t last_epoch = 0, epochs = 0;  // the newest record's `epoch` and `epochs`
};

// Reads metrics.jsonl records from `in`. Unknown keys, and values that are not numbers (a NaN loss is written
// as null), are ignored; blank lines are skipped; other lines that are not records count as malformed.
RunCurves read_curves(std::istream& in);

struct PlotSize {
  int width = 1200, height = 900;
};
// "WxH", each 200..10000 pixels; ConfigError otherwise.
PlotSize parse_plot_size(const std::string& text);

// A gnuplot script drawing `c` into `output` (pngcairo, 2x2 multiplot, the data inline as datablocks), titled
// `title`. A panel without data says "no data yet".
std::string gnuplot_script(const RunCurves& c, const std::string& title, const std::string& output, PlotSize size);

struct PlotRequest {
  std::string run;     // a run folder (its metrics.jsonl) or the path of a metrics file
  std::string out;     // "": curves.png in the folder that holds the metrics file
  PlotSize size;
  std::string script;  // when set, the gnuplot script is written there too
};

struct PlotReport {
  std::string metrics;  // the file read
  std::string out;      // the PNG written
  size_t records = 0, malformed = 0, first_malformed = 0;
  std::string gnuplot_output;  // what gnuplot printed (warnings) although it succeeded
};

// Reads the metrics file, runs gnuplot ($GNUPLOT, else `gnuplot` from PATH) and writes the PNG.
// ConfigError (a usage error): no metrics file, an empty one, or none of its lines a progress or epoch record.
// Error: gnuplot missing (the message says to install gnuplot-nox), or failing (its output in the message).
PlotReport plot_run(const PlotRequest& r);

}  // namespace dpt::trainer
