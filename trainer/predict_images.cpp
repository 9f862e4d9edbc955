// trainer/predict_images.cpp: `dptrain predict` over images (trainer/predict_images.h).
#include "trainer/predict_images.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <optional>

#include "core/check.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "data/transforms.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/config_check.h"
#include "trainer/datasets.h"

namespace dpt::trainer {
namespace {

namespace fs = std::filesystem;

std::string prob_text(double p) { return fmt::format("{:.{}f}", p, kProbDigits); }

// An image classifier's evaluation preprocessing, from its config: what make_datasets's test split applies.
struct ImagePipeline {
  data::TransformOptions transform;
  std::vector<int64_t> sample_shape;  // {channels, size, size}
};

ImagePipeline image_pipeline(const Config& cfg, const std::string& checkpoint) {
  const DataConfig& d = cfg.data;
  data::TransformOptions t;
  t.mode = data::TransformMode::none;
  if (d.dataset == DatasetKind::fashion_mnist) {
    // The IDX pixels' normalisation (data/idx.h), the same float arithmetic; other sizes are resized to 28 x 28.
    t.size = t.resize = 28;
    t.channels = 1;
    t.mean = {data::kFashionMnistMean};
    t.std = {data::kFashionMnistStd};
  } else if (d.dataset == DatasetKind::imagefolder) {
    t.size = d.image_size;
    t.resize = d.resize;
    t.channels = static_cast<int>(d.channels);
    t.mean.assign(d.mean.begin(), d.mean.end());
    t.std.assign(d.std.begin(), d.std.end());
  } else {
    DPT_THROW(ConfigError,
              "predict: {} was trained on data.dataset = {} (model {}); predict takes image classifiers "
              "(fashion-mnist, imagefolder) and GPTs (prompts)",
              checkpoint, choice_name(d.dataset), cfg.model.name);
  }
  return {t, {t.channels, t.size, t.size}};
}

// One batch of decoded images: `rows` x sample floats (rows = the padded batch size; the unused rows zero), and an
// error message per image that could not be read (none: fine).
struct DecodedBatch {
  Tensor pixels;
  std::vector<std::optional<std::string>> errors;
};

}  // namespace

// ---- inputs and batches ----------------------------------------------------------------------------------------

std::string ImageInputs::file(size_t i) const { return root.empty() ? names.at(i) : (fs::path(root) / names.at(i)).string(); }

ImageInputs list_image_inputs(const std::string& input) {
  std::error_code ec;
  if (!fs::exists(input, ec)) DPT_THROW(ConfigError, "predict: --input {} not found", input);
  ImageInputs in;
  if (fs::is_directory(input, ec)) {
    in.root = input;
    in.names = data::list_image_files(input);
  } else if (data::is_image_name(input) || data::image_signature(input)) {
    in.names = {input};  // one image (one that cannot be decoded is an error naming it, as in a folder)
  } else {
    in.names = read_lines(input, /*skip_comments=*/true);
    for (size_t i = 0; i < in.names.size(); ++i)
      if (in.names[i].find('\0') != std::string::npos)
        DPT_THROW(ConfigError, "predict: --input {}: its entry {} (counting non-blank, non-comment lines) holds a NUL "
                  "byte: it is neither a list file (a text file of image paths, one a line) nor an image (named .png, "
                  ".jpg or .jpeg, or starting with a PNG or JPEG signature); give a folder, a list file or an image",
                  input, i + 1);
    std::sort(in.names.begin(), in.names.end());
  }
  return in;
}

size_t image_batch_count(size_t n, size_t rows) {
  DPT_CHECK(rows > 0 || n == 0, "{} images in batches of {}", n, rows);
  return n == 0 ? 0 : (n + rows - 1) / rows;
}

std::vector<ImageBatch> image_batches(size_t n, size_t rows, int rank, int world_size) {
  DPT_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "rank {} of {}", rank, world_size);
  std::vector<ImageBatch> mine;
  const size_t count = image_batch_count(n, rows);
  for (size_t j = static_cast<size_t>(rank); j < count; j += static_cast<size_t>(world_size))
    mine.push_back({j, j * rows, std::min(n, (j + 1) * rows)});
  return mine;
}

// ---- one prediction --------------------------------------------------------------------------------------------

