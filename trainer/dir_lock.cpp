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

LockHolder read_holder(int fd) {
  char buf[4096] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::istringstream in(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0));
  LockHolder h;
  std::string first;
  std::getline(in, first);
  std::getline(in, h.note);
  std::istringstream(first) >> h.pid >> h.host >> h.job;
  return h;
}

}  // namespace

LockTry try_lock_file(const std::string& path, const std::string& job, const std::string& note) {
  LockTry t;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::debug("lock {}: not taken: {}", path, std::strerror(errno));
    return t;
  }
  t.before = read_holder(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK)
      t.taken = true;
    else  // ENOLCK, EOPNOTSUPP, ...: a file system without flock
      spdlog::debug("lock {}: not taken: {}", path, std::strerror(err));
    return t;
  }
  const std::string line = fmt::format("{} {} {}\n{}{}", ::getpid(), host_name(), job, note, note.empty() ? "" : "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    spdlog::debug("lock {}: could not write the holder: {}", path, std::strerror(errno));
  t.fd = fd;
  return t;
}

DirLock::DirLock(const std::string& dir, const std::string& job) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (fs::path(dir) / ".lock").string();
  const LockTry t = try_lock_file(path, job);
  if (!t.taken) {
    fd_ = t.fd;
    return;
  }
  const LockHolder& h = t.before;
  if (!job.empty() && h.job == job) {
    spdlog::warn("{} is still held by an earlier attempt of this job (pid {} on {}), which has not exited yet; "
                 "this attempt goes on without it", path, h.pid, h.host);
    return;
  }
  DPT_THROW(ConfigError, "checkpoint.dir {} is in use by another run ({}): two runs in one checkpoint directory "
            "overwrite and resume each other's checkpoints. Give this run its own checkpoint.dir, or stop the other "
            "run first", dir, h.pid.empty() ? std::string("its lock file names no process")
                                             : fmt::format("pid {} on {}{}", h.pid, h.host,
                                                           h.job.empty() ? "" : ", job " + h.job));
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace dpt::trainer
