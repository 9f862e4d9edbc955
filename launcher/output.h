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
// complete it or flush() is called. A line ended by '\r' alone (a progress line redrawn in place, as dptrain's
// live line or a tqdm bar) is relayed at once as prefix + text + '\r', so it is redrawn in place on dprun's
// terminal too; "\r\n" ends an ordinary line.
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
// When the last bytes an OutputSink wrote ended with '\r' (a live line is showing, the cursor at its start), the
// next output of dprun (any sink's, or dprun's own note on stderr: on a terminal both go to one screen) first
// clears that line ("\033[K" on the stream that shows it), so a shorter line does not leave its tail behind.
void clear_live_line();

class OutputSink {
 public:
  OutputSink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  void write(std::string_view bytes);

 private:
  int fd_;
  std::string name_;
  bool broken_ = false;
};

// The most one read() of a rank's pipe takes in.
inline constexpr std::size_t kReadChunkBytes = 64 * 1024;

// The read end of one rank's stdout or stderr pipe, relayed to a sink through a LinePrefixer.
class RankStream {
 public:
  RankStream(int fd, std::string prefix, OutputSink& sink);
  ~RankStream();
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  // One non-blocking read() of at most kReadChunkBytes; relays the complete lines. At end of file it flushes
  // the unfinished line and closes the pipe. Bounded on purpose: a rank that writes without pause must not
  // keep the caller's poll loop from its signals and the other ranks. Throws IoError when read() fails.
  void pump();
  // Relays everything the pipe holds at the moment of the call (a rank that has ended: all it wrote), and
  // no more, so a process still writing to the pipe (a leftover child of the rank) cannot keep it busy.
  // Closes the pipe if it sees end of file. Throws IoError.
  void drain();
  // drain(), then flushes the unfinished line and closes the pipe, whether or not the writer is done (used
  // at the end, when a grandchild may still hold the pipe open).
  void finish();

 private:
  // One read() (retried after EINTR), relayed to the sink; returns the number of bytes read, 0 when the pipe
  // is empty for now or at end of file (then the unfinished line is flushed and the pipe closed).
  std::size_t read_once();
  // Writes out_ to the sink and empties it, letting go of its memory when an odd read made it big.
  void relay();

  int fd_;
  LinePrefixer prefixer_;
  OutputSink& sink_;
  // The prefixed lines of one read, kept between reads so a busy pipe does not allocate (and fault in fresh
  // pages) on every read. Always empty between calls.
  std::string out_;
};

// Writes all of `bytes` to `fd`, retrying after EINTR and short writes. Returns 0 or the errno of the failure.
int write_fully(int fd, std::string_view bytes);

}  // namespace dpt::launcher