std::vector<Scored> top_k(const float* logits, int64_t classes, int64_t k) {
  DPT_CHECK_GT(classes, 0);
  double max = logits[0];
  for (int64_t c = 1; c < classes; ++c) max = std::max(max, static_cast<double>(logits[c]));
  std::vector<Scored> all(static_cast<size_t>(classes));
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) {
    all[static_cast<size_t>(c)] = {c, std::exp(static_cast<double>(logits[c]) - max)};
    sum += all[static_cast<size_t>(c)].prob;
  }
  for (Scored& s : all) s.prob /= sum;
  const auto keep = static_cast<size_t>(std::clamp<int64_t>(k, 0, classes));
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep), all.end(),
                    [](const Scored& a, const Scored& b) { return a.prob > b.prob || (a.prob == b.prob && a.index < b.index); });
  all.resize(keep);
  return all;
}

// ---- output lines ---------------------------------------------------------------------------------------------

std::string LineFormat::header() const {
  if (format == PredictFormat::jsonl) return "";
  std::string h = "path";
  for (int64_t i = 1; i <= k; ++i) h += fmt::format(",index_{0},class_{0},prob_{0}", i);
  return h + ",error\n";
}

std::string LineFormat::prediction(const std::string& path, const std::vector<Scored>& top) const {
  std::string line;
  if (format == PredictFormat::jsonl) {
    line = "{\"path\": " + json_string(path) + ", \"top\": [";
    for (size_t i = 0; i < top.size(); ++i)
      line += fmt::format("{}{{\"index\": {}, \"class\": {}, \"prob\": {}}}", i ? ", " : "", top[i].index,
                          json_string(classes.at(static_cast<size_t>(top[i].index))), prob_text(top[i].prob));
    return line + "]}\n";
  }
  line = csv_field(path);
  for (const Scored& s : top)
    line += fmt::format(",{},{},{}", s.index, csv_field(classes.at(static_cast<size_t>(s.index))), prob_text(s.prob));
  return line + ",\n";
}

std::string LineFormat::error(const std::string& path, const std::string& what) const {
  if (format == PredictFormat::jsonl) return "{\"path\": " + json_string(path) + ", \"error\": " + json_string(what) + "}\n";
  std::string line = csv_field(path);
  for (int64_t i = 0; i < k; ++i) line += ",,,";
  return line + "," + csv_field(what) + "\n";
}

// ---- the run ---------------------------------------------------------------------------------------------------

std::vector<std::string> checkpoint_classes(const SavedRun& target) {
  if (!target.checkpoint.state.classes.empty()) return target.checkpoint.state.classes;
  const DataConfig& d = target.config.data;
  try {
    std::vector<std::string> classes = class_names(d);
    spdlog::warn("predict: {} holds no class names (written before they were saved): those of {} in label order",
                 target.checkpoint.path, d.dataset == DatasetKind::imagefolder ? d.dir + "/train" : choice_name(d.dataset));
    return classes;
  } catch (const Error& e) {  // a folder gone (ConfigError) or unreadable (IoError)
    DPT_THROW(ConfigError,
              "predict: {} holds no class names (written before they were saved) and its image folder cannot give "
              "them ({}); name the folder it was trained on with data.dir=DIR",
              target.checkpoint.path, e.what());
  }
}

std::string batch_lines(const LineFormat& lines, const ImageBatch& batch,
                        const std::vector<std::optional<std::string>>& decode_errors, const Tensor& logits,
                        const std::vector<std::string>& names, size_t* errors) {
  DPT_CHECK(decode_errors.size() == batch.size() && logits.ndim() == 2 &&
                logits.dim(0) >= static_cast<int64_t>(batch.size()),
            "{} errors and logits {} for a batch of {}", decode_errors.size(), logits.shape_str(), batch.size());
  const int64_t classes = logits.dim(1);
  std::string text;
  for (size_t i = batch.begin; i < batch.end; ++i) {
    const std::optional<std::string>& err = decode_errors[i - batch.begin];
    if (err) {  // an error is never a prediction, whatever its text says (an empty one included)
      text += lines.error(names[i], err->empty() ? "cannot be read" : *err);
      ++*errors;
      continue;
    }
    text += lines.prediction(names[i], top_k(logits.data<float>() + (i - batch.begin) * static_cast<size_t>(classes),
                                             classes, lines.k));
  }
  return text;
}

namespace {

// The checkpoint's classifier on `device`, in evaluation mode (BatchNorm: running statistics), in its precision.
std::unique_ptr<models::Model> saved_classifier(const SavedRun& target, const std::vector<int64_t>& sample_shape,
                                                int64_t classes, Device device) {
  auto model = build_model(target.config.model, sample_shape, classes, device);
  model->load_state([&](const std::string& name) { return target.checkpoint.model.find(name); },
                    target.checkpoint.path);
  model->set_precision(target.config.train.precision);
  model->set_training(false);
  return model;
}

}  // namespace

