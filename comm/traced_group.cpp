// comm/traced_group.cpp: TracedGroup (numbering, in-flight records, the watchdog and the report exchange), the
// hang report's encoding, describe_hang and write_reason_once.
#include "comm/traced_group.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <functional>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/check.h"

namespace dpt::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Labels travel as one field of a tab-separated line.
std::string one_field(std::string s) {
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return s;
}

template <class T>
bool parse_number(const std::string& s, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc{} && p == end;
}

// "rank 1", "ranks 0,2"
std::string name_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ","));
}

// A watchdog that ran this much later than its deadline: the process was not running (stopped, or starved).
constexpr double kStalledS = 1.0;

// "30 s", "0.4 s"
std::string seconds_text(double s) {
  return s >= 1.0 ? fmt::format("{:.0f} s", s) : fmt::format("{:.1f} s", s);
}

}  // namespace

std::string encode_hang_report(const HangReport& r) {
  // waited in milliseconds: integers only, so the text is the same whatever the locale.
  return fmt::format("v1\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}", r.rank, r.seq, r.completed, r.step,
                     static_cast<int64_t>(r.waited_s * 1000.0), static_cast<int64_t>(r.stalled_s * 1000.0),
                     one_field(r.op), one_field(r.label));
}

std::optional<HangReport> decode_hang_report(const std::string& text) {
  std::vector<std::string> f;
  size_t start = 0;
  for (int i = 0; i < 8; ++i) {  // the label, last, is the rest of the line
    const size_t tab = text.find('\t', start);
    if (tab == std::string::npos) return std::nullopt;
    f.push_back(text.substr(start, tab - start));
    start = tab + 1;
  }
  f.push_back(text.substr(start));
  HangReport r;
  int64_t waited_ms = 0, stalled_ms = 0;
  if (f[0] != "v1" || !parse_number(f[1], &r.rank) || !parse_number(f[2], &r.seq) ||
      !parse_number(f[3], &r.completed) || !parse_number(f[4], &r.step) || !parse_number(f[5], &waited_ms) ||
      !parse_number(f[6], &stalled_ms) || f[7].empty() || r.rank < 0)
    return std::nullopt;
  r.waited_s = static_cast<double>(waited_ms) / 1000.0;
  r.stalled_s = static_cast<double>(stalled_ms) / 1000.0;
  r.op = f[7];
  r.label = f[8];
  return r;
}

std::string describe_collective(int64_t seq, const std::string& op, const std::string& label, int64_t step) {
  std::string detail = label;
  if (step >= 0) detail += fmt::format("{}step {}", detail.empty() ? "" : ", ", step);
  return detail.empty() ? fmt::format("{} #{}", op, seq) : fmt::format("{} #{} ({})", op, seq, detail);
}

