// trainer/predict.cpp: `dptrain predict` over images (trainer/predict.h).
#include "trainer/predict.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/logging.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "data/transforms.h"
#include "models/model.h"
#include "trainer/build_model.h"
#include "trainer/datasets.h"
#include "trainer/gpt_checkpoint.h"
#include "trainer/report/run_report.h"

namespace dpt::trainer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// RFC 4180: quoted when it holds a comma, a quote or a line break; quotes doubled.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

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
  if (d.dataset == "fashion-mnist") {
    // The IDX pixels' normalisation (data/idx.h), the same float arithmetic; other sizes are resized to 28 x 28.
    t.size = t.resize = 28;
    t.channels = 1;
    t.mean = {data::kFashionMnistMean};
    t.std = {data::kFashionMnistStd};
  } else if (d.dataset == "imagefolder") {
    t.size = d.image_size;
    t.resize = d.resize;
    t.channels = static_cast<int>(d.channels);
    t.mean.assign(d.mean.begin(), d.mean.end());
    t.std.assign(d.std.begin(), d.std.end());
  } else {
    DPT_THROW(ConfigError,
              "predict: {} was trained on data.dataset = {} (model {}); predict takes image classifiers "
              "(fashion-mnist, imagefolder) and GPTs (prompts)",
              checkpoint, d.dataset, cfg.model.name);
  }
  return {t, {t.channels, t.size, t.size}};
}

// Rank 0's progress line every `interval_s`: rank 0's pace times the ranks (their shares differ by a batch at most).
class ProgressLine {
 public:
  ProgressLine(bool lead, size_t total, int world, double interval_s, std::string unit = "images")
      : lead_(lead), total_(total), world_(world), interval_s_(interval_s), unit_(std::move(unit)) {}
  void update(size_t done_here, size_t share) {
    if (!lead_ || seconds_since(last_) < interval_s_) return;
    last_ = Clock::now();
    const double elapsed = seconds_since(start_);
    const double rate = static_cast<double>(done_here) * world_ / elapsed;
    const double eta = rate > 0 ? static_cast<double>(share - done_here) * world_ / rate : -1;
    const size_t done = std::min(total_, done_here * static_cast<size_t>(world_));
    const std::string line = fmt::format("predict: ~{}/{} {} ({:.0f}%) {:.1f} {}/s eta {}", done, total_, unit_,
                                         100.0 * static_cast<double>(done) / static_cast<double>(total_), rate, unit_,
                                         format_duration(eta));
    if (live_line_enabled())
      show_live_line(line);
    else
      spdlog::info("{}", line);
  }

 private:
  bool lead_;
  size_t total_;
  int world_;
  double interval_s_;
  std::string unit_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// One batch of decoded images: `rows` x sample floats (rows = the padded batch size; the unused rows zero), and an
// error message per image that could not be read (empty: fine).
struct DecodedBatch {
  Tensor pixels;
  std::vector<std::string> errors;
};

}  // namespace

// ---- inputs and batches ----------------------------------------------------------------------------------------

std::string ImageInputs::file(size_t i) const { return root.empty() ? names.at(i) : (fs::path(root) / names.at(i)).string(); }

std::vector<std::string> read_lines(const std::string& path, bool skip_comments) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DPT_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (skip_comments && line.starts_with('#')) continue;
    lines.push_back(std::move(line));
  }
  if (in.bad()) DPT_THROW(IoError, "{}: read failed: {}", path, std::strerror(errno));
  return lines;
}

