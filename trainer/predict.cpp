// trainer/predict.cpp: what `dptrain predict`'s tools share (trainer/predict.h).
#include "trainer/predict.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/logging.h"
#include "core/tensor.h"
#include "data/output_dir.h"
#include "trainer/report/run_report.h"

namespace dpt::trainer {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string valid_utf8(const std::string& s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
  return nlohmann::json::parse(json_string(s)).get<std::string>();  // json_string's replacement, byte for byte
}

std::string csv_field(const std::string& raw) {
  const std::string s = valid_utf8(raw);
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::vector<std::string> read_lines(const std::string& path, bool skip_comments) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DPT_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (skip_comments && line.starts_with('#')) continue;
    lines.push_back(std::move(line));
  }
  if (in.bad()) DPT_THROW(IoError, "{}: read failed: {}", path, std::strerror(errno));
  return lines;
}

PredictFormat parse_predict_format(const std::string& name) {
  if (name == "jsonl") return PredictFormat::jsonl;
  if (name == "csv") return PredictFormat::csv;
  DPT_THROW(ConfigError, "predict: --format must be jsonl or csv, got '{}'", name);
}

ProgressLine::ProgressLine(bool lead, size_t total, int world, double interval_s, std::string unit)
    : lead_(lead), total_(total), world_(world), interval_s_(interval_s), unit_(std::move(unit)) {}

void ProgressLine::update(size_t done_here, size_t share) {
  if (!lead_ || seconds_since(last_) < interval_s_) return;
  last_ = Clock::now();
  const double elapsed = seconds_since(start_);
  const double rate = static_cast<double>(done_here) * world_ / elapsed;
  const double eta = rate > 0 ? static_cast<double>(share - done_here) * world_ / rate : -1;
  const size_t done = std::min(total_, done_here * static_cast<size_t>(world_));
  const std::string line = fmt::format("predict: ~{}/{} {} ({:.0f}%) {:.1f} {}/s eta {}", done, total_, unit_,
                                       100.0 * static_cast<double>(done) / static_cast<double>(total_), rate, unit_,
                                       format_duration(eta));
  if (live_line_enabled())
    show_live_line(line);
  else
    spdlog::info("{}", line);
}

// ---- gathering and writing -------------------------------------------------------------------------------------

std::string gather_text(const std::string& mine, comm::ProcessGroup& pg) {
  const int world = pg.size();
  Tensor length = Tensor::zeros({1}, DType::I64);
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  Tensor lengths = Tensor::zeros({world}, DType::I64);
  pg.allgather(length, lengths, {.what = "predict: output sizes"})->wait();
  int64_t longest = 0;
  for (int r = 0; r < world; ++r) longest = std::max(longest, lengths.data<int64_t>()[r]);
  if (longest == 0) return "";
  // Every rank's text padded to the longest: one allgather (rank 0 alone needs it, but the backends have no
  // gather; the output is small next to the images read).
  Tensor buf = Tensor::zeros({longest}, DType::U8);
  std::memcpy(buf.data<uint8_t>(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({longest * world}, DType::U8);
  pg.allgather(buf, all, {.what = "predict: output lines"})->wait();
  if (pg.rank() != 0) return "";
  std::string text;
  for (int r = 0; r < world; ++r)
    text.append(reinterpret_cast<const char*>(all.data<uint8_t>()) + r * longest,
                static_cast<size_t>(lengths.data<int64_t>()[r]));
  return text;
}

void check_output_path(const std::string& path, const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    DPT_THROW(ConfigError, "--out {} is a directory: give the path of the file to write", path);
  data::check_output_apart(path, {input}, data::FolderRead::named_files);  // before path.tmp is made and removed
  if (const fs::path folder = fs::path(path).parent_path(); !folder.empty()) {
    fs::create_directories(folder, ec);
    if (ec) DPT_THROW(ConfigError, "--out {}: cannot create its folder {}: {}", path, folder.string(), ec.message());
  }
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(ConfigError, "--out {}: cannot create {}: {}", path, tmp, std::strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DPT_THROW(IoError, "{}: cannot create: {}", tmp, std::strerror(errno));
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      DPT_THROW(IoError, "{}: write failed: {}", tmp, std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPT_THROW(IoError, "{}: fsync failed: {}", tmp, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    DPT_THROW(IoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
}

std::string gather_in_order(const std::vector<std::pair<size_t, std::string>>& mine, size_t n, comm::ProcessGroup& pg) {
  // Each line as "INDEX LENGTH\n" and its bytes (a csv line may hold line breaks).
  std::string packed;
  for (const auto& [index, line] : mine) packed += fmt::format("{} {}\n", index, line.size()) + line;
  const std::string all = gather_text(packed, pg);
  if (pg.rank() != 0) return "";
  std::vector<std::string> lines(n);
  std::vector<bool> seen(n, false);
  for (size_t at = 0; at < all.size();) {
    const size_t eol = all.find('\n', at);
    DPT_CHECK(eol != std::string::npos, "predict: a gathered line without its header at byte {}", at);
    size_t index = 0, length = 0;
    DPT_CHECK(std::sscanf(all.c_str() + at, "%zu %zu", &index, &length) == 2 && index < n && !seen[index] &&
                  eol + 1 + length <= all.size(),
              "predict: a bad gathered line header at byte {}", at);
    seen[index] = true;
    lines[index] = all.substr(eol + 1, length);
    at = eol + 1 + length;
  }
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    DPT_CHECK(seen[i], "predict: no rank gave line {} of {}", i, n);
    text += lines[i];
  }
  return text;
}

}  // namespace dpt::trainer
