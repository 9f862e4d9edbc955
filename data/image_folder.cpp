// data/image_folder.cpp: ImageFolderDataset (scan, header check, lazy decode + transform) and its factory.
#include "data/image_folder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iterator>
#include <map>
#include <thread>
#include <utility>

#include "core/check.h"

namespace dpt::data {
namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

constexpr const char* kExtensions = "*.png, *.jpg, *.jpeg (any case)";
constexpr unsigned kMaxScanThreads = 8;  // header checks are I/O bound: a few threads hide the latency

std::string expected_layout(const std::string& dir, const std::string& split) {
  return fmt::format("expected {}/{}/<class>/*.png (or .jpg, .jpeg): one folder per class", dir, split);
}

// The image files below `dir`, as os.walk(dir, followlinks=True) finds them (torchvision's ImageFolder): every
// folder, links to folders followed, except a link to a folder it is inside (its own or an ancestor, `dir`'s
// included, by their canonical paths: os.walk would follow it until the path is too long), which is left out with
// a warning naming it. A link whose target is gone is listed too, as torchvision lists it: an image that cannot be
// read is an error naming it (or left out under skip_bad_images), never silently one example fewer. Paths as the
// walk reaches them (through the links).
// Files in torchvision's other IMG_EXTENSIONS (.bmp, .ppm, .pgm, .tif, .tiff, .webp), which its ImageFolder lists and
// dptrain does not decode go to `others` when given.
std::vector<fs::path> walk_images(const fs::path& dir, std::vector<fs::path>* others = nullptr) {
  std::vector<fs::path> found;
  try {
    // inside[d]: the canonical path of the folder whose entries are at depth d (inside[0]: dir itself); above: dir's
    // ancestors.
    std::vector<fs::path> inside{fs::canonical(dir)}, above;
    for (fs::path p = inside[0]; p.has_relative_path(); p = p.parent_path()) above.push_back(p.parent_path());
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      const fs::directory_entry& e = *it;
      const auto depth = static_cast<size_t>(it.depth());
      if (e.is_directory()) {
        inside.resize(depth + 1);
        fs::path target = fs::canonical(e.path());
        if (e.is_symlink() && (std::find(inside.begin(), inside.end(), target) != inside.end() ||
                               std::find(above.begin(), above.end(), target) != above.end())) {
          spdlog::warn("{}: a link to {}, a folder it is inside: not followed (it would be a cycle)", e.path().string(),
                       target.string());
          it.disable_recursion_pending();
          continue;
        }
        inside.push_back(std::move(target));  // the folder the iterator enters next
        continue;
      }
      const bool dangling = e.is_symlink() && !e.exists();
      if (!e.is_regular_file() && !dangling) continue;
      if (is_image_name(e.path()))
        found.push_back(e.path());
      else if (others && is_torchvision_only_image_name(e.path()))
        others->push_back(e.path());
    }
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "{}: cannot list the images: {}{}", dir.string(), e.code().message(),
              e.path1().empty() ? "" : fmt::format(" ({})", e.path1().string()));
  }
  return found;
}

// The image files below a class folder, as torchvision orders them: sorted by (folder, name), byte-wise.
std::vector<std::string> list_images(const fs::path& class_dir, std::vector<fs::path>* others) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder relative to class_dir, file name)
  for (const fs::path& p : walk_images(class_dir, others))
    found.emplace_back(p.parent_path().lexically_relative(class_dir).string(), p.filename().string());
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (const auto& [folder, name] : found) paths.push_back((class_dir / folder / name).lexically_normal().string());
  return paths;
}

// Runs check(i) for i in [0, n) on a few threads; returns the error message of each (empty: fine).
std::vector<std::string> check_headers(const std::vector<std::string>& paths) {
  std::vector<std::string> errors(paths.size());
  const unsigned threads =
      static_cast<unsigned>(std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), kMaxScanThreads,
                                              std::max<size_t>(paths.size() / 64, 1)}));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < paths.size();) {
      try {
        read_image_header(paths[i]);
      } catch (const IoError& e) {
        errors[i] = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return errors;
}

// Warns that `others` (torchvision_only_image names) were left out, with a count per extension and the first one.
void warn_other_formats(const std::string& root, const std::vector<fs::path>& others) {
  if (others.empty()) return;
  std::map<std::string, size_t> per_ext;
  for (const fs::path& p : others) ++per_ext[lower_extension(p)];
  std::vector<std::string> counts;
  for (const auto& [ext, n] : per_ext) counts.push_back(fmt::format("{} {}", n, ext));
  spdlog::warn("{}: left out {} file{} that torchvision's ImageFolder reads but dptrain does not decode ({}; the "
               "first: {}): dptrain reads PNG and JPEG only, so its examples and their indices differ from "
               "torchvision's; convert them to PNG to use them", root, others.size(),
               others.size() == 1 ? "" : "s", fmt::join(counts, ", "), others.front().string());
}

}  // namespace

