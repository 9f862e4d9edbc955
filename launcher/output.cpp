// launcher/output.cpp: line splitting and prefixing, and the pipe pump behind dprun's "[rank R] " output.
#include "launcher/output.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace dpt::launcher {

LinePrefixer::LinePrefixer(std::string prefix, std::size_t max_line_bytes)
    : prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes) {
  DPT_CHECK_GT(max_line_bytes_, std::size_t{0});
}

void LinePrefixer::emit(std::string_view line, std::string& out) const {
  out.append(prefix_);
  out.append(line);
  out.push_back('\n');
}

void LinePrefixer::feed(std::string_view data, std::string& out) {
  while (!data.empty()) {
    std::size_t nl = data.find('\n');
    // A '\r' before the next '\n' and not part of "\r\n": a live line, relayed now, ended by '\r'.
    if (const std::size_t cr = data.substr(0, nl).find('\r');
        cr != std::string_view::npos && cr + 1 != nl && cr < max_line_bytes_ - pending_.size()) {
      out.append(prefix_);
      out.append(pending_);
      out.append(data.substr(0, cr));
      out.push_back('\r');
      pending_.clear();
      data.remove_prefix(cr + 1);
      continue;
    }
    std::size_t line_len = nl == std::string_view::npos ? data.size() : nl;
    std::size_t room = max_line_bytes_ - pending_.size();
    if (line_len <= room && nl != std::string_view::npos) {  // a whole line, within the cap
      if (pending_.empty()) {
        emit(data.substr(0, nl), out);
      } else {
        pending_.append(data.substr(0, nl));
        emit(pending_, out);
        pending_.clear();
      }
      data.remove_prefix(nl + 1);
      continue;
    }
    // No end of line in reach: keep the bytes, cutting the line when it reaches the cap.
    std::size_t take = std::min(line_len, room);
    pending_.append(data.substr(0, take));
    data.remove_prefix(take);
    if (pending_.size() == max_line_bytes_) {
      emit(pending_, out);
      pending_.clear();
    }
  }
}

void LinePrefixer::flush(std::string& out) {
  if (pending_.empty()) return;
  emit(pending_, out);
  pending_.clear();
}

int write_fully(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

namespace {
int live_line_fd = -1;  // the stream showing a live line (dprun's output loop is single-threaded), or -1
}  // namespace

void clear_live_line() {
  if (live_line_fd < 0) return;
  (void)write_fully(live_line_fd, "\033[K");
  live_line_fd = -1;
}

void OutputSink::write(std::string_view bytes) {
  if (broken_ || bytes.empty()) return;
  clear_live_line();
  const int err = write_fully(fd_, bytes);
  if (err == 0 && bytes.back() == '\r') live_line_fd = fd_;
  if (err == 0) return;
  broken_ = true;
  if (fd_ != STDERR_FILENO) {
    // Best effort: stderr may be gone too, and there is nobody else to tell.
    (void)write_fully(STDERR_FILENO, fmt::format("dprun: cannot write to {} ({}); dropping the ranks' output to it "
                                                 "from now on, the job goes on\n",
                                                 name_, std::strerror(err)));
  }
}

RankStream::RankStream(int fd, std::string prefix, OutputSink& sink)
    : fd_(fd), prefixer_(std::move(prefix)), sink_(sink) {}

RankStream::~RankStream() {
  if (fd_ >= 0) ::close(fd_);
}

void RankStream::relay() {
  sink_.write(out_);
  out_.clear();
  // Usually about 1.5 reads' worth; a read of many short lines can make it ten times that.
  if (out_.capacity() > 4 * kReadChunkBytes) std::string().swap(out_);
}

std::size_t RankStream::read_once() {
  std::array<char, kReadChunkBytes> buf;
  for (;;) {
    ssize_t n = ::read(fd_, buf.data(), buf.size());
    if (n > 0) {
      prefixer_.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)), out_);
      relay();
      return static_cast<std::size_t>(n);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0) DPT_THROW(IoError, "reading a rank's output pipe failed: {}", std::strerror(errno));
    // n == 0: the writer closed its end (the rank and everything it started are done with it).
    prefixer_.flush(out_);
    relay();
    ::close(fd_);
    fd_ = -1;
    return 0;
  }
}

void RankStream::pump() {
  if (fd_ >= 0) (void)read_once();
}

void RankStream::drain() {
  if (fd_ < 0) return;
  int held = 0;
  if (::ioctl(fd_, FIONREAD, &held) != 0) {
    DPT_THROW(IoError, "ioctl(FIONREAD) on a rank's output pipe failed: {}", std::strerror(errno));
  }
  // At least one read, so that an empty pipe whose writer is gone is seen at end of file and closed.
  for (std::size_t left = static_cast<std::size_t>(std::max(held, 0));;) {
    std::size_t n = read_once();
    if (n == 0 || n >= left) break;
    left -= n;
  }
}

void RankStream::finish() {
  drain();
  if (fd_ < 0) return;
  prefixer_.flush(out_);
  relay();
  ::close(fd_);
  fd_ = -1;
}

}  // namespace dpt::launcher
