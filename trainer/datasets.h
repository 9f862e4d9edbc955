// trainer/datasets.h: the train and test sets a config names (data.dataset: fashion-mnist, tokens, imagefolder,
// synthetic), with data.train_limit / test_limit and data.augment applied.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "trainer/config.h"

namespace dpt::trainer {

struct Datasets {
  std::unique_ptr<data::Dataset> train, test;
  std::vector<std::string> classes;  // class_names(d): what a label means, saved in checkpoints
};

// The class names of a config's data set, label order: Fashion-MNIST's folder names ("0_tshirt_top", ...), an image
// folder's class folders (data.dir/train, listed: IoError when it is missing); empty for tokens and synthetic data.
std::vector<std::string> class_names(const DataConfig& d);

// `seed` drives the random transforms and the synthetic set; ConfigError for a transform the data set does not take.
Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed);

}  // namespace dpt::trainer