// Over 80 lines on purpose: the cases of a hang (store trouble; everyone waiting, in one collective or several;
// ranks missing or stopped) read in order, each ending in its sentence, over the groupings computed once above them.
std::string describe_hang(const HangInputs& in) {
  std::map<int, const HangReport*> by_rank;
  for (const HangReport& r : in.reports) {
    if (r.rank >= 0 && r.rank < in.world) by_rank.emplace(r.rank, &r);
  }
  if (by_rank.empty()) return "a collective outlived the timeout (no rank's report)";
  auto coll = [](const HangReport& r) { return describe_collective(r.seq, r.op, r.label, r.step); };

  if (!in.store_problem.empty()) {
    // Only this rank's own report: the others are unknown.
    const HangReport& mine = by_rank.count(in.me) ? *by_rank[in.me] : *by_rank.begin()->second;
    if (in.store_silent && in.store_host >= 0 && in.store_host != mine.rank)
      return fmt::format("rank {} stuck before {}: the store it hosts does not answer; rank {} waited {}",
                         in.store_host, coll(mine), mine.rank, seconds_text(mine.waited_s));
    return fmt::format("rank {} waited {} in {}; the other ranks' state is unknown: {}", mine.rank,
                       seconds_text(mine.waited_s), coll(mine), in.store_problem);
  }

  // A rank whose watchdog ran late was not running (stopped, then continued: its report came after the fact):
  // it is one of the stuck, not of the waiting. Unless every report is such.
  auto stalled = [&](const HangReport& r) { return r.stalled_s > kStalledS; };
  const bool any_running = std::any_of(by_rank.begin(), by_rank.end(), [&](const auto& kv) { return !stalled(*kv.second); });
  std::vector<int> missing;
  std::vector<const HangReport*> stopped;
  std::map<int64_t, std::vector<const HangReport*>, std::greater<>> waiting;  // by collective, the furthest first
  for (int rank = 0; rank < in.world; ++rank) {
    auto it = by_rank.find(rank);
    if (it == by_rank.end())
      missing.push_back(rank);
    else if (any_running && stalled(*it->second))
      stopped.push_back(it->second);
    else
      waiting[it->second->seq].push_back(it->second);
  }
  // "ranks 0,2 waited 30 s", and " in allreduce #9412 (...)" where asked.
  auto waited_text = [&](const std::vector<const HangReport*>& rs, bool with_collective) {
    std::vector<int> ranks;
    double w = rs.front()->waited_s;
    for (const HangReport* r : rs) {
      ranks.push_back(r->rank);
      w = std::min(w, r->waited_s);
    }
    return fmt::format("{} waited {}{}", name_ranks(ranks), seconds_text(w),
                       with_collective ? " in " + coll(*rs.front()) : "");
  };
  const HangReport& front = *waiting.begin()->second.front();  // the lowest rank of the furthest collective

  if (missing.empty() && stopped.empty()) {
    if (waiting.size() > 1) {
      // Everyone is waiting, some in an earlier collective that the others have finished.
      std::vector<std::string> behind;
      for (auto it = std::next(waiting.begin()); it != waiting.end(); ++it) {
        for (const HangReport* r : it->second)
          behind.push_back(fmt::format("rank {} stuck in {} (the others finished it)", r->rank, coll(*r)));
      }
      return fmt::format("{}; {}", fmt::join(behind, ", "), waited_text(waiting.begin()->second, true));
    }
    // Everyone is in the same collective: do they agree on what it is?
    std::vector<std::string> differ;
    for (const auto& [rank, r] : by_rank) {
      if (r->op != front.op || r->label != front.label) differ.push_back(fmt::format("rank {} {}", rank, coll(*r)));
    }
    if (!differ.empty())
      return fmt::format("the ranks disagree on collective #{}: rank {} {}, {}; {}", front.seq, front.rank, coll(front),
                         fmt::join(differ, ", "), waited_text(waiting.begin()->second, false));
    double w = front.waited_s;
    for (const auto& [rank, r] : by_rank) w = std::min(w, r->waited_s);
    return fmt::format("all {} ranks waited {} in {}: none is missing (mismatched sizes or a network problem?)",
                       in.world, seconds_text(w), coll(front));
  }

  // Missing ranks never entered or never finished the collective the furthest ranks wait in; a rank stopped in
  // one collective can leave the others split between it and the next, so each group says where it waits.
  std::vector<std::string> stuck;
  if (!missing.empty()) stuck.push_back(fmt::format("{} stuck before {}", name_ranks(missing), coll(front)));
  for (const HangReport* r : stopped)
    stuck.push_back(fmt::format("rank {} stuck in {} (not running for {:.1f} s: stopped?)", r->rank, coll(*r), r->stalled_s));
  std::vector<std::string> waits;
  const bool name_each = waiting.size() > 1 || missing.empty();
  for (const auto& [seq, rs] : waiting) waits.push_back(waited_text(rs, name_each));
  return fmt::format("{}; {}", fmt::join(stuck, ", "), fmt::join(waits, ", "));
}

// ---- TracedGroup -------------------------------------------------------------------------------------------

namespace {

// An asynchronous backend's Work: completion is recorded when it is seen.
class TracedWork final : public Work {
 public:
  TracedWork(std::shared_ptr<Work> inner, TracedGroup* group, int64_t seq)
      : inner_(std::move(inner)), group_(group), seq_(seq) {}
  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    group_->complete(seq_);
  }
  void block(StreamHandle stream) override { inner_->block(stream); }
  bool completed() const override {
    const bool done = inner_->completed();
    if (done) group_->complete(seq_);
    return done;
  }

 private:
  std::shared_ptr<Work> inner_;
  TracedGroup* group_;  // a Work does not outlive its group (the group's contract with its callers)
  int64_t seq_;
};

}  // namespace

TracedGroup::TracedGroup(std::unique_ptr<ProcessGroup> inner, TracedGroupOptions opts)
    : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)), opts_(std::move(opts)) {
  armed_ = opts_.watchdog && opts_.timeout.count() >= 0 && size() > 1 && !inner_->asynchronous();
  if (armed_) watchdog_ = std::thread([this] { watch(); });
}

