// trainer/report/plot.cpp: `dptrain plot` (trainer/report/plot.h).
#include "trainer/report/plot.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"

extern char** environ;

namespace dpt::trainer {

namespace fs = std::filesystem;

RunCurves read_curves(std::istream& in) {
  RunCurves c;
  std::string line;
  size_t n = 0;
  auto malformed = [&] {
    if (c.malformed++ == 0) c.first_malformed = n;
  };
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("kind") || !r["kind"].is_string() || !r.contains("step") ||
        !r["step"].is_number_integer()) {
      malformed();
      continue;
    }
    const std::string kind = r["kind"].get<std::string>();
    const bool progress = kind == "progress";
    if (!progress && kind != "epoch") {
      ++c.other_kinds;
      continue;
    }
    ++c.records;
    const int64_t step = r["step"].get<int64_t>();
    const auto integer = [&](const char* key) {
      return r.contains(key) && r[key].is_number_integer() ? r[key].get<int64_t>() : 0;
    };
    const int64_t epoch = integer("epoch");
    c.last_step = std::max(c.last_step, step);
    if (epoch > 0) c.last_epoch = epoch;
    if (integer("epochs") > 0) c.epochs = integer("epochs");
    // Adds r[key] (a finite number) times `scale` to `curve`.
    const auto add = [&](Curve& curve, const char* key, double scale = 1.0) {
      if (!r.contains(key) || !r[key].is_number()) return;
      const double v = r[key].get<double>() * scale;
      if (std::isfinite(v)) curve.push_back({step, v, epoch});
    };
    if (r.contains("tokens_per_s")) c.tokens = true;
    const char* rate = r.contains("tokens_per_s") ? "tokens_per_s" : "samples_per_s";
    if (progress) {
      add(c.progress_loss, "loss");
      add(c.progress_lr, "lr");
      add(c.progress_rate, rate);
      add(c.progress_mfu, "mfu_pct");
    } else {
      add(c.train_loss, "train_loss");
      add(c.test_loss, "test_loss");
      add(c.test_acc, "test_acc", 100.0);
      add(c.epoch_lr, "lr");
      add(c.epoch_rate, rate);
      add(c.epoch_mfu, "mfu_pct");
      if (r.contains("test_loss") && r["test_loss"].is_number()) {
        const double ppl = std::exp(r["test_loss"].get<double>());
        if (std::isfinite(ppl)) c.test_ppl.push_back({step, ppl, epoch});
      }
    }
  }
  return c;
}

PlotSize parse_plot_size(const std::string& text) {
  const auto bad = [&] {
    return ConfigError(
        fmt::format("--size: expected WIDTHxHEIGHT in pixels, each 200 to 10000 (e.g. 1200x900), got '{}'", text));
  };
  const size_t x = text.find('x');
  if (x == std::string::npos) throw bad();
  PlotSize s;
  const auto number = [&](std::string_view v, int& out) {
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || end != v.data() + v.size() || out < 200 || out > 10000) throw bad();
  };
  number(std::string_view(text).substr(0, x), s.width);
  number(std::string_view(text).substr(x + 1), s.height);
  return s;
}

namespace {

// A gnuplot string literal: single quotes take everything as it is but a quote, which doubles; control
// characters (a newline would end the command) become '?'.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char ch : s) {
    if (ch == '\'') {
      out += "''";
    } else {
      out += static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? '?' : ch;
    }
  }
  return out + "'";
}

// The curves as gnuplot datablocks: "step value" lines, a blank line (a break in the line) where a progress
// curve's epoch changes: its running mean starts again each epoch.
void datablock(std::string& s, const char* name, const Curve& c, bool break_at_epochs) {
  if (c.empty()) return;
  s += fmt::format("${} << EOD\n", name);
  for (size_t i = 0; i < c.size(); ++i) {
    if (break_at_epochs && i > 0 && c[i].epoch != c[i - 1].epoch) s += "\n";
    s += fmt::format("{} {:.9g}\n", c[i].step, c[i].value);
  }
  s += "EOD\n";
}

