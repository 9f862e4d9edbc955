// trainer/metrics.h: RUN/metrics.jsonl, rank 0's record of a run: one JSON object per line, one per progress
// interval ("kind": "progress") and one per epoch ("kind": "epoch"), appended and flushed as written so that
// `tail -f` and pandas.read_json(lines=True) both work while the run goes on. A resumed run appends to the same
// file; its step numbers continue. Every key is listed in README.md ("Metrics file").
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/config.h"

namespace dpt::trainer {

// Where a run's metrics file goes: log.dir, or else the folder that holds checkpoint.dir ("." when it has none).
std::string metrics_dir(const Config& cfg);

class MetricsLog {
 public:
  // Opens DIR/metrics.jsonl for appending (creating DIR); IoError naming the path when it cannot.
  explicit MetricsLog(const std::string& dir);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` as one line and flushes it; IoError when the write fails (a full disk).
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dpt::trainer