TracedGroup::~TracedGroup() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void TracedGroup::set_step(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  inner_->set_step(step);
}

void TracedGroup::complete(int64_t seq) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const Entry& e) { return e.seq == seq; });
  if (it == in_flight_.end()) return;
  in_flight_.erase(it);
  completed_ = std::max(completed_, seq);
}

template <class F>
std::shared_ptr<Work> TracedGroup::traced(const char* op, const std::string& label, F&& call) {
  const bool async = inner_->asynchronous();
  int64_t seq = 0;
  const int64_t step = step_.load(std::memory_order_relaxed);
  std::vector<int64_t> done;
  {
    std::unique_lock lock(mu_);
    if (async) {  // asynchronous Work the caller never asked about: done by now?
      for (const Entry& e : in_flight_)
        if (e.work && e.work->completed()) done.push_back(e.seq);
    }
    seq = ++entered_;
    in_flight_.push_back({seq, op, label, step, Clock::now(), nullptr});
  }
  for (int64_t s : done) complete(s);
  const std::string what = describe_collective(seq, op, label, step);
  std::shared_ptr<Work> work;
  try {
    work = call(what);
  } catch (const TimeoutError&) {
    // The backend's own timeout (Gloo's): the same report as the watchdog's.
    if (armed_) throw TimeoutError(std::string(kHangPrefix) + report_hang());
    complete(seq);
    throw;
  } catch (const CommError&) {
    bool reporting;
    {
      std::lock_guard lock(hang_mu_);
      reporting = hang_state_ != HangState::kNone;
    }
    // A peer that exited after its report: this rank's report (under way) is the one to tell.
    if (reporting) throw TimeoutError(std::string(kHangPrefix) + report_hang());
    complete(seq);
    throw;
  } catch (...) {
    complete(seq);
    throw;
  }
  if (!async) {
    complete(seq);
    return work;
  }
  {
    std::lock_guard lock(mu_);
    for (Entry& e : in_flight_)
      if (e.seq == seq) e.work = work;
  }
  return std::make_shared<TracedWork>(std::move(work), this, seq);
}

std::shared_ptr<Work> TracedGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  return traced("allreduce", opts.what, [&](const std::string& what) {
    AllreduceOptions o = opts;
    o.what = what;
    return inner_->allreduce(tensor, o);
  });
}

std::shared_ptr<Work> TracedGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  return traced("broadcast", opts.what, [&](const std::string& what) {
    BroadcastOptions o = opts;
    o.what = what;
    return inner_->broadcast(tensor, o);
  });
}

std::shared_ptr<Work> TracedGroup::allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts) {
  return traced("allgather", opts.what, [&](const std::string& what) {
    AllgatherOptions o = opts;
    o.what = what;
    return inner_->allgather(input, output, o);
  });
}

std::shared_ptr<Work> TracedGroup::reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts) {
  return traced("reduce_scatter", opts.what, [&](const std::string& what) {
    AllreduceOptions o = opts;
    o.what = what;
    return inner_->reduce_scatter(input, output, o);
  });
}

std::shared_ptr<Work> TracedGroup::barrier() {
  return traced("barrier", "", [&](const std::string&) { return inner_->barrier(); });
}

HangReport TracedGroup::report_of(const Entry& e, Clock::time_point now) const {
  HangReport r;
  r.rank = rank();
  r.seq = e.seq;
  r.op = e.op;
  r.label = e.label;
  r.step = e.step;
  r.waited_s = std::chrono::duration<double>(now - e.entered).count();
  r.completed = completed_;
  return r;
}

TracedGroup::Snapshot TracedGroup::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s{entered_, completed_, std::nullopt};
  if (!in_flight_.empty()) s.oldest_in_flight = report_of(in_flight_.front(), Clock::now());
  return s;
}

void TracedGroup::watch() {
  // It polls rather than being woken by every collective: a wake-up per collective costs a context switch each
  // (7% of a small MLP's step on two cores, measured with scripts/bench/ab_builds.sh). A tenth of the timeout
  // (10 ms .. 1 s) is precise enough for "timeout + 5 s". How late a poll runs says whether this process was
  // running: stopped (SIGSTOP) for a while, it wakes that much late.
  const auto poll = std::clamp<std::chrono::milliseconds>(opts_.timeout / 10, std::chrono::milliseconds(10),
                                                          std::chrono::milliseconds(1000));
  std::unique_lock lock(mu_);
  auto due = Clock::now() + poll;
  while (!stop_) {
    if (cv_.wait_until(lock, due, [&] { return stop_; })) break;
    const auto now = Clock::now();
    const double late = std::chrono::duration<double>(now - due).count();
    due = now + poll;
    if (in_flight_.empty() || now < in_flight_.front().entered + opts_.timeout) continue;
    lock.unlock();
    if (late > kStalledS)  // its report says so: the others then count this rank among the stuck
      spdlog::warn("the hang watchdog ran {:.1f} s late: this process was not running (stopped, or starved of CPU)", late);
    report_hang(late);  // on_hang normally ends the process here
    return;
  }
}

