// trainer/metrics.cpp: the metrics file (trainer/metrics.h).
#include "trainer/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace dpt::trainer {

std::string metrics_dir(const Config& cfg) {
  if (!cfg.log.dir.empty()) return cfg.log.dir;
  const std::filesystem::path parent = std::filesystem::path(cfg.checkpoint.dir).lexically_normal().parent_path();
  return parent.empty() ? "." : parent.string();
}

MetricsLog::MetricsLog(const std::string& dir) : path_((std::filesystem::path(dir) / "metrics.jsonl").string()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) DPT_THROW(IoError, "cannot create log.dir {} for the metrics file: {}", dir, ec.message());
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) DPT_THROW(IoError, "cannot open the metrics file {}: {}", path_, std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    DPT_THROW(IoError, "cannot write the metrics file {}: {}", path_, std::strerror(errno));
}

}  // namespace dpt::trainer
