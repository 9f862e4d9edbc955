// trainer/report/metrics.cpp: the metrics file (trainer/report/metrics.h).
#include "trainer/report/metrics.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "trainer/dir_lock.h"

namespace dpt::trainer {

std::string metrics_dir(const Config& cfg) {
  if (!cfg.log.dir.empty()) return cfg.log.dir;
  std::filesystem::path dir = std::filesystem::path(cfg.checkpoint.dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "runs/x/checkpoints/": the folder is still "checkpoints"
  const std::filesystem::path parent = dir.parent_path();
  return parent.empty() ? "." : parent.string();
}

void check_metrics_dir(const Config& cfg) {
  namespace fs = std::filesystem;
  const std::string dir = metrics_dir(cfg);
  const std::string what = cfg.log.dir.empty()
                               ? fmt::format("{} (the folder of checkpoint.dir, where metrics.jsonl goes; log.dir "
                                             "names another)", dir)
                               : fmt::format("log.dir = {}", dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    DPT_THROW(ConfigError, "{} is not a directory", what);
  fs::create_directories(dir, ec);
  if (ec) DPT_THROW(ConfigError, "{}: cannot create it: {}", what, ec.message());
  const fs::path probe = fs::path(dir) / fmt::format(".metrics-probe-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(ConfigError, "{}: cannot write in it: {}", what, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

namespace {

// Keeps the lines of `path` whose record's step is at most `last_step` (lines that do not parse are kept: they
// are not ours to judge), less an unfinished last line (no newline: the earlier run stopped while writing it, and
// this run's first record would be appended to it, both lost). Rewritten through PATH.tmp and a rename, so a crash
// leaves the old file or the new one.
void drop_records_after(const std::string& path, int64_t last_step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;  // no file yet
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::string kept;
  bool dropped = false;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      spdlog::warn("metrics: {} ends in an unfinished line ({} bytes: the run that wrote it stopped while writing "
                   "it); dropped", path, text.size() - begin);
      dropped = true;
      break;
    }
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_object() && r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() > last_step) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);  // a full disk: the file stays whole, and no empty .tmp beside it
      DPT_THROW(IoError, "cannot write {}: {}", tmp, std::strerror(err));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) DPT_THROW(IoError, "cannot replace the metrics file {}: {}", path, ec.message());
}

// A fresh run's: an earlier run's non-empty file at `path` renamed to path.N, the first N free; that name, or empty.
std::string keep_earlier_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) == 0 || ec) return {};
  for (int n = 1;; ++n) {
    const std::string to = fmt::format("{}.{}", path, n);
    if (fs::exists(fs::symlink_status(to, ec))) continue;
    fs::rename(path, to, ec);
    if (ec) DPT_THROW(IoError, "cannot keep the earlier metrics file {} as {}: {}", path, to, ec.message());
    return to;
  }
}

constexpr const char* kLockFile = ".metrics.lock";

// Thrown when another live run holds DIR/.metrics.lock: for_run writes elsewhere, or says so.
struct MetricsFolderTaken : ConfigError {
  using ConfigError::ConfigError;
};

std::string absolute_dir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(dir, ec);
  return (ec ? std::filesystem::path(dir) : p).lexically_normal().string();
}

}  // namespace

MetricsLog::MetricsLog(const std::string& dir, int64_t start_step, bool tensorboard, const std::string& checkpoint_dir,
                       const std::string& job)
    : dir_(dir), path_((std::filesystem::path(dir) / "metrics.jsonl").string()), start_step_(start_step),
      with_tensorboard_(tensorboard) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) DPT_THROW(IoError, "cannot create log.dir {} for the metrics file: {}", dir, ec.message());
  if (checkpoint_dir.empty()) return;
  checkpoint_dir_ = absolute_dir(checkpoint_dir);
  const std::string lock = (std::filesystem::path(dir) / kLockFile).string();
  const LockTry t = try_lock_file(lock, job, checkpoint_dir_);
  const LockHolder& before = t.before;
  previous_writer_ = before.note;
  if (!t.taken) {
    lock_fd_ = t.fd;
    return;
  }
  if (!job.empty() && before.job == job) {
    spdlog::warn("{} is still held by an earlier attempt of this job (pid {} on {}), which has not exited yet; this "
                 "attempt goes on without it", lock, before.pid, before.host);
    return;
  }
  DPT_THROW(MetricsFolderTaken, "{} is being written by another run (pid {} on {}{}, checkpoint.dir {})", path_,
            before.pid.empty() ? "?" : before.pid, before.host.empty() ? "?" : before.host,
            before.job.empty() ? "" : ", job " + before.job, before.note.empty() ? "unknown" : before.note);
}

std::unique_ptr<MetricsLog> MetricsLog::for_run(const Config& cfg, int64_t start_step, const std::string& job) {
  const std::string dir = metrics_dir(cfg);
  try {
    return std::make_unique<MetricsLog>(dir, start_step, cfg.log.tensorboard, cfg.checkpoint.dir, job);
  } catch (const MetricsFolderTaken& e) {
    if (!cfg.log.dir.empty())
      DPT_THROW(ConfigError, "log.dir = {}: {}: two runs in one metrics file mix their records. Give this run its "
                "own log.dir, or stop the other run first", cfg.log.dir, e.what());
    spdlog::warn("metrics: {}, which shares this folder (sibling checkpoint.dirs); this run's records go to {} "
                 "instead (log.dir chooses the folder)", e.what(), (std::filesystem::path(cfg.checkpoint.dir) /
                                                                      "metrics.jsonl").string());
    return std::make_unique<MetricsLog>(cfg.checkpoint.dir, start_step, cfg.log.tensorboard, cfg.checkpoint.dir,
                                        job);
  }
}

// At the first record: a run that fails before it (bad data at start-up) leaves an earlier run's file as it was.
void MetricsLog::open() {
  if (start_step_ > 0 && !previous_writer_.empty() && previous_writer_ != checkpoint_dir_) {
    // The folder's file is another run's (a sibling checkpoint.dir's, written since this run's last record): its
    // records after start_step are not ours to drop.
    if (const std::string kept = keep_earlier_file(path_); !kept.empty())
      spdlog::warn("metrics: {} was last written by the run of checkpoint.dir {}, not this one's ({}): kept as {}; "
                   "this run's records go on in a new {}", path_, previous_writer_, checkpoint_dir_, kept, path_);
  } else if (start_step_ > 0) {
    drop_records_after(path_, start_step_);
  } else if (const std::string kept = keep_earlier_file(path_); !kept.empty()) {
    spdlog::info("metrics: this run starts afresh; the earlier run's {} is kept as {}", path_, kept);
  }
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) DPT_THROW(IoError, "cannot open the metrics file {}: {}", path_, std::strerror(errno));
  if (with_tensorboard_) tensorboard_ = std::make_unique<TensorBoardWriter>(dir_, start_step_);
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock; the file keeps naming the last writer
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_) open();
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    DPT_THROW(IoError, "cannot write the metrics file {}: {}", path_, std::strerror(errno));
  if (tensorboard_) tensorboard_->write_record(record);
}

}  // namespace dpt::trainer