// Tics for a log axis over [lo, hi] (gnuplot puts them at powers of ten only, often none at all): the densest of
// m x 10^k sets that gives at most 9.
std::string log_tics(double lo, double hi) {
  const std::vector<std::vector<double>> sets = {
      {1, 1.5, 2, 3, 4, 5, 6, 8}, {1, 1.5, 2, 3, 5, 7}, {1, 2, 3, 5}, {1, 2, 5}, {1, 3}, {1}};
  std::vector<std::string> tics;
  for (const auto& set : sets) {
    tics.clear();
    for (int k = static_cast<int>(std::floor(std::log10(lo))); k <= static_cast<int>(std::ceil(std::log10(hi))); ++k) {
      for (const double m : set) {
        const double v = m * std::pow(10.0, k);
        if (v >= lo * 0.999 && v <= hi * 1.001) tics.push_back(fmt::format("{:g}", v));
      }
    }
    if (tics.size() <= 9) break;
  }
  if (tics.size() < 2) return "set ytics autofreq\n";
  return fmt::format("set ytics ({})\n", fmt::join(tics, ", "));
}

// A log y axis when `log_ok` and the values span a factor of 3 or more (a loss falling from 2.3 to 0.2), with
// readable tics; the range a little wider than the data, so that no point sits on the border. One value (a
// single epoch) gets a range around it (gnuplot would warn of an empty range).
std::string y_axis(const std::vector<const Curve*>& curves, bool log_ok = true) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Curve* c : curves) {
    for (const CurvePoint& p : *c) {
      lo = std::min(lo, p.value);
      hi = std::max(hi, p.value);
    }
  }
  if (!(lo <= hi)) return "unset logscale y\nset ytics autofreq\nset yrange [*:*]\n";  // no data
  if (hi - lo <= 1e-9 * std::max(1.0, std::abs(hi))) {
    const double pad = std::max(std::abs(hi) * 0.05, 1e-3);
    return fmt::format("unset logscale y\nset ytics autofreq\nset yrange [{:.9g}:{:.9g}]\n", lo - pad, hi + pad);
  }
  if (!log_ok || !(lo > 0) || hi / lo < 3) return "unset logscale y\nset ytics autofreq\nset yrange [*:*]\n";
  lo /= 1.08;
  hi *= 1.08;
  return fmt::format("set logscale y\nset yrange [{:.6g}:{:.6g}]\n", lo, hi) + log_tics(lo, hi);
}

struct Series {
  const char* block;
  const Curve* curve;
  std::string style;  // "with ... lc ... title ..."
  bool y2 = false;
};

// One panel: its title and labels, the series that have data, or "no data yet".
void panel(std::string& s, const std::string& title, double font, const std::string& ylabel, const std::string& key,
           const std::vector<Series>& series) {
  s += fmt::format("set title {} font 'Sans Bold,{:.1f}'\nset ylabel {}\nset key {}\n", quoted(title), font * 1.1,
                   quoted(ylabel), key);
  std::vector<std::string> plots;
  for (const Series& x : series) {
    if (x.curve->empty()) continue;
    // A curve of one or two points draws nothing as a line: give it points.
    std::string style = x.style;
    if (x.curve->size() <= 2 && style.starts_with("with lines ")) style.replace(0, 10, "with linespoints pt 7 ps 0.6");
    plots.push_back(fmt::format("${} {}{}", x.block, x.y2 ? "axes x1y2 " : "", style));
  }
  if (plots.empty()) {
    s += fmt::format("unset logscale y\nset yrange [0:1]\nset ytics autofreq\nset format y ''\nset label 1 'no data yet' "
                     "at graph 0.5, 0.5 center font ',{:.1f}' textcolor rgb '#888888'\nplot 2 notitle\nunset label 1\n"
                     "set format y '%g'\n", font * 1.4);
    return;
  }
  s += fmt::format("plot {}\n", fmt::join(plots, ", \\\n     "));
}

}  // namespace

