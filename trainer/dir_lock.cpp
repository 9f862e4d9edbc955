// trainer/dir_lock.cpp: see dir_lock.h.
#include "trainer/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace dpt::trainer {
namespace {

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 && name[0] ? name : "unknown";
}

// The holder's "pid host job" line, as read from the lock file (empty when unreadable).
std::string read_holder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& job) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (fs::path(dir) / ".lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::debug("checkpoint.dir lock {}: not taken: {}", path, std::strerror(errno));
    return;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd);
    ::close(fd);
    if (err != EWOULDBLOCK) {  // ENOLCK, EOPNOTSUPP, ...: a file system without flock
      spdlog::debug("checkpoint.dir lock {}: not taken: {}", path, std::strerror(err));
      return;
    }
    std::istringstream in(holder);
    std::string pid, host, holder_job;
    in >> pid >> host >> holder_job;
    if (!job.empty() && holder_job == job) {
      spdlog::warn("{} is still held by an earlier attempt of this job (pid {} on {}), which has not exited yet; "
                   "this attempt goes on without it", path, pid, host);
      return;
    }
    DPT_THROW(ConfigError, "checkpoint.dir {} is in use by another run ({}): two runs in one checkpoint directory "
              "overwrite and resume each other's checkpoints. Give this run its own checkpoint.dir, or stop the other "
              "run first", dir, pid.empty() ? std::string("its lock file names no process")
                                             : fmt::format("pid {} on {}{}", pid, host,
                                                           holder_job.empty() ? "" : ", job " + holder_job));
  }
  const std::string line = fmt::format("{} {} {}\n", ::getpid(), host_name(), job);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    spdlog::debug("checkpoint.dir lock {}: could not write the holder: {}", path, std::strerror(errno));
  fd_ = fd;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace dpt::trainer
