// tests/unit/launcher/test_output.cpp: the line prefixer behind "[rank R] " output: whole lines only,
// unfinished lines held back until completed or flushed, over-long lines cut; the pipe reading behind it:
// bounded reads, so a flooding rank cannot hold dprun's loop.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "launcher/output.h"

using namespace dpt::launcher;

TEST_CASE("LinePrefixer prefixes complete lines and holds back the rest", "[launcher]") {
  LinePrefixer p("[rank 2] ");
  std::string out;
  p.feed("", out);
  REQUIRE(out.empty());
  p.feed("hello\nwor", out);
  REQUIRE(out == "[rank 2] hello\n");
  REQUIRE(p.has_pending());
  out.clear();
  p.feed("ld", out);
  REQUIRE(out.empty());  // no newline yet: nothing printed, nothing split
  p.feed("\n\nlast", out);
  REQUIRE(out == "[rank 2] world\n[rank 2] \n");  // an empty line stays a line
  out.clear();
  p.flush(out);
  REQUIRE(out == "[rank 2] last\n");
  REQUIRE_FALSE(p.has_pending());
  out.clear();
  p.flush(out);  // nothing pending: nothing printed
  REQUIRE(out.empty());
}

TEST_CASE("LinePrefixer byte by byte gives the same lines", "[launcher]") {
  const std::string text = "a\nbb\n\nccc\nd";
  LinePrefixer whole("> "), bytes("> ");
  std::string a, b;
  whole.feed(text, a);
  whole.flush(a);
  for (char c : text) bytes.feed(std::string_view(&c, 1), b);
  bytes.flush(b);
  REQUIRE(a == "> a\n> bb\n> \n> ccc\n> d\n");
  REQUIRE(b == a);
}

TEST_CASE("LinePrefixer cuts lines longer than the cap", "[launcher]") {
  LinePrefixer p("> ", 4);
  std::string out;
  p.feed("abcdefghij\nxy", out);
  REQUIRE(out == "> abcd\n> efgh\n> ij\n");
  out.clear();
  p.feed("zw", out);  // exactly the cap: cut
  REQUIRE(out == "> xyzw\n");
  REQUIRE_FALSE(p.has_pending());
}

TEST_CASE("LinePrefixer relays a line ended by a lone carriage return at once, for a live line", "[launcher]") {
  LinePrefixer p("[rank 0] ");
  std::string out;
  p.feed("epoch 1 12%", out);
  REQUIRE(out.empty());
  p.feed(" eta 3m\r", out);  // completed by '\r': relayed now, still ended by '\r' (drawn in place)
  REQUIRE(out == "[rank 0] epoch 1 12% eta 3m\r");
  out.clear();
  p.feed("epoch 1 50%\rdone\n", out);
  REQUIRE(out == "[rank 0] epoch 1 50%\r[rank 0] done\n");
  out.clear();
  p.feed("windows\r\n", out);  // "\r\n" ends an ordinary line, as before
  REQUIRE(out == "[rank 0] windows\r\n");
  REQUIRE_FALSE(p.has_pending());
}

TEST_CASE("OutputSink clears a live line before the next output", "[launcher]") {
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  OutputSink sink(::fileno(file), "test output");
  sink.write("a\n");
  sink.write("[rank 0] 10%\r");
  sink.write("[rank 0] 20%\r");
  sink.write("[rank 1] warning\n");
  sink.write("b\n");
  char buf[256] = {};
  REQUIRE(::pread(::fileno(file), buf, sizeof buf - 1, 0) > 0);
  REQUIRE(std::string(buf) == "a\n[rank 0] 10%\r\033[K[rank 0] 20%\r\033[K[rank 1] warning\nb\n");
  std::fclose(file);

  // Another stream's output (stderr on the same terminal) clears the line on the stream that shows it.
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  OutputSink out_sink(::fileno(out), "out"), err_sink(::fileno(err), "err");
  out_sink.write("[rank 0] 30%\r");
  err_sink.write("[rank 1] a warning\n");
  clear_live_line();  // nothing showing any more: writes nothing
  char obuf[64] = {}, ebuf[64] = {};
  REQUIRE(::pread(::fileno(out), obuf, sizeof obuf - 1, 0) > 0);
  REQUIRE(::pread(::fileno(err), ebuf, sizeof ebuf - 1, 0) > 0);
  REQUIRE(std::string(obuf) == "[rank 0] 30%\r\033[K");
  REQUIRE(std::string(ebuf) == "[rank 1] a warning\n");
  std::fclose(out);
  std::fclose(err);
}

