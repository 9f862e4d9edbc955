// data/image_folder.h: ImageFolderDataset: torchvision's ImageFolder layout, DIR/<split>/<class>/*.png|jpg.
//
// Layout and order are torchvision's (datasets/folder.py), so labels and example indices match a PyTorch
// run over the same folder:
//   - the classes are the sub-folders of DIR/<split>; class index = position in the byte-wise sorted list of
//     their names (so "10_x" sorts before "2_x": name folders so that they sort in label order);
//   - a class's images are the files below its folder (sub-folders included, and links to folders followed, as
//     os.walk(followlinks=True); a link to a folder it is inside, which os.walk would follow until the path grew
//     too long, is left out with a warning) whose extension is .png, .jpg or .jpeg in any case, sorted by
//     (folder, file name) byte-wise, their paths through the links; other files are ignored, but those that
//     torchvision's ImageFolder reads and dptrain does not decode (.bmp, .ppm, .pgm, .tif, .tiff, .webp) are counted
//     and named in a warning: they make torchvision's examples and indices differ from dptrain's;
//   - a class folder without images is an error naming it, as torchvision's "Found no valid file for the
//     classes ...".
// Images are decoded inside get() (data/image_io.h), then transformed (data/transforms.h) into
// channels x image_size x image_size floats; get() is thread safe, so the Loader's workers decode in parallel.
//
// Bad images. By default a file that cannot be decoded makes get() throw an IoError naming it. With
// skip_bad_images, the data set must still give every rank the same examples, so skipping is made a pure
// function of the files' contents, never of timing or of which rank met a file first:
//   1. at construction every file's signature and header are checked (cheap: the pixel data is not read);
//      a file that fails is left out of the data set, with one warning naming it. Every rank scans the same
//      files, so every rank drops the same ones and the indices agree;
//   2. a file whose header is fine but whose pixel data is damaged (a truncated JPEG, a bad zlib stream)
//      is only found when get() decodes it, and warned about once per file per process. What get(i) returns
//      then is the data set's BadImage:
//      - substitute (the training split): example i+1 instead (or i+2, ..., wrapping around: the first that
//        decodes), label included. The substitute depends only on i and on which files are damaged, so every
//        rank that reads example i gets the same features and label, and the sampler's permutation and the batch
//        sizes are untouched;
//      - leave_out (the evaluation split): zeros and kLeftOut (data/dataset.h), which the loss and the accuracy
//        count nowhere, so an evaluation is over the readable images only, each once (a substitute would count
//        another image twice).
// The contents must not change while a run reads them (a file that becomes unreadable mid-run is skipped
// from then on by the ranks that meet it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "data/dataset.h"
#include "data/image_io.h"
#include "data/transforms.h"

namespace dpt::data {

inline constexpr const char* kTrainSplit = "train";
inline constexpr const char* kValSplit = "val";

// ImageNet's per-channel statistics (torchvision's reference recipes), the defaults for RGB folders.
inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

// What get() makes of an image that passed the scan but cannot be decoded, under skip_bad_images (see above).
enum class BadImage { substitute, leave_out };

class ImageFolderDataset : public Dataset {
 public:
  // Scans dir/split. transform.size must be > 0 (the images of a folder differ in size). Throws IoError for a
  // missing or empty folder, a class folder without images and (without skip_bad_images) unreadable
  // folders; ConfigError for bad transform options.
  ImageFolderDataset(const std::string& dir, const std::string& split, TransformOptions transform,
                     bool skip_bad_images = false, BadImage bad_image = BadImage::substitute);

  size_t size() const override { return paths_.size(); }
  size_t feature_count() const override;
  int num_classes() const override { return static_cast<int>(classes_.size()); }
  std::string name() const override { return root_; }
  std::vector<int64_t> sample_shape() const override;
  void set_epoch(int64_t epoch) override { epoch_.store(epoch, std::memory_order_relaxed); }
  int32_t get(size_t index, float* features) const override;

  const std::vector<std::string>& class_names() const { return classes_; }
  const std::string& path(size_t index) const;  // the file of example `index`
  int32_t label(size_t index) const;
  // Example `index`'s pixels, decoded to transform.channels channels, before any transform.
  Image read(size_t index) const;
  size_t skipped_at_scan() const { return skipped_at_scan_; }  // files left out by the header check
  // Files left out because their extension is one of torchvision's other image formats (a warning says so).
  size_t other_formats() const { return other_formats_; }
  const Transform& transform() const { return transform_; }

 private:
  std::string root_;  // dir/split
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
  Transform transform_;
  bool skip_bad_images_ = false;
  BadImage bad_image_ = BadImage::substitute;
  size_t skipped_at_scan_ = 0;
  size_t other_formats_ = 0;
  std::atomic<int64_t> epoch_{0};
  mutable std::mutex bad_mu_;
  mutable std::unordered_set<size_t> bad_;  // examples whose decoding failed (skip_bad_images), warned once
};

// Whether a file name is an image's by its extension, as the folders are listed: .png, .jpg or .jpeg in any case.
bool is_image_name(const std::filesystem::path& path);
// Whether its extension is one of the image formats torchvision's ImageFolder also reads and dptrain does not decode:
// .bmp, .ppm, .pgm, .tif, .tiff, .webp in any case.
bool is_torchvision_only_image_name(const std::filesystem::path& path);

// The class folder names of dir/split, byte-wise sorted (the class order). IoError when it is missing.
std::vector<std::string> list_class_folders(const std::string& dir, const std::string& split);

// The image files below `dir` (recursively, as a class folder is read: .png, .jpg, .jpeg in any case, links to
// folders followed but into a cycle) as paths relative to `dir`, sorted byte-wise. IoError when `dir` cannot be
// listed.
std::vector<std::string> list_image_files(const std::string& dir);

// What the trainer's data.* keys fill: see make_image_folder.
struct ImageFolderOptions {
  std::string dir;              // holds train/ and val/
  int64_t image_size = 224;     // output height = width
  int64_t resize = 0;           // shorter side resized to this before cropping (eval; crop_flip); 0: none
  int64_t padding = 0;          // crop_flip: zero padding before the random crop
  TransformMode augment = TransformMode::random_resized_crop;  // the training split's transform
  std::vector<float> mean = {kImageNetMean[0], kImageNetMean[1], kImageNetMean[2]};
  std::vector<float> std = {kImageNetStd[0], kImageNetStd[1], kImageNetStd[2]};
  int channels = 3;             // 1 (grey) or 3 (RGB)
  bool skip_bad_images = false;
  uint64_t seed = 0;            // the data seed (train.seed): keys the random transforms with (epoch, index)
};

// DIR/train with the `augment` transform (train = true), or DIR/val with the eval transform: [Resize(resize)]
// + CenterCrop(image_size). Under skip_bad_images, an image found damaged in get() is substituted in DIR/train
// and left out in DIR/val (BadImage). Both split folders must hold the same class folders (else ConfigError naming
// the differences: the folders are the layout data.dir names), so that a label means the same class in both.
std::unique_ptr<ImageFolderDataset> make_image_folder(const ImageFolderOptions& opts, bool train);

}  // namespace dpt::data
