// launcher/output.h: relaying the ranks' output: split each pipe's bytes into lines, prefix every line with
// "[rank R] " and write whole lines, so lines from different ranks never interleave inside a line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dpt::launcher {

// A line longer than this is cut and relayed in pieces, so a rank writing without newlines (a progress bar
// using '\r') cannot grow dprun's memory without bound.
inline constexpr std::size_t kMaxLineBytes = 1 << 20;

// Splits a byte stream into lines and prefixes each; holds back an unfinished last line until more bytes
// complete it or flush() is called.
class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix, std::size_t max_line_bytes = kMaxLineBytes);

  // Appends every line that `data` completes to `out`, each as prefix + line + '\n'.
  void feed(std::string_view data, std::string& out);
  // Appends the unfinished last line, if any, as prefix + line + '\n'.
  void flush(std::string& out);
  bool has_pending() const { return !pending_.empty(); }

 private:
  void emit(std::string_view line, std::string& out) const;

  std::string prefix_;
  std::size_t max_line_bytes_;
  std::string pending_;  // bytes after the last '\n' seen
};

// One of dprun's own output streams (stdout or stderr). A write error (EPIPE when the reader went away)
// does not stop the job: the stream is marked broken, a note goes to stderr once, and later output is dropped.
class OutputSink {
 public:
  OutputSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  void write(std::string_view bytes);

 private:
  int fd_;
  std::string name_;
  bool broken_ = false;
};

// The read end of one rank's stdout or stderr pipe, relayed to a sink through a LinePrefixer.
class RankStream {
 public:
  RankStream(int fd, std::string prefix, OutputSink& sink);
  ~RankStream();
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  // Reads whatever the pipe holds now (non-blocking) and relays the complete lines. At end of file it flushes
  // the unfinished line and closes the pipe. Throws IoError when read() fails.
  void pump();
  // Flushes the unfinished line and closes the pipe, whether or not the writer is done (used at the end,
  // when a grandchild may still hold the pipe open).
  void finish();

 private:
  int fd_;
  LinePrefixer prefixer_;
  OutputSink& sink_;
};

// Writes all of `bytes` to `fd`, retrying after EINTR and short writes. Returns 0 or the errno of the failure.
int write_fully(int fd, std::string_view bytes);

}  // namespace dpt::launcher
