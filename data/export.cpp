// data/export.cpp: export_image_folder: an ImageClassDataset written as OUT/{train,val}/<class>/<index>.png.
#include "data/export.h"

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "data/image_folder.h"
#include "data/output_dir.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kProgressEvery = 5000;  // images between progress callbacks

void check_class_names(const std::vector<std::string>& names, int classes) {
  if (names.size() != static_cast<size_t>(classes)) {
    DPT_THROW(ConfigError, "export: {} class names for {} classes", names.size(), classes);
  }
  for (const std::string& n : names) {
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos || n.find('\0') != std::string::npos) {
      DPT_THROW(ConfigError, "export: '{}' cannot be a folder name", n);
    }
  }
  for (size_t c = 1; c < names.size(); ++c) {
    if (!(names[c - 1] < names[c])) {
      DPT_THROW(ConfigError,
                "export: class folder names must sort in label order (an image folder numbers its classes in "
                "sorted order), but '{}' (label {}) does not sort before '{}' (label {})",
                names[c - 1], c - 1, names[c], c);
    }
  }
}

// The examples to write: all, or `limit` spread over the classes as ExportOptions says.
std::vector<size_t> choose(const ImageClassDataset& ds, size_t limit, int classes) {
  std::vector<size_t> chosen;
  if (limit == 0 || limit >= ds.size()) {
    chosen.resize(ds.size());
    for (size_t i = 0; i < ds.size(); ++i) chosen[i] = i;
    return chosen;
  }
  const auto c_count = static_cast<size_t>(classes);
  std::vector<size_t> quota(c_count), taken(c_count, 0);
  for (size_t c = 0; c < c_count; ++c) quota[c] = limit / c_count + (c < limit % c_count ? 1 : 0);
  for (size_t i = 0; i < ds.size() && chosen.size() < limit; ++i) {
    const auto y = static_cast<size_t>(ds.label(i));
    if (taken[y] < quota[y]) {
      ++taken[y];
      chosen.push_back(i);
    }
  }
  return chosen;
}

size_t write_split(const ImageClassDataset& ds, const fs::path& dir, const std::string& split,
                   const std::vector<std::string>& names, const ExportOptions& opts, uint64_t* bytes) {
  const std::vector<size_t> chosen = choose(ds, opts.limit, static_cast<int>(names.size()));
  for (const std::string& n : names) fs::create_directories(dir / n);
  const size_t digits = std::to_string(ds.size() > 0 ? ds.size() - 1 : 0).size();
  const char* ext = opts.format == ImageFormat::png ? "png" : "jpg";
  for (size_t k = 0; k < chosen.size(); ++k) {
    const size_t i = chosen[k];
    const ImageView view{ds.image(i), static_cast<int64_t>(ds.height()), static_cast<int64_t>(ds.width()), 1};
    const std::string path =
        (dir / names[static_cast<size_t>(ds.label(i))] / fmt::format("{:0{}}.{}", i, digits, ext)).string();
    if (opts.format == ImageFormat::png) {
      write_png(path, view);
    } else {
      write_jpeg(path, view, opts.jpeg_quality);
    }
    *bytes += fs::file_size(path);
    if (opts.progress && (k + 1) % kProgressEvery == 0 && k + 1 < chosen.size()) opts.progress(split, k + 1, chosen.size());
  }
  if (opts.progress) opts.progress(split, chosen.size(), chosen.size());
  return chosen.size();
}

}  // namespace

const std::vector<std::string>& fashion_mnist_class_folders() {
  static const std::vector<std::string> names = {"0_tshirt_top", "1_trouser", "2_pullover", "3_dress",   "4_coat",
                                                 "5_sandal",     "6_shirt",   "7_sneaker",  "8_bag",     "9_ankle_boot"};
  return names;
}

ExportSummary export_image_folder(const ImageClassDataset& train, const ImageClassDataset& test,
                                  const ExportOptions& opts) {
  if (opts.out_dir.empty()) DPT_THROW(ConfigError, "export: no output directory given");
  const int classes = std::max(train.num_classes(), test.num_classes());
  std::vector<std::string> names = opts.class_names;
  if (names.empty()) {
    const size_t width = std::to_string(classes - 1).size();
    for (int c = 0; c < classes; ++c) names.push_back(fmt::format("{:0{}}", c, width));
  }
  check_class_names(names, classes);
  if (opts.limit != 0 && opts.limit < static_cast<size_t>(classes)) {
    DPT_THROW(ConfigError, "export: limit {} is below the {} classes: every class folder needs an image (0: all)",
              opts.limit, classes);
  }
  if (opts.format == ImageFormat::jpeg && (opts.jpeg_quality < 1 || opts.jpeg_quality > 100)) {
    DPT_THROW(ConfigError, "export: JPEG quality must be in [1, 100], got {}", opts.jpeg_quality);
  }

  const std::vector<std::string> sources = opts.source_dir.empty() ? std::vector<std::string>{}
                                                                    : std::vector{opts.source_dir};
  OutputDir out(opts.out_dir, opts.force, sources, FolderRead::named_files, "--out", "--data-dir");
  ExportSummary summary;
  summary.out_dir = out.path().string();
  summary.classes = classes;
  try {
    summary.train_images = write_split(train, out.staging() / kTrainSplit, kTrainSplit, names, opts, &summary.bytes);
    summary.val_images = write_split(test, out.staging() / kValSplit, kValSplit, names, opts, &summary.bytes);
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "export to {}: {}", out.path().string(), e.what());
  }
  out.commit();
  return summary;
}

}  // namespace dpt::data
