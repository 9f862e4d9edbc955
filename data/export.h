// data/export.h: writes an in-memory image data set (Fashion-MNIST) out as an image folder, the layout
// ImageFolderDataset and torchvision's ImageFolder read: OUT/train/<class>/<index>.png and OUT/val/...
//
// The pixels are the data set's raw bytes (ImageClassDataset::image()), unchanged: a PNG export reads back
// identical pixel for pixel; a JPEG export is lossy. <index> is the example's position in the source split,
// zero-padded so that file-name order is index order. Class folder names must sort (byte-wise) in label
// order, since an image folder's class index is the folder's position in that order.
//
// Atomic enough: everything is written under OUT.tmp and renamed to OUT at the end, so a crashed or
// interrupted export never leaves a complete-looking OUT, only an OUT.tmp that the next export removes.
// (Against an interrupted process, not a power cut: 70000 fsyncs would cost more than the export.) A
// non-empty OUT is refused unless `force`, which replaces it: the old one is renamed aside, the new one
// renamed into place, then the old one removed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/idx.h"
#include "data/image_io.h"

namespace dpt::data {

// Fashion-MNIST's classes as folder names that sort in label order: "0_tshirt_top", ..., "9_ankle_boot".
const std::vector<std::string>& fashion_mnist_class_folders();

struct ExportOptions {
  std::string out_dir;
  ImageFormat format = ImageFormat::png;
  int jpeg_quality = 95;
  // Examples per split; 0: all. Otherwise spread evenly over the classes (the first limit / C examples of
  // each class in index order, one more for the lowest labels while limit % C lasts), so that every class
  // folder holds images; so limit must be 0 or >= the class count.
  size_t limit = 0;
  bool force = false;  // replace a non-empty out_dir
  // The folder the data sets were read from (empty: none given): out_dir may not be it nor hold it (a forced
  // replacement would delete it; data/output_dir.h's check_output_apart).
  std::string source_dir;
  // One folder name per label; empty: the labels, zero-padded to one width ("0".."9", "00".."99", ...).
  std::vector<std::string> class_names;
  // Called now and then while writing, and once at the end of each split: (split, written, total).
  std::function<void(const std::string& split, size_t done, size_t total)> progress;
};

struct ExportSummary {
  std::string out_dir;
  size_t train_images = 0, val_images = 0;
  int classes = 0;
  uint64_t bytes = 0;  // total size of the image files
};

// Writes `train` to OUT/train and `test` to OUT/val. ConfigError for bad options (class names that do not
// sort in label order, limit below the class count, ...); IoError for a non-empty OUT without force and for
// failed writes.
ExportSummary export_image_folder(const ImageClassDataset& train, const ImageClassDataset& test,
                                  const ExportOptions& opts);

}  // namespace dpt::data
