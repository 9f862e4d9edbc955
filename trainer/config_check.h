// trainer/config_check.h: check_same_config: every rank of a job trains the same effective config with the same
// dptrain build. A rank started with another override, another config file or another binary is caught at start-up,
// before the first step, with the same message on every rank, instead of silently training something else or
// hanging in a collective of another shape.
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "trainer/config.h"
#include "trainer/datasets.h"

namespace dpt::trainer {

// "dptrain 0.1.0 built <id>": the project's version and the source it was built from (git describe --always
// --dirty when the build was configured; "unknown" outside a git checkout).
std::string binary_version();

// Collective: every rank calls it, right after init_process_group. Each rank's 64-bit hashes of to_toml(cfg) and
// of binary_version() meet in one all-reduce (an int64 tensor of 2 x world size, each rank filling its own two
// slots); when they all equal rank 0's it returns. Otherwise rank 0's and the first differing ranks' texts are
// broadcast (a length, then the bytes), and every rank throws the same ConfigError naming the ranks that differ,
// the builds, and each differing key with both values:
//   rank 1 was started with a config that differs from rank 0's: train.lr = 0.2 (rank 0: 0.1)
// Host tensors only (int64 all-reduce, uint8 broadcast): every backend takes those (nccl through the device).
void check_same_config(const Config& cfg, comm::ProcessGroup& pg);

// Collective: every rank calls it once its data sets are open (training, eval). The config being the same does not
// make the data the same: a node with a stale or partial copy of data.dir (or a relative data.dir read from another
// working directory) would shard another example count than its peers, so that the ranks silently train other
// examples (some twice, some never) or, with another step count per epoch, wait in collectives of other shapes until
// dist.timeout_s. The ranks' train and test example counts and a hash of the class names meet in one all-reduce as
// above; on a difference every rank throws the same ConfigError, e.g.
//   rank 1 reads other data than rank 0 from data.dir 'imgs': 169 train examples (rank 0: 200)
void check_same_data(const Datasets& ds, const DataConfig& d, comm::ProcessGroup& pg);

// The same for predict's inputs, which every rank lists itself: their count and a hash of them (the image paths, the
// prompts) against rank 0's, e.g. "rank 1 reads other data than rank 0 from --input imgs: 19 images (rank 0: 20),
// other images". Else each rank's batches were cut from its own list, and the output mixed the two silently.
void check_same_inputs(const std::vector<std::string>& items, const std::string& noun, const std::string& source,
                       comm::ProcessGroup& pg);

// "train.lr = 0.2 (the checkpoint: 0.1)": each key whose value differs between two to_toml texts, `now`'s then
// `before`'s, which `before_name` names. In `now`'s order, then the keys only `before` has ("... not set (NAME: 3)").
// The rank check below says these, and a resume from a checkpoint of another config.
std::vector<std::string> config_changes(const std::string& now, const std::string& before,
                                        const std::string& before_name);

namespace detail {

// check_same_data on given figures: each rank's `value` of each figure, in the same order on every rank; the message
// writes a figure whose `shown` is false (a hash) as "other NAME", the others as "VALUE NAME (rank 0: VALUE)".
struct Figure {
  std::string name;  // "train examples"
  int64_t value = 0;
  bool shown = true;
};
void check_same_figures(const std::vector<Figure>& figures, const std::string& source, comm::ProcessGroup& pg);

// check_same_config on given texts: what it runs on to_toml(cfg) and binary_version() (for the tests).
void check_same_texts(const std::string& config_toml, const std::string& version, comm::ProcessGroup& pg);

// "train.lr = 0.2 (rank 0: 0.1)" for each key whose value differs between two to_toml texts: theirs, then rank
// `base`'s. In theirs' order, then the keys only rank `base` has ("... (rank 0: 3)" with "not set" for theirs).
std::vector<std::string> config_differences(const std::string& theirs, const std::string& base_toml, int base = 0);

}  // namespace detail

}  // namespace dpt::trainer
