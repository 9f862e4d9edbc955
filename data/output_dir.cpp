// data/output_dir.cpp: see output_dir.h.
#include "data/output_dir.h"

#include <system_error>

#include "core/check.h"

namespace dpt::data {

namespace fs = std::filesystem;

bool non_empty_directory(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && !fs::is_empty(p, ec);
}

OutputDir::OutputDir(const std::string& dir, bool force) {
  out_ = fs::path(dir).lexically_normal();
  if (out_.filename().empty()) out_ = out_.parent_path();  // "dir/" -> "dir"
  std::error_code ec;
  if (fs::exists(out_, ec) && !fs::is_directory(out_, ec))
    DPT_THROW(ConfigError, "{}: exists and is not a directory", out_.string());
  if (non_empty_directory(out_) && !force)
    DPT_THROW(ConfigError, "{}: not empty: refusing to overwrite it (force replaces it)", out_.string());
  tmp_ = out_.string() + ".tmp";
  try {
    if (!out_.parent_path().empty()) fs::create_directories(out_.parent_path());
    fs::remove_all(tmp_);  // left by an interrupted run
    fs::create_directories(tmp_);
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "{}: {}", tmp_.string(), e.what());
  }
}

OutputDir::~OutputDir() {
  std::error_code ec;
  if (!committed_) fs::remove_all(tmp_, ec);
}

void OutputDir::commit() {
  try {
    if (fs::exists(out_)) {
      const fs::path old = out_.string() + ".old";
      fs::remove_all(old);
      fs::rename(out_, old);
      fs::rename(tmp_, out_);
      fs::remove_all(old);
    } else {
      fs::rename(tmp_, out_);
    }
  } catch (const fs::filesystem_error& e) {
    DPT_THROW(IoError, "moving {} into place: {}", tmp_.string(), e.what());
  }
  committed_ = true;
}

}  // namespace dpt::data
