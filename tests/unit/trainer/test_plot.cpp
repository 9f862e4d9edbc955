// Unit tests for trainer/report/plot.h without gnuplot: the metrics records become the right series (other kinds,
// unknown keys, nulls and malformed lines aside), a token run gets perplexity, the script holds the data and
// says "no data yet" for empty panels, and plot_run's errors name what is missing.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "tests/support/temp_dir.h"
#include "trainer/report/plot.h"

using namespace dpt::trainer;
using dpt::test::TempDir;
namespace fs = std::filesystem;

namespace {

RunCurves curves_of(const std::string& text) {
  std::istringstream in(text);
  return read_curves(in);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Sets an environment variable for the test's duration, restoring it after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// Two epochs of an image run as the trainer writes them, with a record of another kind, an unknown key, a NaN loss
// (null), a blank line and two malformed lines in between.
const char* kImageRun =
    R"({"kind":"progress","step":2,"epoch":1,"epochs":2,"batch":2,"batches":4,"loss":2.1,"lr":0.05,"samples_per_s":1000.5,"time_s":0.1})"
    "\n"
    R"({"kind":"progress","step":3,"epoch":1,"epochs":2,"batch":3,"batches":4,"loss":1.5,"lr":0.04,"samples_per_s":1100,"future_key":[1,2]})"
    "\n"
    R"({"kind":"epoch","step":4,"epoch":1,"epochs":2,"train_loss":1.2,"test_loss":0.9,"test_acc":0.71,"lr":0.03,"samples_per_s":1050})"
    "\n"
    R"({"kind":"memory","step":4,"rss_bytes":123})"
    "\n"
    "\n"
    "this is not JSON\n"
    R"({"kind":"progress","epoch":2,"loss":1.0})"  // no step
    "\n"
    R"({"kind":"progress","step":6,"epoch":2,"epochs":2,"batch":2,"batches":4,"loss":null,"lr":0.01,"samples_per_s":1200})"
    "\n"
    R"({"kind":"epoch","step":8,"epoch":2,"epochs":2,"train_loss":0.7,"test_loss":0.6,"test_acc":0.8,"lr":0.0,"samples_per_s":1150})"
    "\n";

}  // namespace

TEST_CASE("read_curves: progress and epoch records become series, other kinds, keys and bad lines are skipped", "[plot]") {
  const RunCurves c = curves_of(kImageRun);
  CHECK(c.records == 5);
  CHECK(c.other_kinds == 1);
  CHECK(c.malformed == 2);
  CHECK(c.first_malformed == 6);  // line 5 is blank: not malformed
  CHECK_FALSE(c.tokens);
  CHECK(c.last_step == 8);
  CHECK(c.last_epoch == 2);
  CHECK(c.epochs == 2);
  REQUIRE(c.progress_loss.size() == 2);  // the null loss of step 6 is left out
  CHECK(c.progress_loss[0].step == 2);
  CHECK(c.progress_loss[1].value == 1.5);
  CHECK(c.progress_loss[1].epoch == 1);
  REQUIRE(c.progress_lr.size() == 3);
  CHECK(c.progress_lr[2].step == 6);
  CHECK(c.progress_lr[2].epoch == 2);
  REQUIRE(c.progress_rate.size() == 3);
  CHECK(c.progress_rate[0].value == 1000.5);
  REQUIRE(c.train_loss.size() == 2);
  CHECK(c.train_loss[1].step == 8);
  CHECK(c.train_loss[1].value == 0.7);
  REQUIRE(c.test_loss.size() == 2);
  REQUIRE(c.test_acc.size() == 2);
  CHECK(c.test_acc[0].value == Approx(71.0));  // percent
  CHECK(c.epoch_lr.size() == 2);
  CHECK(c.epoch_rate.size() == 2);
  CHECK(c.progress_mfu.empty());
  CHECK(c.epoch_mfu.empty());
}

TEST_CASE("read_curves: a token run is told by tokens_per_s and gets perplexity", "[plot]") {
  const RunCurves c = curves_of(
      R"({"kind":"progress","step":10,"epoch":1,"epochs":1,"loss":5.0,"lr":0.001,"tokens_per_s":20000,"mfu_pct":31.5})"
      "\n"
      R"({"kind":"epoch","step":20,"epoch":1,"epochs":1,"train_loss":4.0,"test_loss":2.0,"test_acc":0.4,"lr":0.0005,"tokens_per_s":21000})"
      "\n");
  CHECK(c.tokens);
  CHECK(c.records == 2);
  REQUIRE(c.progress_rate.size() == 1);
  CHECK(c.progress_rate[0].value == 20000);
  REQUIRE(c.epoch_rate.size() == 1);
  REQUIRE(c.progress_mfu.size() == 1);
  CHECK(c.progress_mfu[0].value == 31.5);
  REQUIRE(c.test_ppl.size() == 1);
  CHECK(c.test_ppl[0].value == Approx(std::exp(2.0)));
  CHECK(c.test_ppl[0].step == 20);
}

TEST_CASE("read_curves: an empty input has no records", "[plot]") {
  const RunCurves c = curves_of("");
  CHECK(c.records == 0);
  CHECK(c.malformed == 0);
  CHECK(c.last_step == 0);
  CHECK(curves_of("[1,2]\n\"epoch\"\n").malformed == 2);
}

TEST_CASE("parse_plot_size takes WxH within 200..10000", "[plot]") {
  CHECK(parse_plot_size("1200x900").width == 1200);
  CHECK(parse_plot_size("1200x900").height == 900);
  CHECK(parse_plot_size("200x10000").height == 10000);
  for (const char* bad : {"", "1200", "1200x", "x900", "1200*900", "100x900", "1200x20000", "12a0x900", "-1200x900",
                          "1200x900x3", " 1200x900"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_plot_size(bad), dpt::ConfigError);
  }
}

TEST_CASE("gnuplot_script: the data inline, progress curves broken between epochs, four panels", "[plot]") {
  const RunCurves c = curves_of(kImageRun);
  const std::string s = gnuplot_script(c, "it's a run", "/tmp/o'ut.png.tmp", {900, 600});
  CHECK(s.find("set terminal pngcairo size 900,600") != std::string::npos);
  CHECK(s.find("set output '/tmp/o''ut.png.tmp'") != std::string::npos);  // quotes doubled inside '...'
  CHECK(s.find("title 'it''s a run'") != std::string::npos);
  CHECK(s.find("$progress_rate << EOD\n2 1000.5\n3 1100\n\n6 1200\nEOD\n") != std::string::npos);  // a break at epoch 2
  CHECK(s.find("$progress_lr << EOD\n2 0.05\n3 0.04\n6 0.01\nEOD\n") != std::string::npos);  // none: not a mean
  CHECK(s.find("$train_loss << EOD\n4 1.2\n8 0.7\nEOD\n") != std::string::npos);
  CHECK(s.find("$test_acc << EOD\n4 71\n8 80\nEOD\n") != std::string::npos);
  CHECK(s.find("set xrange [0:8]") != std::string::npos);
  CHECK(s.find("set xlabel 'optimizer step'") != std::string::npos);
  CHECK(s.find("accuracy (%)") != std::string::npos);
  CHECK(s.find("perplexity") == std::string::npos);
  CHECK(s.find("samples/s, all ranks") != std::string::npos);
  CHECK(s.find("$test_ppl") == std::string::npos);  // an image run: no perplexity datablock
  CHECK(s.find("y2") == std::string::npos);         // no MFU: no second axis
  CHECK(count(s, "\nplot ") == 4);
  CHECK(s.find("no data yet") == std::string::npos);
  CHECK(s.find("set logscale y") != std::string::npos);  // the loss spans 0.6..2.1
  CHECK(s.find("set arrow from 4, graph 0") != std::string::npos);  // the end of epoch 1; not at the last step
  CHECK(s.find("set arrow from 8,") == std::string::npos);
  CHECK(s.ends_with("unset multiplot\nset output\n"));
}

TEST_CASE("gnuplot_script: a token run plots perplexity and tokens/s, MFU on a second axis", "[plot]") {
  const RunCurves c = curves_of(
      R"({"kind":"progress","step":10,"epoch":1,"epochs":1,"loss":5.0,"lr":0.001,"tokens_per_s":20000,"mfu_pct":31.5})"
      "\n"
      R"({"kind":"epoch","step":20,"epoch":1,"epochs":1,"train_loss":4.0,"test_loss":2.0,"test_acc":0.4,"lr":0.0005,"tokens_per_s":21000})"
      "\n");
  const std::string s = gnuplot_script(c, "gpt", "out.png", {});
  CHECK(s.find("set terminal pngcairo size 1200,900") != std::string::npos);
  CHECK(s.find("perplexity, exp(test loss)") != std::string::npos);
  CHECK(s.find("$test_ppl << EOD\n20 7.3890561\nEOD") != std::string::npos);
  CHECK(s.find("accuracy (%)") == std::string::npos);
  CHECK(s.find("tokens/s, all ranks") != std::string::npos);
  CHECK(s.find("set y2label 'MFU (%)'") != std::string::npos);
  CHECK(s.find("$progress_mfu axes x1y2") != std::string::npos);
  // One progress point draws no line: it gets a point.
  CHECK(s.find("$progress_loss with linespoints") != std::string::npos);
}

TEST_CASE("gnuplot_script: progress records but no epoch yet: the test panels say no data yet", "[plot]") {
  const RunCurves c = curves_of(
      R"({"kind":"progress","step":5,"epoch":1,"epochs":3,"loss":2.0,"lr":0.1,"samples_per_s":500})"
      "\n"
      R"({"kind":"progress","step":9,"epoch":1,"epochs":3,"loss":1.9,"lr":0.1,"samples_per_s":520})"
      "\n");
  const std::string s = gnuplot_script(c, "early", "out.png", {});
  CHECK(count(s, "'no data yet'") == 1);  // the accuracy panel; loss, lr and throughput have progress data
  CHECK(count(s, "\nplot ") == 4);
  CHECK(s.find("$train_loss") == std::string::npos);
  CHECK(s.find("set arrow") == std::string::npos);

  const std::string only_epoch = gnuplot_script(
      curves_of(R"({"kind":"epoch","step":7,"epoch":1,"epochs":1,"train_loss":0.5,"test_loss":0.6,"test_acc":0.8})"
                "\n"),
      "one epoch", "out.png", {});
  CHECK(count(only_epoch, "'no data yet'") == 2);  // no lr, no throughput in that record
  CHECK(only_epoch.find("$test_acc << EOD\n7 80\nEOD") != std::string::npos);
}

TEST_CASE("plot_run: a missing or empty metrics file is a usage error naming the path, no gnuplot is an error", "[plot]") {
  TempDir dir("plot");
  const std::string run = dir.path.string();
  try {
    plot_run({.run = run});
    FAIL("no error for a folder without metrics.jsonl");
  } catch (const dpt::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains(run + "/metrics.jsonl") && Catch::Contains("dptrain writes it"));
  }
  { std::ofstream(dir.path / "metrics.jsonl") << "\n"; }
  try {
    plot_run({.run = run});
    FAIL("no error for an empty metrics.jsonl");
  } catch (const dpt::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("is empty"));
  }
  { std::ofstream(dir.path / "metrics.jsonl") << "garbage\n{\"kind\":\"memory\",\"step\":1}\n"; }
  try {
    plot_run({.run = run});
    FAIL("no error for a file without progress or epoch records");
  } catch (const dpt::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("no progress or epoch records") &&
                             Catch::Contains("1 malformed line(s), the first: line 1"));
  }
  { std::ofstream(dir.path / "metrics.jsonl") << "{\"kind\":\"memory\",\"step\":1}\n"; }
  try {
    plot_run({.run = run});
    FAIL("no error for a file holding only a memory record");
  } catch (const dpt::ConfigError& e) {  // no "0 malformed lines, the first line 0"
    CHECK_THAT(e.what(), Catch::Contains("(1 record(s) of other kinds)"));
    CHECK_THAT(e.what(), !Catch::Contains("malformed"));
  }

  { std::ofstream(dir.path / "metrics.jsonl") << kImageRun; }
  {
    ScopedEnv env("GNUPLOT", (dir.path / "no-such-gnuplot").string());
    try {
      plot_run({.run = run});
      FAIL("no error without gnuplot");
    } catch (const dpt::ConfigError&) {
      FAIL("a missing gnuplot is not a usage error");
    } catch (const dpt::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("not found") && Catch::Contains("gnuplot-nox"));
    }
  }
  {
    // --out or --script naming the metrics file (or each other) is refused before anything is written: the run's
    // record is not replaced by a PNG or a script.
    const std::string metrics = (dir.path / "metrics.jsonl").string();
    const std::string dotted = (dir.path / "." / "metrics.jsonl").string();
    const std::vector<PlotRequest> bad = {{.run = run, .out = metrics}, {.run = run, .out = dotted},
                                          {.run = metrics, .script = metrics},
                                          {.run = run, .out = (dir.path / "x.png").string(),
                                           .script = (dir.path / "x.png").string()},
                                          {.run = run, .out = dir.path.string()}};
    for (const PlotRequest& req : bad) {
      try {
        plot_run(req);
        FAIL("no error for --out " + req.out + " --script " + req.script);
      } catch (const dpt::ConfigError& e) {
        CHECK_THAT(e.what(), Catch::Contains("would write over the metrics file") ||
                                 Catch::Contains("is the PNG's path") || Catch::Contains("is a directory"));
      }
    }
    std::ifstream in(metrics);
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str() == kImageRun);
    CHECK_FALSE(fs::exists(dir.path / "x.png"));
    CHECK_FALSE(fs::exists(dir.path.string() + ".tmp"));  // --out DIR: no DIR.tmp beside it
  }
  {
    // A "gnuplot" that fails: its output is in the error, and no PNG (nor PNG.tmp) is left.
    const fs::path fake = dir.path / "failing-gnuplot";
    { std::ofstream(fake) << "#!/bin/sh\ncat > /dev/null\necho 'line 3: something went wrong' >&2\nexit 1\n"; }
    fs::permissions(fake, fs::perms::owner_all);
    ScopedEnv env("GNUPLOT", fake.string());
    try {
      plot_run({.run = (dir.path / "metrics.jsonl").string()});
      FAIL("no error from a failing gnuplot");
    } catch (const dpt::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("something went wrong") && Catch::Contains("exited with 1"));
    }
    CHECK_FALSE(fs::exists(dir.path / "curves.png"));
    CHECK_FALSE(fs::exists(dir.path / "curves.png.tmp"));
  }
}