ImageInputs list_image_inputs(const std::string& input) {
  std::error_code ec;
  if (!fs::exists(input, ec)) DPT_THROW(IoError, "predict: --input {} not found", input);
  ImageInputs in;
  if (fs::is_directory(input, ec)) {
    in.root = input;
    in.names = data::list_image_files(input);
  } else {
    in.names = read_lines(input, /*skip_comments=*/true);
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
  for (size_t j = static_cast<size_t>(rank); j < image_batch_count(n, rows); j += static_cast<size_t>(world_size))
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

PredictFormat parse_predict_format(const std::string& name) {
  if (name == "jsonl") return PredictFormat::jsonl;
  if (name == "csv") return PredictFormat::csv;
  DPT_THROW(ConfigError, "predict: --format must be jsonl or csv, got '{}'", name);
}

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

// ---- gathering and writing -------------------------------------------------------------------------------------

std::string gather_text(const std::string& mine, comm::ProcessGroup& pg) {
  const int world = pg.size();
  Tensor length = Tensor::zeros({1}, DType::I64);
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lengths = Tensor::zeros({world}, DType::I64);
  pg.allgather(length, lengths, {.what = "predict: output sizes"})->wait();
  int64_t longest = 0;
  for (int r = 0; r < world; ++r) longest = std::max(longest, lengths.data<int64_t>()[r]);
  if (longest == 0) return "";
  // Every rank's text padded to the longest: one allgather (rank 0 alone needs it, but the backends have no
  // gather; the output is small next to the images read).
  Tensor buf = Tensor::zeros({longest}, DType::U8);
  std::memcpy(buf.data<uint8_t>(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({longest * world}, DType::U8);
  pg.allgather(buf, all, {.what = "predict: output lines"})->wait();
  if (pg.rank() != 0) return "";
  std::string text;
  for (int r = 0; r < world; ++r)
    text.append(reinterpret_cast<const char*>(all.data<uint8_t>()) + r * longest,
                static_cast<size_t>(lengths.data<int64_t>()[r]));
  return text;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(IoError, "{}: cannot create: {}", tmp, std::strerror(errno));
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      DPT_THROW(IoError, "{}: write failed: {}", tmp, std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPT_THROW(IoError, "{}: fsync failed: {}", tmp, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPT_THROW(IoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
}

// ---- images -----------------------------------------------------------------------------------------------------

std::vector<std::string> checkpoint_classes(const EvalTarget& target) {
  if (!target.checkpoint.state.classes.empty()) return target.checkpoint.state.classes;
  const DataConfig& d = target.config.data;
  try {
    std::vector<std::string> classes = class_names(d);
    spdlog::warn("predict: {} holds no class names (written before they were saved): those of {} in label order",
                 target.checkpoint.path, d.dataset == "imagefolder" ? d.dir + "/train" : d.dataset);
    return classes;
  } catch (const IoError& e) {
    DPT_THROW(ConfigError,
              "predict: {} holds no class names (written before they were saved) and its image folder cannot give "
              "them ({}); name the folder it was trained on with data.dir=DIR",
              target.checkpoint.path, e.what());
  }
}

PredictSummary predict_images(const EvalTarget& target, const PredictOptions& o, comm::ProcessGroup& pg,
                              Device device) {
  const auto start = Clock::now();
  const Config& cfg = target.config;
  const ImagePipeline pipe = image_pipeline(cfg, target.checkpoint.path);
  const data::Transform transform(pipe.transform);
  LineFormat lines{.format = o.format, .k = 0, .classes = checkpoint_classes(target)};
  lines.k = std::min<int64_t>(o.top_k, static_cast<int64_t>(lines.classes.size()));

  auto model = build_model(cfg.model, pipe.sample_shape, static_cast<int>(lines.classes.size()), device);
  model->load_state([&](const std::string& name) { return target.checkpoint.model.find(name); },
                    target.checkpoint.path);
  model->set_precision(parse_precision(cfg.train.precision));
  model->set_training(false);  // BatchNorm: running statistics

  const ImageInputs in = list_image_inputs(o.input);
  if (in.names.empty()) DPT_THROW(ConfigError, "predict: no images (.png, .jpg, .jpeg) in {}", o.input);
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
    DecodedBatch b{Tensor::zeros(shape), std::vector<std::string>(batch.size())};
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
    std::string text;
    for (size_t i = batch.begin; i < batch.end; ++i) {
      const std::string& err = b.errors[i - batch.begin];
      if (!err.empty()) {
        text += lines.error(in.names[i], err);
        ++errors;
        continue;
      }
      text += lines.prediction(in.names[i], top_k(logits.data<float>() + (i - batch.begin) * static_cast<size_t>(classes),
                                                  classes, lines.k));
    }
    mine.emplace_back(batch.index, std::move(text));
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

// ---- prompts ----------------------------------------------------------------------------------------------------

std::vector<std::vector<size_t>> prompt_batches(const std::vector<size_t>& token_counts, int64_t block_size,
                                                int64_t batch_size) {
  DPT_CHECK(block_size >= 1 && batch_size >= 1, "prompt batches: block_size {}, batch_size {}", block_size, batch_size);
  std::vector<std::vector<size_t>> batches;
  std::map<size_t, size_t> open;  // window length -> its batch being filled
  for (size_t i = 0; i < token_counts.size(); ++i) {
    const size_t window = std::min(token_counts[i], static_cast<size_t>(block_size));
    auto it = open.find(window);
    if (it == open.end() || batches[it->second].size() == static_cast<size_t>(batch_size)) {
      open[window] = batches.size();
      batches.emplace_back();
    }
    batches[open[window]].push_back(i);
  }
  return batches;
}

std::string gather_in_order(const std::vector<std::pair<size_t, std::string>>& mine, size_t n, comm::ProcessGroup& pg) {
  // Each line as "INDEX LENGTH\n" and its bytes (a csv line may hold line breaks).
  std::string packed;
  for (const auto& [index, line] : mine) packed += fmt::format("{} {}\n", index, line.size()) + line;
  const std::string all = gather_text(packed, pg);
  if (pg.rank() != 0) return "";
  std::vector<std::string> lines(n);
  std::vector<bool> seen(n, false);
  for (size_t at = 0; at < all.size();) {
    const size_t eol = all.find('\n', at);
    DPT_CHECK(eol != std::string::npos, "predict: a gathered line without its header at byte {}", at);
    size_t index = 0, length = 0;
    DPT_CHECK(std::sscanf(all.c_str() + at, "%zu %zu", &index, &length) == 2 && index < n && !seen[index] &&
                  eol + 1 + length <= all.size(),
              "predict: a bad gathered line header at byte {}", at);
    seen[index] = true;
    lines[index] = all.substr(eol + 1, length);
    at = eol + 1 + length;
  }
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    DPT_CHECK(seen[i], "predict: no rank gave line {} of {}", i, n);
    text += lines[i];
  }
  return text;
}

PredictSummary predict_prompts(const std::string& checkpoint, const PromptOptions& o, comm::ProcessGroup& pg,
                               Device device) {
  const auto start = Clock::now();
  const GptCheckpoint ck = load_gpt_checkpoint(checkpoint, o.tokenizer, device);
  const data::Tokenizer& tokenizer = *ck.tokenizer;
  const std::vector<std::string> prompts = read_lines(o.input, /*skip_comments=*/false);
  if (prompts.empty()) DPT_THROW(ConfigError, "predict: no prompts (non-blank lines) in {}", o.input);
  // Every rank encodes every prompt: the batches depend on all the token counts.
  std::vector<std::vector<int32_t>> encoded;
  std::vector<size_t> counts;
  for (const std::string& p : prompts) {
    encoded.push_back(tokenizer.encode(p));
    counts.push_back(encoded.back().size());
  }
  const std::vector<std::vector<size_t>> batches = prompt_batches(counts, ck.block_size, o.batch_size);
  const auto world = static_cast<size_t>(pg.size()), rank = static_cast<size_t>(pg.rank());
  size_t my_prompts = 0;
  for (size_t j = rank; j < batches.size(); j += world) my_prompts += batches[j].size();
  models::SampleOptions sampling = o.sampling;
  sampling.vocab_limit = tokenizer.vocab_size();
  const auto new_tokens = static_cast<size_t>(o.tokens);
  if (rank == 0)
    spdlog::info("predict: {} prompts in {} on {} rank(s), {} batches of up to {} (prompts of one length in the "
                 "window together); {} from {} on {}; {} tokens each, temperature {}, top_k {}, seed {}{}; tokenizer {}",
                 prompts.size(), o.input, world, batches.size(), o.batch_size, ck.model->summary(), ck.from,
                 device.str(), o.tokens, sampling.temperature, sampling.top_k, o.seed,
                 o.kv_cache ? "" : ", no KV cache", tokenizer.describe());
  std::vector<std::pair<size_t, std::string>> mine;
  ProgressLine progress(rank == 0, prompts.size() * new_tokens, pg.size(), o.progress_interval_s, "tokens");
  size_t done = 0;  // tokens generated here
  const auto count_tokens = [&](int64_t n) {
    done += static_cast<size_t>(n);
    progress.update(done, my_prompts * new_tokens);
  };
  for (size_t j = rank; j < batches.size(); j += world) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t i : batches[j]) batch.push_back(encoded[i]);
    const std::vector<std::vector<int32_t>> out =
        models::generate_batch(*ck.model, ck.block_size, std::move(batch), o.tokens, sampling,
                               std::vector<uint64_t>(batches[j].size(), o.seed), o.kv_cache, count_tokens);
    for (size_t r = 0; r < out.size(); ++r) {
      const std::string& prompt = prompts[batches[j][r]];
      const std::string text = tokenizer.decode(out[r]);
      mine.emplace_back(batches[j][r], o.format == PredictFormat::jsonl
                                           ? "{\"prompt\": " + json_string(prompt) + ", \"text\": " + json_string(text) + "}\n"
                                           : csv_field(prompt) + "," + csv_field(text) + "\n");
    }
  }
  const std::string text = gather_in_order(mine, prompts.size(), pg);
  if (rank == 0) write_file_atomically(o.out, (o.format == PredictFormat::csv ? "prompt,text\n" : "") + text);
  return {prompts.size(), 0, seconds_since(start), ck.model->summary(), prompts.size() * new_tokens};
}

}  // namespace dpt::trainer
