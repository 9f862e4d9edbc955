// launcher/output.cpp: line splitting and prefixing, and the pipe pump behind dprun's "[rank R] " output.
#include "launcher/output.h"

#include <fmt/format.h>
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

void OutputSink::write(std::string_view bytes) {
  if (broken_ || bytes.empty()) return;
  int err = write_fully(fd_, bytes);
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

void RankStream::pump() {
  if (fd_ < 0) return;
  std::array<char, 64 * 1024> buf;
  std::string out;
  for (;;) {
    ssize_t n = ::read(fd_, buf.data(), buf.size());
    if (n > 0) {
      prefixer_.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)), out);
      if (out.size() >= buf.size()) {  // keep memory bounded while a chatty rank fills the pipe
        sink_.write(out);
        out.clear();
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) {
      int err = errno;
      sink_.write(out);
      DPT_THROW(IoError, "reading a rank's output pipe failed: {}", std::strerror(err));
    }
    // n == 0: the writer closed its end (the rank and everything it started are done with it).
    prefixer_.flush(out);
    ::close(fd_);
    fd_ = -1;
    break;
  }
  sink_.write(out);
}

void RankStream::finish() {
  if (fd_ < 0) return;
  pump();
  if (fd_ < 0) return;
  std::string out;
  prefixer_.flush(out);
  sink_.write(out);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace dpt::launcher
