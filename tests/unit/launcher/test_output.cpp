// tests/unit/launcher/test_output.cpp: the line prefixer behind "[rank R] " output: whole lines only,
// unfinished lines held back until completed or flushed, over-long lines cut.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>

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