std::string gnuplot_script(const RunCurves& c, const std::string& title, const std::string& output, PlotSize size) {
  std::string s;
  // Fonts follow the picture's size: 10 points at 1200x900, no less than 8 (legible in a README at 900x600).
  const double font = std::clamp(10.0 * std::min(size.width / 1200.0, size.height / 900.0), 8.0, 24.0);
  s += "# dptrain plot: the curves of a run's metrics.jsonl (trainer/report/plot.h)\n";
  s += fmt::format("set terminal pngcairo size {},{} noenhanced font 'Sans,{:.1f}'\n", size.width, size.height, font);
  s += "set encoding utf8\n";
  s += fmt::format("set output {}\n", quoted(output));
  datablock(s, "progress_loss", c.progress_loss, true);
  datablock(s, "train_loss", c.train_loss, false);
  datablock(s, "test_loss", c.test_loss, false);
  datablock(s, "test_acc", c.tokens ? Curve{} : c.test_acc, false);  // the second panel: one or the other
  datablock(s, "test_ppl", c.tokens ? c.test_ppl : Curve{}, false);
  datablock(s, "progress_lr", c.progress_lr, false);  // the last step's: no running mean
  datablock(s, "epoch_lr", c.epoch_lr, false);
  datablock(s, "progress_rate", c.progress_rate, true);
  datablock(s, "epoch_rate", c.epoch_rate, false);
  datablock(s, "progress_mfu", c.progress_mfu, true);
  datablock(s, "epoch_mfu", c.epoch_mfu, false);

  // Shared by the panels: the step axis, a light grid, and a dashed line where each epoch ended.
  s += fmt::format("set xrange [0:{}]\n", std::max<int64_t>(c.last_step, 1));
  s += "set xlabel 'optimizer step'\nset format x '%.0f'\nset format y '%g'\n";
  s += "set border 3 lc rgb '#555555'\nset tics nomirror out\nset grid lc rgb '#e6e6e6' lt 1\n";
  s += "set key noopaque samplen 2.5 spacing 1.1\n";
  // Fixed margins (in characters), so that the panels line up whatever their tic labels' widths.
  const bool mfu = !c.progress_mfu.empty() || !c.epoch_mfu.empty();
  s += fmt::format("set lmargin 12\nset rmargin {}\n", mfu ? 10 : 4);
  const Curve& epochs = c.train_loss.size() >= c.epoch_lr.size() ? c.train_loss : c.epoch_lr;
  if (epochs.size() <= 200) {
    for (const CurvePoint& p : epochs) {
      if (p.step < c.last_step)
        s += fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead back lc rgb '#bbbbbb' dt 2\n", p.step);
    }
  }
  s += fmt::format("set multiplot layout 2, 2 title {} font ',{:.1f}'\n", quoted(title), font * 1.3);

  const char* train_light = "lc rgb '#6baed6' lw 1";
  s += y_axis({&c.progress_loss, &c.train_loss, &c.test_loss});
  panel(s, "Loss", font, "loss (cross-entropy, nats)", "top right",
        {{"progress_loss", &c.progress_loss,
          fmt::format("with lines {} title 'train, running mean of the epoch'", train_light)},
         {"train_loss", &c.train_loss, "with linespoints lc rgb '#08519c' lw 2 pt 7 ps 0.8 title 'train, epoch'"},
         {"test_loss", &c.test_loss, "with linespoints lc rgb '#e6550d' lw 2 pt 5 ps 0.8 title 'test'"}});

  if (c.tokens) {
    s += y_axis({&c.test_ppl});
    panel(s, "Test perplexity", font, "perplexity, exp(test loss)", "top right",
          {{"test_ppl", &c.test_ppl, "with linespoints lc rgb '#e6550d' lw 2 pt 5 ps 0.8 title 'test'"}});
  } else {
    s += y_axis({&c.test_acc}, /*log_ok=*/false);
    panel(s, "Test accuracy", font, "accuracy (%)", "bottom right",
          {{"test_acc", &c.test_acc, "with linespoints lc rgb '#e6550d' lw 2 pt 5 ps 0.8 title 'test'"}});
  }

  // The epoch records' points joined by a line where no progress record draws one (train.progress_interval_s
  // longer than an epoch).
  const auto epoch_style = [](const Curve& progress) { return progress.empty() ? "linespoints lw 1.5" : "points"; };
  s += "unset logscale y\nset ytics autofreq\nset yrange [0:*]\n";
  panel(s, "Learning rate", font, "learning rate", "bottom left",
        {{"progress_lr", &c.progress_lr, "with lines lc rgb '#31a354' lw 1.5 title 'last step'"},
         {"epoch_lr", &c.epoch_lr,
          fmt::format("with {} lc rgb '#006d2c' pt 7 ps 0.8 title 'end of epoch'", epoch_style(c.progress_lr))}});

  const std::string unit = c.tokens ? "tokens/s" : "samples/s";
  s += "unset logscale y\nset ytics autofreq\nset yrange [0:*]\n";
  if (mfu) s += "set border 11 lc rgb '#555555'\nset y2tics nomirror out\nset y2range [0:*]\nset y2label 'MFU (%)'\n";
  panel(s, "Throughput", font, unit + ", all ranks", "bottom right",
        {{"progress_rate", &c.progress_rate,
          fmt::format("with lines lc rgb '#756bb1' lw 1 title '{}, running mean of the epoch'", unit)},
         {"epoch_rate", &c.epoch_rate,
          fmt::format("with {} lc rgb '#54278f' pt 7 ps 0.8 title 'epoch'", epoch_style(c.progress_rate))},
         {"progress_mfu", &c.progress_mfu, "with lines lc rgb '#de2d26' lw 1 dt 3 title 'MFU (right axis)'", true},
         {"epoch_mfu", &c.epoch_mfu,
          fmt::format("with {} lc rgb '#a50f15' pt 6 ps 0.8 {}", epoch_style(c.progress_mfu),
                      c.progress_mfu.empty() ? "title 'MFU, epoch (right axis)'" : "notitle"),
          true}});
  s += "unset multiplot\nset output\n";
  return s;
}

