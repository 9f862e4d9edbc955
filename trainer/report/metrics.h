// trainer/report/metrics.h: RUN/metrics.jsonl, rank 0's record of a run: one JSON object per line, one per progress
// interval ("kind": "progress") and one per epoch ("kind": "epoch"), appended and flushed as written so that
// `tail -f` and pandas.read_json(lines=True) both work while the run goes on. A resumed run appends to the same
// file; its step numbers continue. Records of steps after the one a run starts from (those a crashed or preempted
// run wrote after its last checkpoint) are dropped when the run writes its first record, so each step appears once,
// and so is an unfinished last line (a run killed while writing it),
// as the curves will show it; a run that starts afresh keeps an earlier run's file as metrics.jsonl.N (the first
// free N) then and begins a new one. Nothing is touched before that first record: a run that fails at start-up
// leaves the file as it was (sibling checkpoint.dirs share it). Every key is listed in docs/watching.md ("Metrics
// file").
// Sibling checkpoint.dirs share a folder, so the writer holds DIR/.metrics.lock (flock) for the run, naming itself
// (pid, host, job, checkpoint.dir): a second live run does not rename or append to the first's file but writes in
// its own checkpoint.dir (MetricsLog::for_run), and a resumed run whose folder's file was last written by another
// run's checkpoint.dir keeps that file as metrics.jsonl.N instead of dropping its records.
// With log.tensorboard the same records also go to TensorBoard event files in the same folder (trainer/report/tensorboard.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/config.h"
#include "trainer/report/tensorboard.h"

namespace dpt::trainer {

// Where a run's metrics file goes: log.dir, or else the folder that holds checkpoint.dir ("." when it has none).
std::string metrics_dir(const Config& cfg);

// At start-up (rank 0), before the data is read: metrics_dir(cfg) is a folder, created if need be, in which a file
// can be created (one is, and removed). ConfigError saying why not, so that a read-only one is not found at the first
// record, after the data has loaded.
void check_metrics_dir(const Config& cfg);

class MetricsLog {
 public:
  // DIR/metrics.jsonl, for the records of a run that starts after step `start_step` (the checkpoint's; 0 for a
  // fresh run). Creates DIR now (IoError naming it when it cannot); the file itself is opened by the first write().
  // With `tensorboard`, the first write() also starts a TensorBoard event file in DIR (TensorBoardWriter, which hides
  // from TensorBoard the points after start_step that earlier files hold).
  // `checkpoint_dir` and `job` name the writer in DIR/.metrics.lock (taken now when free; empty: no lock taken, as
  // the unit tests need none). Another live run holding it is a ConfigError (an earlier attempt of the same job: a
  // warning, and no lock).
  MetricsLog(const std::string& dir, int64_t start_step, bool tensorboard, const std::string& checkpoint_dir = "",
             const std::string& job = "");
  // Rank 0's for `cfg`: in metrics_dir(cfg); when another live run holds that folder's lock and log.dir did not name
  // it (sibling checkpoint.dirs, a sweep started together), in checkpoint.dir instead, with a warning saying why.
  static std::unique_ptr<MetricsLog> for_run(const Config& cfg, int64_t start_step, const std::string& job);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` as one line and flushes it, and writes it to the event file when there is one; IoError when a
  // write fails (a full disk). The first one opens the file: a resumed run's drops the records of steps after
  // start_step; a fresh run's renames an earlier file to metrics.jsonl.N (and says so) and starts a new one.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  void open();
  std::string dir_, path_;
  std::string checkpoint_dir_;   // the writer's, absolute ("" without a lock)
  std::string previous_writer_;  // the checkpoint.dir the lock file named before this run took it ("": unknown)
  int lock_fd_ = -1;
  int64_t start_step_;
  bool with_tensorboard_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // null without log.tensorboard
};

}  // namespace dpt::trainer
