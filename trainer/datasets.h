// trainer/datasets.h: the train and test sets a config names (data.dataset: fashion-mnist, tokens, imagefolder,
// synthetic), with data.train_limit / test_limit and data.augment applied.
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataset.h"
#include "trainer/config.h"

namespace dpt::trainer {

struct Datasets {
  std::unique_ptr<data::Dataset> train, test;
};

// `seed` drives the random transforms and the synthetic set; ConfigError for a transform the data set does not take.
Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed);

}  // namespace dpt::trainer