namespace {

// SIGPIPE ignored while it lives (a gnuplot that exits early makes our write fail with EPIPE instead).
struct IgnoreSigpipe {
  struct sigaction old {};
  IgnoreSigpipe() {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old);
  }
  ~IgnoreSigpipe() { sigaction(SIGPIPE, &old, nullptr); }
};

struct ChildResult {
  int status = 0;      // as waitpid gives it
  std::string output;  // stdout and stderr together
};

// Runs `program` (looked up in PATH unless it holds a '/') with `input` on its stdin, collecting its stdout and
// stderr; no shell. Writing and reading together (poll), so that neither side waits on a full pipe.
ChildResult run_child(const std::string& program, const std::string& input) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) DPT_THROW(Error, "plot: pipe: {}", std::strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    DPT_THROW(Error, "plot: pipe: {}", std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears FD_CLOEXEC on the copies
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, pipe_default;
  sigemptyset(&none);
  sigemptyset(&pipe_default);
  sigaddset(&pipe_default, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &pipe_default);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::string arg0 = program;
  char* argv[] = {arg0.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    if (rc == ENOENT)
      DPT_THROW(Error, "plot: cannot run {}: not found. Install gnuplot (Debian: apt-get install gnuplot-nox, as "
                "scripts/setup.sh does), or set GNUPLOT to its path", program);
    DPT_THROW(Error, "plot: cannot run {}: {}", program, std::strerror(rc));
  }
  fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
  ChildResult res;
  size_t written = 0;
  int to = in[1], from = out[0];
  if (input.empty()) {
    close(to);
    to = -1;
  }
  char buf[4096];
  while (from >= 0) {
    pollfd p[2] = {{from, POLLIN, 0}, {to, POLLOUT, 0}};  // a negative fd is not polled
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (to >= 0 && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = write(to, input.data() + written, input.size() - written);
      if (w > 0) written += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        close(to);  // done, or the child stopped reading (EPIPE): its output says why
        to = -1;
      }
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t r = read(from, buf, sizeof buf);
      if (r > 0) {
        res.output.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(from);
        from = -1;
      }
    }
  }
  if (to >= 0) close(to);
  while (waitpid(pid, &res.status, 0) < 0 && errno == EINTR) {
  }
  return res;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return "failed";
}

// "fmnist_mlp: epoch 10/10, step 4690; test loss 0.3123, test accuracy 89.12%"
std::string plot_title(const std::string& name, const RunCurves& c) {
  std::string t = fmt::format("{}: epoch {}/{}, step {}", name, c.last_epoch, c.epochs, c.last_step);
  if (c.test_loss.empty()) return t + " (no epoch finished yet)";
  t += fmt::format("; test loss {:.4f}", c.test_loss.back().value);
  if (c.tokens && !c.test_ppl.empty()) t += fmt::format(", perplexity {:.2f}", c.test_ppl.back().value);
  if (!c.tokens && !c.test_acc.empty()) t += fmt::format(", accuracy {:.2f}%", c.test_acc.back().value);
  return t;
}

// Whether paths `a` and `b` name one file: the same file when both exist (links, "./x"), else the same absolute path.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return fs::absolute(a, ec).lexically_normal() == fs::absolute(b, ec).lexically_normal();
}

