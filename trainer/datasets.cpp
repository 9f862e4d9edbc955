// trainer/datasets.cpp: the data sets of a config (trainer/datasets.h).
#include "trainer/datasets.h"

#include "core/check.h"
#include "data/augmented.h"
#include "data/export.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/subset.h"
#include "data/synthetic.h"
#include "data/token_dataset.h"
#include "data/transforms.h"

namespace dpt::trainer {
namespace {

// The first `limit` examples of an evenly strided pass over `d` (image folders are sorted by class: every
// class keeps its share).
std::unique_ptr<data::Dataset> limited(std::unique_ptr<data::Dataset> d, int64_t limit) {
  if (limit <= 0 || static_cast<size_t>(limit) >= d->size()) return d;
  const size_t stride = d->size() / static_cast<size_t>(limit);
  return std::make_unique<data::Subset>(std::shared_ptr<data::Dataset>(std::move(d)), 0, static_cast<size_t>(limit),
                                        stride);
}

}  // namespace

std::vector<std::string> class_names(const DataConfig& d) {
  if (d.dataset == DatasetKind::fashion_mnist) return data::fashion_mnist_class_folders();
  if (d.dataset == DatasetKind::imagefolder) return data::list_class_folders(d.dir, data::kTrainSplit);
  return {};
}

Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed) {
  Datasets ds;
  const auto mode = data::parse_transform_mode(d.augment);
  if (d.dataset == DatasetKind::fashion_mnist) {
    if (mode == data::TransformMode::random_resized_crop)
      DPT_THROW(ConfigError, "data.augment = random_resized_crop is for image folders; Fashion-MNIST takes none or crop_flip");
    auto train = data::load_fashion_mnist(d.dir, true, static_cast<size_t>(d.train_limit));
    if (mode == data::TransformMode::crop_flip) {
      const auto options = data::AugmentedDataset::crop_flip(*train, d.padding, seed);
      ds.train = std::make_unique<data::AugmentedDataset>(std::move(train), options);
    } else {
      ds.train = std::move(train);
    }
    ds.test = data::load_fashion_mnist(d.dir, false, static_cast<size_t>(d.test_limit));
    ds.classes = class_names(d);
  } else if (d.dataset == DatasetKind::tokens) {
    ds.train = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "train", m.block_size, m.vocab_size),
                       d.train_limit);
    ds.test = limited(std::make_unique<data::TokenWindowDataset>(d.dir, "val", m.block_size, m.vocab_size),
                      d.test_limit);
  } else if (d.dataset == DatasetKind::imagefolder) {
    data::ImageFolderOptions o;
    o.dir = d.dir;
    o.image_size = d.image_size;
    o.resize = d.resize;
    o.padding = d.padding;
    o.augment = mode;
    o.mean.assign(d.mean.begin(), d.mean.end());
    o.std.assign(d.std.begin(), d.std.end());
    o.channels = static_cast<int>(d.channels);
    o.skip_bad_images = d.skip_bad_images;
    o.seed = seed;
    ds.train = limited(data::make_image_folder(o, true), d.train_limit);
    ds.test = limited(data::make_image_folder(o, false), d.test_limit);
    ds.classes = class_names(d);
  } else {
    // One synthetic set split in two: the same labelling function, disjoint examples.
    const auto n_train = static_cast<size_t>(d.synthetic_train_size), n_test = static_cast<size_t>(d.synthetic_test_size);
    int64_t features = 1;
    for (int64_t dim : d.synthetic_shape) features *= dim;
    auto all = std::make_shared<data::SyntheticDataset>(n_train + n_test, static_cast<size_t>(features), 10, seed,
                                                        d.synthetic_shape);
    ds.train = std::make_unique<data::Subset>(all, 0, n_train);
    ds.test = std::make_unique<data::Subset>(all, n_train, n_test);
  }
  return ds;
}

}  // namespace dpt::trainer