bool is_image_name(const fs::path& p) {
  const std::string ext = lower_extension(p);
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

bool is_torchvision_only_image_name(const fs::path& p) {
  const std::string ext = lower_extension(p);
  for (const char* e : {".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})
    if (ext == e) return true;
  return false;
}

std::vector<std::string> list_class_folders(const std::string& dir, const std::string& split) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) DPT_THROW(ConfigError, "image folder {} not found: {}", dir, expected_layout(dir, split));
  if (!fs::is_directory(dir, ec)) DPT_THROW(ConfigError, "{} is not a directory: {}", dir, expected_layout(dir, split));
  const fs::path root = fs::path(dir) / split;
  if (!fs::is_directory(root, ec)) {
    DPT_THROW(ConfigError, "{}: split folder not found: {}", root.string(), expected_layout(dir, split));
  }
  std::vector<std::string> classes;
  try {
    for (const fs::directory_entry& e : fs::directory_iterator(root)) {
      if (e.is_directory()) classes.push_back(e.path().filename().string());
    }
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "{}: cannot list the class folders: {}", root.string(), e.code().message());
  }
  std::sort(classes.begin(), classes.end());  // std::string's order is byte-wise (char_traits<char>::lt)
  return classes;
}

std::vector<std::string> list_image_files(const std::string& dir) {
  std::vector<std::string> names;
  std::vector<fs::path> others;
  for (const fs::path& p : walk_images(dir, &others)) names.push_back(p.lexically_relative(dir).string());
  warn_other_formats(dir, others);
  std::sort(names.begin(), names.end());
  return names;
}

ImageFolderDataset::ImageFolderDataset(const std::string& dir, const std::string& split, TransformOptions transform,
                                       bool skip_bad_images, BadImage bad_image)
    : root_((fs::path(dir) / split).string()),
      transform_(std::move(transform)),
      skip_bad_images_(skip_bad_images),
      bad_image_(bad_image) {
  if (transform_.options().size <= 0) {
    DPT_THROW(ConfigError, "{}: an image folder needs an output image size > 0 (its images may differ in size)", root_);
  }
  classes_ = list_class_folders(dir, split);
  if (classes_.empty()) DPT_THROW(ConfigError, "{}: no class folders: {}", root_, expected_layout(dir, split));

  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  std::vector<fs::path> others;  // torchvision's other image formats
  for (size_t c = 0; c < classes_.size(); ++c) {
    for (std::string& p : list_images(fs::path(root_) / classes_[c], &others)) {
      paths.push_back(std::move(p));
      labels.push_back(static_cast<int32_t>(c));
    }
  }
  other_formats_ = others.size();
  warn_other_formats(root_, others);
  if (skip_bad_images_) {
    const std::vector<std::string> errors = check_headers(paths);
    for (size_t i = 0; i < paths.size(); ++i) {
      if (errors[i].empty()) {
        paths_.push_back(std::move(paths[i]));
        labels_.push_back(labels[i]);
      } else {
        spdlog::warn("skip_bad_images: leaving out {}", errors[i]);
        ++skipped_at_scan_;
      }
    }
  } else {
    paths_ = std::move(paths);
    labels_ = std::move(labels);
  }

  std::vector<size_t> per_class(classes_.size(), 0);
  for (int32_t y : labels_) per_class[static_cast<size_t>(y)]++;
  std::vector<std::string> empty;
  for (size_t c = 0; c < classes_.size(); ++c) {
    if (per_class[c] == 0) empty.push_back(classes_[c]);
  }
  if (!empty.empty()) {
    DPT_THROW(IoError, "{}: no {}images ({}) in the class folder{} {}: every class folder needs at least one; {}", root_,
              skip_bad_images_ ? "readable " : "", kExtensions, empty.size() > 1 ? "s" : "", fmt::join(empty, ", "),
              expected_layout(dir, split));
  }
}

