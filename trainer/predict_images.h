// trainer/predict_images.h: `dptrain predict` over images: the sorted inputs cut into padded batches dealt to the
// ranks in turn (why: trainer/predict.h), the checkpoint's classifier over each, a line per image.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "trainer/saved_run.h"
#include "trainer/predict.h"

namespace dpt::trainer {

inline constexpr int kProbDigits = 6;  // decimals of a printed probability

// ---- inputs and batches ----------------------------------------------------------------------------------------

// What --input names: a folder's images (recursively, as data::list_image_files finds them) as paths relative to
// the folder; one image (a file named .png, .jpg or .jpeg in any case, or starting with a PNG's or JPEG's signature),
// its path as given; or the lines of a list file (paths as written, relative ones to the working directory; blank
// lines and lines starting with '#' skipped), sorted byte-wise. ConfigError when it does not exist or a list line
// holds a NUL byte (a binary file, not a list); IoError when it cannot be read.
struct ImageInputs {
  std::string root;                // the folder; empty for a list file
  std::vector<std::string> names;  // what the output prints, sorted
  std::string file(size_t i) const;  // what to open: root/names[i], or names[i]
};
ImageInputs list_image_inputs(const std::string& input);

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

// A batch's lines, one per image in input order: the error its decoding met (decode_errors[i - batch.begin], counted
// in *errors; an error line even when its text is empty), or its top k from the batch's `logits` (row i - batch.begin).
std::string batch_lines(const LineFormat& lines, const ImageBatch& batch,
                        const std::vector<std::optional<std::string>>& decode_errors, const Tensor& logits,
                        const std::vector<std::string>& names, size_t* errors);

// ---- the run ---------------------------------------------------------------------------------------------------

struct PredictOptions {
  std::string input, out;
  int64_t batch_size = 64;
  int64_t top_k = 5;
  PredictFormat format = PredictFormat::jsonl;
  bool skip_bad = false;  // an unreadable image: an error line (else the run fails naming it)
};

// The class names of a checkpoint, in label order: those it saved, or (written before they were saved) its config's
// data set's (trainer/datasets.h's class_names: Fashion-MNIST's; an image folder's data.dir/train listed, which
// must then exist: ConfigError saying so).
std::vector<std::string> checkpoint_classes(const SavedRun& target);

// Predicts every image of o.input with the checkpoint's classifier (Fashion-MNIST or an image folder's: its
// evaluation preprocessing, its train.precision) on every rank of `pg`, rank 0 writing o.out. ConfigError for a
// checkpoint that is not an image classifier or an input without images; IoError naming an unreadable image
// unless o.skip_bad. Collective.
PredictSummary predict_images(const SavedRun& target, const PredictOptions& o, comm::ProcessGroup& pg,
                              Device device);

}  // namespace dpt::trainer