TEST_CASE("write_fully writes everything and reports errno", "[launcher]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  REQUIRE(write_fully(fds[1], "some bytes") == 0);
  char buf[32] = {};
  REQUIRE(::read(fds[0], buf, sizeof buf) == 10);
  REQUIRE(std::string(buf) == "some bytes");
  ::close(fds[0]);
  ::close(fds[1]);
  REQUIRE(write_fully(fds[1], "x") == EBADF);
}

namespace {
// A pipe whose read end is non-blocking (as dprun's are) and an OutputSink writing to a temporary file.
struct StreamRig {
  int pipe_fds[2] = {-1, -1};
  std::FILE* file = std::tmpfile();
  OutputSink sink{::fileno(file), "test output"};

  StreamRig() {
    REQUIRE(file != nullptr);
    REQUIRE(::pipe(pipe_fds) == 0);
    REQUIRE(::fcntl(pipe_fds[0], F_SETFL, ::fcntl(pipe_fds[0], F_GETFL) | O_NONBLOCK) == 0);
  }
  ~StreamRig() {
    close_writer();
    if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
    std::fclose(file);
  }
  void write(std::string_view bytes) { REQUIRE(write_fully(pipe_fds[1], bytes) == 0); }
  void close_writer() {
    if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
    pipe_fds[1] = -1;
  }
  // Everything the sink has written so far.
  std::string relayed() const {
    std::string all;
    char buf[64 * 1024];
    ssize_t n;
    for (off_t at = 0; (n = ::pread(::fileno(file), buf, sizeof buf, at)) > 0; at += n) {
      all.append(buf, static_cast<std::size_t>(n));
    }
    return all;
  }
};

std::size_t count_lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }
}  // namespace

TEST_CASE("RankStream::pump reads at most one chunk, drain relays what the pipe holds", "[launcher]") {
  StreamRig rig;
  // Room for the three chunks written below, so writing them does not block.
  const int want = static_cast<int>(4 * kReadChunkBytes);
  if (::fcntl(rig.pipe_fds[1], F_SETPIPE_SZ, want) < want) {
    WARN("cannot enlarge the pipe: test skipped");
    return;
  }
  const std::string line = "abcdefghijklmno\n";  // 16 bytes: a chunk holds whole lines only
  const std::size_t per_chunk = kReadChunkBytes / line.size();
  std::string chunk;
  for (std::size_t i = 0; i < per_chunk; ++i) chunk += line;
  for (int i = 0; i < 3; ++i) rig.write(chunk);

  RankStream stream(::dup(rig.pipe_fds[0]), "[r] ", rig.sink);
  stream.pump();
  REQUIRE(count_lines(rig.relayed()) == per_chunk);  // one read, not the whole pipe
  REQUIRE(stream.open());
  stream.drain();
  std::string out = rig.relayed();
  REQUIRE(count_lines(out) == 3 * per_chunk);
  REQUIRE(out.substr(0, 20) == "[r] abcdefghijklmno\n");
  REQUIRE(stream.open());  // the writer is still there

  rig.write("more\nunfinished");
  stream.drain();
  REQUIRE(rig.relayed().ends_with("[r] more\n"));
  rig.close_writer();
  stream.pump();  // the rest, then end of file: flushed and closed
  REQUIRE(rig.relayed().ends_with("[r] more\n[r] unfinished\n"));
  REQUIRE_FALSE(stream.open());
}

TEST_CASE("RankStream::drain returns while a writer keeps writing, finish flushes and closes", "[launcher]") {
  StreamRig rig;
  RankStream stream(rig.pipe_fds[0], "[r] ", rig.sink);
  rig.pipe_fds[0] = -1;  // the stream owns it now
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  std::thread writer([&] {
    const std::string lines(4096, '\n');
    while (!stop.load()) {
      if (write_fully(rig.pipe_fds[1], lines) != 0) break;
      ++writes;
    }
  });
  while (writes.load() < 4) std::this_thread::yield();
  // A leftover child of a rank may write without end: relaying what is there must not wait for it to stop.
  for (int i = 0; i < 20; ++i) stream.drain();
  stop = true;
  stream.drain();  // unblocks a writer waiting on a full pipe
  writer.join();
  REQUIRE(stream.open());
  rig.write("partial");
  stream.finish();
  REQUIRE_FALSE(stream.open());
  std::string out = rig.relayed();
  REQUIRE(count_lines(out) == 4096 * static_cast<std::size_t>(writes.load()) + 1);  // nothing lost
  REQUIRE(out.ends_with("[r] \n[r] partial\n"));
}