size_t ImageFolderDataset::feature_count() const {
  const int64_t size = transform_.options().size;
  return static_cast<size_t>(transform_.options().channels * size * size);
}

std::vector<int64_t> ImageFolderDataset::sample_shape() const {
  const int64_t size = transform_.options().size;
  return {transform_.options().channels, size, size};
}

const std::string& ImageFolderDataset::path(size_t index) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, root_, size());
  return paths_[index];
}

int32_t ImageFolderDataset::label(size_t index) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, root_, size());
  return labels_[index];
}

Image ImageFolderDataset::read(size_t index) const { return read_image(path(index), transform_.options().channels); }

int32_t ImageFolderDataset::get(size_t index, float* features) const {
  DPT_CHECK(index < size(), "index {} past the end of {} ({} examples)", index, root_, size());
  const int64_t epoch = epoch_.load(std::memory_order_relaxed);
  if (!skip_bad_images_) {
    thread_local Image image;  // each loader thread's decoding buffer, reused image after image
    read_image(path(index), transform_.options().channels, image);
    transform_.apply(image.view(), epoch, index, features);
    return labels_[index];
  }
  // skip_bad_images: the first example from `index` on (wrapping around) that decodes stands in for it, or (leave_out)
  // nothing does.
  const size_t tries = bad_image_ == BadImage::leave_out ? 1 : size();
  for (size_t step = 0; step < tries; ++step) {
    const size_t i = (index + step) % size();
    {
      std::lock_guard<std::mutex> lock(bad_mu_);
      if (bad_.count(i) != 0) continue;
    }
    Image image;
    try {
      image = read(i);
    } catch (const IoError& e) {
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(bad_mu_);
        first = bad_.insert(i).second;
      }
      if (first)
        spdlog::warn("skip_bad_images: {}; {}", e.what(),
                     bad_image_ == BadImage::leave_out
                         ? "left out of the evaluation (its loss and accuracy count it nowhere)"
                         : "examples that read it get the next readable one instead");
      continue;
    }
    transform_.apply(image.view(), epoch, index, features);
    return labels_[i];
  }
  if (bad_image_ == BadImage::leave_out) {
    std::fill(features, features + feature_count(), 0.0f);
    return kLeftOut;
  }
  DPT_THROW(IoError, "{}: none of the {} images could be decoded", root_, size());
}

std::unique_ptr<ImageFolderDataset> make_image_folder(const ImageFolderOptions& opts, bool train) {
  if (opts.dir.empty()) DPT_THROW(ConfigError, "image folder: no directory given (data.dir)");
  TransformOptions t;
  t.mode = train ? opts.augment : TransformMode::none;
  t.size = opts.image_size;
  t.resize = opts.resize;
  t.padding = opts.padding;
  t.channels = opts.channels;
  t.mean = opts.mean;
  t.std = opts.std;
  t.seed = opts.seed;
  const std::string split = train ? kTrainSplit : kValSplit;
  auto dataset = std::make_unique<ImageFolderDataset>(opts.dir, split, std::move(t), opts.skip_bad_images,
                                                      train ? BadImage::substitute : BadImage::leave_out);

  // The other split, where it exists, must name the same classes, or label k would mean two things.
  const std::string other = train ? kValSplit : kTrainSplit;
  std::error_code ec;
  if (fs::is_directory(fs::path(opts.dir) / other, ec)) {
    const std::vector<std::string> theirs = list_class_folders(opts.dir, other);
    const std::vector<std::string>& ours = dataset->class_names();
    if (theirs != ours) {
      std::vector<std::string> only_ours, only_theirs;
      std::set_difference(ours.begin(), ours.end(), theirs.begin(), theirs.end(), std::back_inserter(only_ours));
      std::set_difference(theirs.begin(), theirs.end(), ours.begin(), ours.end(), std::back_inserter(only_theirs));
      DPT_THROW(ConfigError, "{}: the class folders of {}/ and {}/ differ (only in {}: [{}]; only in {}: [{}]); both "
                "splits need the same classes so that a label means the same class in both", opts.dir, split, other,
                split, fmt::join(only_ours, ", "), other, fmt::join(only_theirs, ", "));
    }
  }
  return dataset;
}

}  // namespace dpt::data
