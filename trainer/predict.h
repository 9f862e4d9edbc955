// trainer/predict.h: `dptrain predict`, what its two tools share: a checkpoint's classifier over many image files
// (trainer/predict_images.h) or a GPT over many prompts (trainer/predict_prompts.h) on every rank of a group, one
// output line per input, gathered to rank 0, which writes the file atomically; the progress line; the formats.
//
// The same bytes on any number of ranks, for the same threads per rank: every input is computed in the same batch,
// at the same row, beside the same inputs, whatever the rank count, because the batches are formed over all the
// inputs and dealt to the ranks whole. Images: batch j is the sorted inputs [j * B, (j + 1) * B), the last one
// padded with zero rows to B (B = --batch-size, or the input count when smaller), rank j mod N's (image_batches);
// prompts: batches of one window length (prompt_batches), dealt the same way; the lines are gathered back in input
// order. Why it takes that: a CPU's GEMM and convolution kernels may round an input's numbers differently in
// another batch or at another row (on an AMD EPYC under OpenBLAS's Haswell and Zen kernels, the MLP's lines for 4
// of 500 images changed when each rank took a contiguous half of the inputs). The thread count is the run's to
// keep: OpenBLAS's one-thread and many-thread products block a long dot product (past 384 terms on AVX-512)
// differently, so 1 thread and 2 or more differ in the last bits; dprun sets OMP_NUM_THREADS=1, and rank 0 logs
// "device cpu: threads: OpenBLAS N, oneDNN N". The softmax and the top-k are computed per image in double on the
// host, and probabilities printed with kProbDigits decimals.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace dpt::trainer {

// ---- inputs, formats, the summary -------------------------------------------------------------------------------

// The non-blank lines of a text file, in order (trailing '\r' removed); `skip_comments`: lines starting with '#'
// too. IoError when it cannot be read.
std::vector<std::string> read_lines(const std::string& path, bool skip_comments);

enum class PredictFormat { jsonl, csv };
PredictFormat parse_predict_format(const std::string& name);  // "jsonl" | "csv"; ConfigError otherwise

// s with every invalid UTF-8 sequence replaced by U+FFFD, as json_string replaces them (the same bytes either way), so
// that both formats are valid UTF-8 text (a generated text may end inside a character, or hold bytes that are none).
std::string valid_utf8(const std::string& s);
// A JSON string literal of s (invalid UTF-8 replaced); s as one RFC 4180 csv field (invalid UTF-8 replaced, as in
// JSON; quoted when it holds a comma, a quote or a line break; quotes doubled).
std::string json_string(const std::string& s);
std::string csv_field(const std::string& s);

struct PredictSummary {
  size_t inputs = 0, errors = 0;  // over all ranks
  double seconds = 0;
  std::string model;  // the model's summary
  size_t tokens = 0;  // prompts: the tokens generated, over all ranks
};

// Seconds from t to now.
double seconds_since(std::chrono::steady_clock::time_point t);

// Rank 0's progress line every `interval_s`: rank 0's pace times the ranks (their shares differ by a batch at most).
class ProgressLine {
 public:
  ProgressLine(bool lead, size_t total, int world, double interval_s, std::string unit = "images");
  void update(size_t done_here, size_t share);

 private:
  using Clock = std::chrono::steady_clock;
  bool lead_;
  size_t total_;
  int world_;
  double interval_s_;
  std::string unit_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// ---- gathering and writing -------------------------------------------------------------------------------------

// Every rank's `mine`, concatenated in rank order, on rank 0 (the others get ""). Collective.
std::string gather_text(const std::string& mine, comm::ProcessGroup& pg);

// Writes `text` to `path` as path.tmp, fsynced, then renamed over `path`: a reader sees the old file or the whole
// new one, and an interrupted write leaves at most path.tmp. IoError naming the file when a write fails.
void write_file_atomically(const std::string& path, const std::string& text);
// --out `path`, on rank 0 before anything is computed: not a directory, its folder created if need be (as
// export-weights creates its --out), and path.tmp, which write_file_atomically writes, creatable (it is created and
// removed), and neither `path` nor path.tmp the --input file `input` (or a file it holds), which the rename would
// replace. ConfigError saying why not, so that a bad --out is not found after every prediction is computed.
void check_output_path(const std::string& path, const std::string& input);

// Lines given with their input index by every rank (each index in [0, n) exactly once over the ranks),
// concatenated in index order on rank 0 (the others get ""). Collective.
std::string gather_in_order(const std::vector<std::pair<size_t, std::string>>& mine, size_t n, comm::ProcessGroup& pg);

}  // namespace dpt::trainer