std::string TracedGroup::report_hang(double stalled_s) {
  {
    std::unique_lock lock(hang_mu_);
    if (hang_state_ != HangState::kNone) {
      hang_cv_.wait(lock, [&] { return hang_state_ == HangState::kDone; });
      return hang_message_;
    }
    hang_state_ = HangState::kRunning;
  }
  std::string message;
  try {
    message = build_report(stalled_s);
  } catch (const std::exception& e) {  // never leave the waiting callers waiting
    message = fmt::format("rank {}: a collective outlived the timeout, and its report failed: {}", rank(), e.what());
  }
  write_reason_once(opts_.reason_file, message);
  // Before the callers waiting for the report are let go: on_hang ends the process, and none of them may end it
  // first with an error of its own (the collective's TimeoutError, its exit code).
  if (opts_.on_hang) opts_.on_hang(std::string(kHangPrefix) + message);
  {
    std::lock_guard lock(hang_mu_);
    hang_message_ = message;
    hang_state_ = HangState::kDone;
  }
  hang_cv_.notify_all();
  return message;
}

std::string TracedGroup::build_report(double stalled_s) {
  HangInputs in;
  in.world = size();
  in.me = rank();
  in.store_host = opts_.store_host;
  HangReport mine;
  {
    std::lock_guard lock(mu_);
    if (in_flight_.empty()) {  // a backend timed out on something already recorded as done: name the last one
      mine.rank = rank();
      mine.seq = entered_;
      mine.op = "collective";
      mine.completed = completed_;
      mine.step = step_.load();
    } else {
      mine = report_of(in_flight_.front(), Clock::now());
    }
  }
  mine.stalled_s = stalled_s;
  spdlog::warn("{} on this rank has waited {:.1f} s (dist.timeout_s = {:g} s): asking the other ranks where they are",
               describe_collective(mine.seq, mine.op, mine.label, mine.step), mine.waited_s,
               std::chrono::duration<double>(opts_.timeout).count());
  in.reports.push_back(mine);
  Store* store = opts_.report_store.get();
  if (!store) {
    in.store_problem = "no store to exchange reports through";
    return describe_hang(in);
  }
  // The rank whose process serves the store reads a little longer: its exit takes the store away, and the
  // others' windows began about when its own did. A rank that was not running reads what is there at once: the
  // others have reported (and maybe gone) while it was stopped.
  auto window = opts_.report_window;
  if (rank() == opts_.store_host) window += std::chrono::milliseconds(250);
  if (stalled_s > kStalledS) window = std::chrono::milliseconds(0);
  const auto deadline = Clock::now() + window;
  try {
    // A slot per report, so that the reports can be read without knowing who sent them.
    const int64_t slot = store->add("count", 1);
    store->set(fmt::format("report/{}", slot), encode_hang_report(mine));
  } catch (const std::exception& e) {
    in.store_problem = e.what();
    in.store_silent = dynamic_cast<const TimeoutError*>(&e) != nullptr;
    return describe_hang(in);
  }
  try {
    // The reports are read as they come: a rank that ends its window first (rank 0, whose store then goes
    // away with it) must not leave the others without its report.
    int64_t read = 0;
    while (true) {
      const int64_t count = store->add("count", 0);
      while (read < count) {
        // A slot is taken before its report is written: wait for it, within the window only.
        const std::string key = fmt::format("report/{}", read + 1);
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        try {
          store->wait({key}, std::max(left, std::chrono::milliseconds(1)));
        } catch (const TimeoutError&) {
          break;  // not written (yet): look again, or give up with the window
        }
        std::optional<HangReport> r = decode_hang_report(store->get_string(key));
        if (r && r->rank != rank()) in.reports.push_back(*r);
        ++read;
      }
      if (read >= size() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    // The reports read so far still tell something.
    spdlog::warn("reading the other ranks' hang reports failed: {}", e.what());
  }
  return describe_hang(in);
}

}  // namespace dpt::comm
