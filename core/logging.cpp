// core/logging.cpp: spdlog set-up with the rank in every line.
#include "core/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

void init_logging(int rank, int world_size, const std::string& level) {
  set_error_rank(rank);
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

void exit_with_error(int code, const std::string& what) {
  static std::atomic<bool> dying{false};
  if (dying.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the first caller ends the process
  }
  // No spdlog::shutdown(): another thread may be logging; flushing is enough before _Exit.
  spdlog::error("{}", what);
  if (const char* reason = std::getenv("DPT_REASON_FILE"))
    write_reason_once(reason, fmt::format("rank {}: {}", error_rank(), what.substr(0, what.find('\n'))));
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace dpt