PredictSummary predict_images(const SavedRun& target, const PredictOptions& o, comm::ProcessGroup& pg,
                              Device device) {
  const auto start = std::chrono::steady_clock::now();
  const Config& cfg = target.config;
  const ImagePipeline pipe = image_pipeline(cfg, target.checkpoint.path);
  const data::Transform transform(pipe.transform);
  LineFormat lines{.format = o.format, .k = 0, .classes = checkpoint_classes(target)};
  lines.k = std::min<int64_t>(o.top_k, static_cast<int64_t>(lines.classes.size()));

  const auto model = saved_classifier(target, pipe.sample_shape, static_cast<int64_t>(lines.classes.size()), device);

  const ImageInputs in = list_image_inputs(o.input);
  if (in.names.empty()) DPT_THROW(ConfigError, "predict: no images (.png, .jpg, .jpeg) in {}", o.input);
  check_same_inputs(in.names, "images", "--input " + o.input, pg);
  const size_t n = in.names.size();
  // Whole batches over all the inputs, dealt to the ranks in turn: an image is computed in the same batch at the
  // same row on any number of ranks (predict.h).
  const auto rows = static_cast<size_t>(std::min<int64_t>(o.batch_size, static_cast<int64_t>(n)));
  const size_t batch_count = image_batch_count(n, rows);
  const std::vector<ImageBatch> batches = image_batches(n, rows, pg.rank(), pg.size());
  size_t my_images = 0;
  for (const ImageBatch& b : batches) my_images += b.size();
  const int64_t classes = static_cast<int64_t>(lines.classes.size());
  if (pg.rank() == 0)
    spdlog::info("predict: {} images in {} on {} rank(s): {} batch(es) of {} dealt to the ranks in turn, {} on {}, "
                 "top {} of {} classes",
                 n, o.input, pg.size(), batch_count, rows, model->summary(), device.str(), lines.k, classes);

  std::vector<int64_t> shape{static_cast<int64_t>(rows)};
  shape.insert(shape.end(), pipe.sample_shape.begin(), pipe.sample_shape.end());
  const size_t sample = static_cast<size_t>(pipe.sample_shape[0] * pipe.sample_shape[1] * pipe.sample_shape[2]);
  // Decodes a batch's inputs into `rows` rows (the unused rows zero); an unreadable image throws unless skip_bad.
  auto decode = [&](const ImageBatch& batch) {
    DecodedBatch b{Tensor::zeros(shape), std::vector<std::optional<std::string>>(batch.size())};
    for (size_t i = batch.begin; i < batch.end; ++i) {
      try {
        const data::Image image = data::read_image(in.file(i), transform.options().channels);
        transform.apply(image.view(), 0, i, b.pixels.data<float>() + (i - batch.begin) * sample);
      } catch (const IoError& e) {
        if (!o.skip_bad) DPT_THROW(IoError, "predict: {} (--skip-bad writes an error line for it and goes on)", e.what());
        b.errors[i - batch.begin] = e.what();
      }
    }
    return b;
  };

  std::vector<std::pair<size_t, std::string>> mine;  // (batch index, its lines)
  size_t errors = 0, done = 0;
  ProgressLine progress(pg.rank() == 0, n, pg.size(), cfg.train.progress_interval_s);
  std::future<DecodedBatch> next;
  if (!batches.empty()) next = std::async(std::launch::async, decode, batches.front());
  for (size_t k = 0; k < batches.size(); ++k) {
    const ImageBatch& batch = batches[k];
    DecodedBatch b = next.get();  // decoded while the previous batch ran
    if (k + 1 < batches.size()) next = std::async(std::launch::async, decode, batches[k + 1]);
    const Tensor logits = model->forward(device.is_cuda() ? b.pixels.to(device) : b.pixels).to(Device::cpu());
    DPT_CHECK(logits.ndim() == 2 && logits.dim(1) == classes, "logits {} for {} classes", logits.shape_str(), classes);
    mine.emplace_back(batch.index, batch_lines(lines, batch, b.errors, logits, in.names, &errors));
    done += batch.size();
    progress.update(done, my_images);
  }

  const std::string text = gather_in_order(mine, batch_count, pg);
  Tensor count = Tensor::zeros({1}, DType::F64);
  count.data<double>()[0] = static_cast<double>(errors);
  pg.allreduce(count, {.op = comm::ReduceOp::Sum, .what = "predict: errors"})->wait();
  if (pg.rank() == 0) write_file_atomically(o.out, lines.header() + text);
  return {n, static_cast<size_t>(count.data<double>()[0]), seconds_since(start), model->summary()};
}

}  // namespace dpt::trainer
