// trainer/datasets.h: the train and test sets a config names (data.dataset: fashion-mnist, tokens, jsonl, imagefolder,
// synthetic), with data.train_limit / test_limit and data.augment applied; and prepare_data, which tokenizes a
// jsonl data set once, on rank 0, before any rank reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/dataset.h"
#include "data/tokenize.h"
#include "data/tokenizer.h"
#include "trainer/config.h"

namespace dpt::trainer {

struct Datasets {
  std::unique_ptr<data::Dataset> train, test;  // train: null when only the test split was asked for
  std::vector<std::string> classes;  // class_names(d): what a label means, saved in checkpoints
};

// Which splits make_datasets builds: both (training), or the test split alone (an evaluation, which then needs
// nothing of the training split: an image folder's train/ may be absent, Fashion-MNIST's training files unread).
enum class Splits { both, test };

// The class names of a config's data set, label order: Fashion-MNIST's folder names ("0_tshirt_top", ...), an image
// folder's class folders (data.dir/train, listed: IoError when it is missing); empty for tokens and synthetic data.
std::vector<std::string> class_names(const DataConfig& d);

// `seed` drives the random transforms and the synthetic set; ConfigError for a transform the data set does not take.
// data.dataset = jsonl reads data.dir's token shards: prepare_data makes them first. With Splits::test, an image
// folder's classes are those of data.dir/val (which must equal train/'s where it exists).
Datasets make_datasets(const DataConfig& d, const ModelConfig& m, uint64_t seed, Splits splits = Splits::both);

// data.dataset = jsonl: the tokenizer its records are tokenized with: data.tokenizer (open_tokenizer), else the folder
// model.init_from names when it holds a tokenizer.json (or vocab.json and merges.txt), else bytes.
std::unique_ptr<data::Tokenizer> jsonl_tokenizer(const Config& cfg);

// data.dataset = jsonl: data.dir holds the token shards of data.jsonl (data/tokenize.h's tokenize_jsonl) once this
// returns on every rank. Rank 0 reuses them when their jsonl_source.json matches (same files, sizes and times, same
// tokenizer and options), else tokenizes again (a data.dir that holds other files is refused, not overwritten), holding
// an flock on DATA_DIR.lock throughout, so jobs sharing a data.dir take turns (a wait for it says so after a second,
// and a stop signal to rank 0 ends it: every rank throws StoppedBeforeTraining); `records_may_be_gone` (an evaluation):
// when a file of data.jsonl is missing, shards written earlier are read with a warning (else an IoError); the
// other ranks wait in a collective each half second, so tokenizing for longer than dist.timeout_s is no hang. When
// rank 0 fails, it throws its error and the others a ConfigError saying so. `log`: rank 0 reports what it did. Other
// data sets: nothing to do. data.dir must be a folder every rank reads (one file system for the job's nodes).
void prepare_data(const Config& cfg, comm::ProcessGroup& pg, bool records_may_be_gone, bool log = true);

// tokenize_jsonl with a progress line every `progress_interval_s` seconds of a long run and a summary after it (when
// `log`): what the trainer's rank 0 and `dptrain tokenize` run. o.progress is set here.
data::JsonlSummary tokenize_jsonl_logged(data::JsonlOptions o, const data::Tokenizer& tokenizer,
                                         double progress_interval_s, bool log = true);

}  // namespace dpt::trainer
