// trainer/predict.h: `dptrain predict`: a checkpoint's classifier over many image files (or a GPT over many
// prompts) on every rank of a group, one output line per input, gathered to rank 0, which writes the file
// atomically.
//
// The same bytes on any number of ranks, for the same threads per rank: every input is computed in the same batch,
// at the same row, beside the same inputs, whatever the rank count, because the batches are formed over all the
// inputs and dealt to the ranks whole. Images: batch j is the sorted inputs [j * B, (j + 1) * B), the last one
// padded with zero rows to B (B = --batch-size, or the input count when smaller), rank j mod N's (image_batches);
// prompts: batches of one window length (prompt_batches), dealt the same way; the lines are gathered back in input
// order. Why it takes that: a CPU's GEMM and convolution kernels may round an input's numbers differently in
// another batch or at another row (measured on an AMD EPYC: 1 and 2 ranks differed from image 510 on when each rank
// took a contiguous half). The thread count is the run's to keep: OpenBLAS's one-thread and many-thread products
// block a long dot product (past 384 terms on AVX-512) differently, so 1 thread and 2 or more differ in the last
// bits; dprun sets OMP_NUM_THREADS=1, and rank 0 logs "device cpu: threads: OpenBLAS N, oneDNN N". The softmax and
// the top-k are computed per image in double on the host, and probabilities printed with kProbDigits decimals.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "models/gpt/generate.h"
#include "trainer/evaluate.h"

namespace dpt::trainer {

inline constexpr int kProbDigits = 6;  // decimals of a printed probability

// ---- inputs and batches ----------------------------------------------------------------------------------------

// What --input names: a folder's images (recursively, as data::list_image_files finds them) as paths relative to
// the folder, or the lines of a list file (paths as written, relative ones to the working directory; blank lines
// and lines starting with '#' skipped); either way sorted byte-wise. IoError when it cannot be read.
struct ImageInputs {
  std::string root;                // the folder; empty for a list file
  std::vector<std::string> names;  // what the output prints, sorted
  std::string file(size_t i) const;  // what to open: root/names[i], or names[i]
};
ImageInputs list_image_inputs(const std::string& input);

// The non-blank lines of a text file, in order (trailing '\r' removed); `skip_comments`: lines starting with '#'
// too. IoError when it cannot be read.
std::vector<std::string> read_lines(const std::string& path, bool skip_comments);

// The batches of n images in batches of `rows`: batch j is inputs [j * rows, min(n, (j + 1) * rows)), run padded
// to `rows` rows, and rank j mod world_size's. Which batch and row an input is in depends on n and rows alone, not
// on the ranks. `rank`'s batches, in order.
struct ImageBatch {
  size_t index = 0, begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ImageBatch&) const = default;
};
size_t image_batch_count(size_t n, size_t rows);
std::vector<ImageBatch> image_batches(size_t n, size_t rows, int rank, int world_size);

// ---- one prediction --------------------------------------------------------------------------------------------

struct Scored {
  int64_t index = 0;
  double prob = 0;
  bool operator==(const Scored&) const = default;
};
// The softmax of `classes` logits (in double, max subtracted, summed in index order), its k largest, most likely
// first, ties by lower index; k is capped at `classes`.
std::vector<Scored> top_k(const float* logits, int64_t classes, int64_t k);

// ---- output lines ---------------------------------------------------------------------------------------------

enum class PredictFormat { jsonl, csv };
PredictFormat parse_predict_format(const std::string& name);  // "jsonl" | "csv"; ConfigError otherwise

// jsonl: {"path": P, "top": [{"index": I, "class": C, "prob": 0.912345}, ...]} or {"path": P, "error": E};
// csv: a header `path,index_1,class_1,prob_1,...,index_k,class_k,prob_k,error`, then a row per image (an error
// row: the path, k empty triples, the error), RFC 4180 quoting. Every line ends with '\n'.
struct LineFormat {
  PredictFormat format = PredictFormat::jsonl;
  int64_t k = 5;                     // columns (csv); at most the class count
  std::vector<std::string> classes;  // names by index
  std::string header() const;        // csv: the header line; jsonl: empty
  std::string prediction(const std::string& path, const std::vector<Scored>& top) const;
  std::string error(const std::string& path, const std::string& what) const;
};

