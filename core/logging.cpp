// core/logging.cpp: spdlog set-up with the rank in every line.
#include "core/logging.h"

#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "core/check.h"

namespace dpt {

spdlog::level::level_enum parse_log_level(const std::string& name) {
  auto lvl = spdlog::level::from_str(name);
  // from_str maps unknown names to "off"; only accept "off" when asked for by name.
  if (lvl == spdlog::level::off && name != "off") {
    DPT_THROW(ConfigError, "unknown log level '{}'; valid: trace, debug, info, warn, error, critical, off", name);
  }
  return lvl;
}

namespace {

// The default logger's sink wrapped: a log line first clears the live line if one is showing (the cursor is
// at its start, so "\033[K" erases it); show() draws the live line, ended by '\r' so the next output
// overwrites it.
class LiveLineSink final : public spdlog::sinks::sink {
 public:
  explicit LiveLineSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mutex_);
    clear();
    inner_->log(msg);
    inner_->flush();
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(mutex_);
    inner_->flush();
  }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }
  void show(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    inner_->flush();
    const std::string line = text + "\033[K\r";
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    showing_ = true;
  }

 private:
  void clear() {
    if (!showing_) return;
    std::fputs("\033[K", stdout);
    std::fflush(stdout);
    showing_ = false;
  }
  std::shared_ptr<spdlog::sinks::sink> inner_;
  std::mutex mutex_;
  bool showing_ = false;
};

std::shared_ptr<LiveLineSink>& live_sink() {
  static std::shared_ptr<LiveLineSink> s;
  return s;
}

}  // namespace

bool live_line_enabled() { return live_sink() != nullptr; }

void show_live_line(const std::string& text) {
  if (auto& s = live_sink()) s->show(text);
}

void init_logging(int rank, int world_size, const std::string& level) {
  set_error_rank(rank);
  const char* live = std::getenv("DPT_LIVE_LINE");
  // Open MPI hands each rank a pseudo-terminal for its output whatever mpirun's own output is (a file, a pipe), so a
  // terminal there says nothing of the user's: under it, no colours and no live line (DPT_LIVE_LINE=1 still asks for
  // one).
  const bool open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  if (open_mpi)
    for (const auto& sink : spdlog::default_logger()->sinks())
      if (auto color = std::dynamic_pointer_cast<spdlog::sinks::stdout_color_sink_mt>(sink))
        color->set_color_mode(spdlog::color_mode::never);
  const bool terminal = ::isatty(STDOUT_FILENO) == 1 && !open_mpi;
  if (rank == 0 && !live_sink() && (live ? std::string(live) == "1" : terminal)) {
    auto logger = spdlog::default_logger();
    if (logger->sinks().size() == 1) {
      live_sink() = std::make_shared<LiveLineSink>(logger->sinks().front());
      logger->sinks().front() = live_sink();
    }
  }
  std::string lvl = level;
  if (lvl.empty()) {
    const char* env = std::getenv("DPT_LOG_LEVEL");
    lvl = env ? env : "info";
  }
  spdlog::set_level(parse_log_level(lvl));
  // Under dprun's output prefixing each line already carries "[rank R] ": don't say it twice.
  const char* prefixed = std::getenv("DPT_RANK_PREFIXED");
  const bool show_rank = world_size > 1 && !(prefixed && std::string(prefixed) == "1");
  if (show_rank) {
    spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}/{}] [%^%l%$] %v", rank, world_size));
  } else {
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  }
}

}  // namespace dpt

namespace dpt {

bool write_reason_once(const std::string& path, const std::string& line) {
  if (path.empty()) return false;
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const std::string text = line + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::close(fd) == 0 && ok;
  // link() fails with EEXIST when another rank got there first: the first complete line stays.
  ok = ok && ::link(tmp.c_str(), path.c_str()) == 0;
  ::unlink(tmp.c_str());
  return ok;
}

namespace {
// exit_with_error and exit_with_note: the first caller ends the process, any later one waits for that.
void enter_exit_once() {
  static std::atomic<bool> dying{false};
  if (dying.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

[[noreturn]] void flush_and_exit(int code) {
  // No spdlog::shutdown(): another thread may be logging; flushing is enough before _Exit.
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}
}  // namespace

void exit_with_error(int code, const std::string& what) {
  enter_exit_once();
  spdlog::error("{}", what);
  if (const char* reason = std::getenv("DPT_REASON_FILE"))
    write_reason_once(reason, fmt::format("rank {}: {}", error_rank(), what.substr(0, what.find('\n'))));
  flush_and_exit(code);
}

void exit_with_note(int code, const std::string& what) {
  enter_exit_once();
  spdlog::warn("{}", what);
  flush_and_exit(code);
}

}  // namespace dpt