// --out and --script are written over: neither may name the metrics file they are drawn from (a run's record, which
// a run may still be writing), nor each other, nor a directory. Before anything is written.
void refuse_overwriting(const std::string& metrics, const std::string& out, const std::string& script) {
  for (const auto& [option, path] : {std::pair<const char*, const std::string&>{"--out", out}, {"--script", script}}) {
    if (!path.empty() && (same_file(path, metrics) || same_file(path + ".tmp", metrics)))
      DPT_THROW(ConfigError, "plot: {} {} would write over the metrics file {} it draws from; name another file",
                option, path, metrics);
  }
  if (!script.empty() && (same_file(script, out) || same_file(script, out + ".tmp")))
    DPT_THROW(ConfigError, "plot: --script {} is the PNG's path ({}); name another file", script, out);
  std::error_code ec;
  for (const auto& [option, path] : {std::pair<const char*, const std::string&>{"--out", out}, {"--script", script}}) {
    if (!path.empty() && fs::is_directory(path, ec))
      DPT_THROW(ConfigError, "plot: {} {} is a directory; name the file to write in it ({})", option, path,
                (fs::path(path) / (std::string(option) == "--out" ? "curves.png" : "curves.gp")).string());
  }
}

}  // namespace

PlotReport plot_run(const PlotRequest& req) {
  const char* writer = "dptrain writes it while it trains (rank 0, in log.dir: by default the folder that holds "
                       "checkpoint.dir, e.g. runs/fmnist_mlp for runs/fmnist_mlp/checkpoints)";
  PlotReport rep;
  std::error_code ec;
  // A folder, or a path that names none and no .jsonl file either: the run folder that should hold the file.
  const bool folder_given = fs::is_directory(req.run, ec) || (!fs::exists(req.run, ec) && !req.run.ends_with(".jsonl"));
  rep.metrics = folder_given ? (fs::path(req.run) / "metrics.jsonl").string() : req.run;
  std::ifstream in(rep.metrics);
  if (!fs::is_regular_file(rep.metrics, ec) || !in)
    DPT_THROW(ConfigError, "plot: no metrics file {}: {}", rep.metrics, writer);
  const RunCurves c = read_curves(in);
  if (c.records == 0 && c.malformed == 0 && c.other_kinds == 0)
    DPT_THROW(ConfigError, "plot: {} is empty: {}; it gets its first record after train.progress_interval_s or at "
              "the end of the first epoch", rep.metrics, writer);
  if (c.records == 0)
    DPT_THROW(ConfigError, "plot: {} holds no progress or epoch records ({} record(s) of other kinds{}): {}",
              rep.metrics, c.other_kinds,
              c.malformed > 0
                  ? fmt::format(", {} malformed line(s), the first: line {}", c.malformed, c.first_malformed)
                  : std::string(),
              writer);
  rep.records = c.records;
  rep.malformed = c.malformed;
  rep.first_malformed = c.first_malformed;

  const fs::path folder = fs::absolute(fs::path(rep.metrics)).lexically_normal().parent_path();
  rep.out = req.out.empty() ? (fs::path(rep.metrics).parent_path() / "curves.png").string() : req.out;
  refuse_overwriting(rep.metrics, rep.out, req.script);
  const fs::path out_parent = fs::absolute(rep.out).parent_path();
  fs::create_directories(out_parent, ec);
  if (ec)
    DPT_THROW(IoError, "plot: cannot create the folder {} for {}: {}", out_parent.string(), rep.out, ec.message());
  const std::string tmp = rep.out + ".tmp";
  const std::string script = gnuplot_script(c, plot_title(folder.filename().string(), c), tmp, req.size);
  if (!req.script.empty()) {
    std::ofstream f(req.script, std::ios::trunc);
    f << script;
    f.flush();
    if (!f) DPT_THROW(IoError, "plot: cannot write the script {}: {}", req.script, std::strerror(errno));
  }

  const char* env = std::getenv("GNUPLOT");
  const std::string gnuplot = env && *env ? env : "gnuplot";
  fs::remove(tmp, ec);
  ChildResult r;
  {
    IgnoreSigpipe ignore;
    r = run_child(gnuplot, script);
  }
  const bool made = fs::is_regular_file(tmp, ec) && fs::file_size(tmp, ec) > 0;
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0 || !made) {
    fs::remove(tmp, ec);
    std::string out = r.output;
    if (out.size() > 4000) out = "..." + out.substr(out.size() - 4000);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    DPT_THROW(Error, "plot: {} {}{} (drawing {}):\n{}", gnuplot, describe_status(r.status),
              made ? "" : ", writing no PNG", rep.out, out.empty() ? "(no output)" : out);
  }
  fs::rename(tmp, rep.out, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);  // no OUT.tmp left behind
    DPT_THROW(IoError, "plot: cannot rename {} to {}: {}", tmp, rep.out, ec.message());
  }
  rep.gnuplot_output = r.output;
  return rep;
}

}  // namespace dpt::trainer