// ---- gathering and writing -------------------------------------------------------------------------------------

// Every rank's `mine`, concatenated in rank order, on rank 0 (the others get ""). Collective.
std::string gather_text(const std::string& mine, comm::ProcessGroup& pg);

// Writes `text` to `path` as path.tmp, fsynced, then renamed over `path`: a reader sees the old file or the whole
// new one, and an interrupted write leaves at most path.tmp. IoError naming the file when a write fails.
void write_file_atomically(const std::string& path, const std::string& text);

// ---- images -----------------------------------------------------------------------------------------------------

struct PredictOptions {
  std::string input, out;
  int64_t batch_size = 64;
  int64_t top_k = 5;
  PredictFormat format = PredictFormat::jsonl;
  bool skip_bad = false;  // an unreadable image: an error line (else the run fails naming it)
};

struct PredictSummary {
  size_t inputs = 0, errors = 0;  // over all ranks
  double seconds = 0;
  std::string model;  // the model's summary
  size_t tokens = 0;  // prompts: the tokens generated, over all ranks
};

// The class names of a checkpoint, in label order: those it saved, or (written before they were saved) its config's
// data set's (trainer/datasets.h's class_names: Fashion-MNIST's; an image folder's data.dir/train listed, which
// must then exist: ConfigError saying so).
std::vector<std::string> checkpoint_classes(const EvalTarget& target);

// Predicts every image of o.input with the checkpoint's classifier (Fashion-MNIST or an image folder's: its
// evaluation preprocessing, its train.precision) on every rank of `pg`, rank 0 writing o.out. ConfigError for a
// checkpoint that is not an image classifier or an input without images; IoError naming an unreadable image
// unless o.skip_bad. Collective.
PredictSummary predict_images(const EvalTarget& target, const PredictOptions& o, comm::ProcessGroup& pg,
                              Device device);

// ---- prompts ----------------------------------------------------------------------------------------------------

// The batches prompts are generated in (models::generate_batch): prompts whose windows min(tokens, block_size) are
// of one length, in input order, cut into chunks of at most batch_size; the batches ordered by their first prompt.
// Every prompt is in exactly one batch. They depend on the prompts alone, not on the ranks: batch j is rank
// j mod world's (as image_batches), so every batch has the same rows whatever the rank count, and so the same logits.
std::vector<std::vector<size_t>> prompt_batches(const std::vector<size_t>& token_counts, int64_t block_size,
                                                int64_t batch_size);

// Lines given with their input index by every rank (each index in [0, n) exactly once over the ranks),
// concatenated in index order on rank 0 (the others get ""). Collective.
std::string gather_in_order(const std::vector<std::pair<size_t, std::string>>& mine, size_t n, comm::ProcessGroup& pg);

struct PromptOptions {
  std::string input, out;     // one prompt a line (blank lines skipped), in input order
  std::string tokenizer;      // as `dptrain generate --tokenizer` (empty: the checkpoint's data.dir)
  int64_t tokens = 200;       // new tokens per prompt
  models::SampleOptions sampling;  // temperature, top_k (vocab_limit: the tokenizer's, set here)
  uint64_t seed = 42;         // every prompt: the text `dptrain generate --seed` gives for it
  bool kv_cache = true;
  int64_t batch_size = 64;    // prompts generated side by side (prompt_batches)
  PredictFormat format = PredictFormat::jsonl;
  double progress_interval_s = 10.0;  // rank 0's progress line (train.progress_interval_s), in generated tokens/s
};

// Completes every prompt of o.input with the GPT of `checkpoint` on every rank of `pg`, in the batches of
// prompt_batches (rank r: batches r, r + world, ...), each sequence sampled from its own generator seeded with
// o.seed; rank 0 writes one line per prompt in input order: jsonl {"prompt": P, "text": T} (T: what
// `dptrain generate --prompt P` prints: the prompt and what follows it; see models::generate_batch for the
// rounding of a batch's logits), or csv prompt,text. Collective.
PredictSummary predict_prompts(const std::string& checkpoint, const PromptOptions& o, comm::ProcessGroup& pg,
                               Device device);

}  // namespace dpt::trainer
