// tests/unit/comm/test_traced_group.cpp: TracedGroup and the hang report: the collective's description, the
// report's encoding, describe_hang for every shape of answer (missing ranks, a rank behind, everyone present,
// disagreement, a silent or lost store), write_reason_once; then the group itself over a fake backend: numbering
// and labels, the watchdog with three ranks as threads meeting through a HashStore (one rank never comes), a
// backend's own TimeoutError taking the report path, a store that does not answer, and asynchronous completion.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "comm/traced_group.h"
#include "core/check.h"

using namespace dpt;
using namespace dpt::comm;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

HangReport report(int rank, int64_t seq, const std::string& op = "allreduce", const std::string& label = "bucket 0",
                  int64_t step = 4711, double waited = 30.2) {
  HangReport r;
  r.rank = rank;
  r.seq = seq;
  r.op = op;
  r.label = label;
  r.step = step;
  r.waited_s = waited;
  r.completed = seq - 1;
  return r;
}

}  // namespace

TEST_CASE("hang report: a collective's description", "[traced]") {
  CHECK(describe_collective(9412, "allreduce", "bucket 0", 4711) == "allreduce #9412 (bucket 0, step 4711)");
  CHECK(describe_collective(3, "barrier", "", -1) == "barrier #3");
  CHECK(describe_collective(2, "broadcast", "", 0) == "broadcast #2 (step 0)");
  CHECK(describe_collective(1, "allreduce", "loss stats", -1) == "allreduce #1 (loss stats)");
}

TEST_CASE("hang report: encoding round trip, and malformed text refused", "[traced]") {
  HangReport r = report(2, 9412, "allreduce", "bucket\t1\nx", 4711, 30.25);
  r.stalled_s = 2.5;
  const std::string text = encode_hang_report(r);
  CHECK(text.find('\n') == std::string::npos);
  auto back = decode_hang_report(text);
  REQUIRE(back);
  CHECK(back->rank == 2);
  CHECK(back->seq == 9412);
  CHECK(back->completed == 9411);
  CHECK(back->step == 4711);
  CHECK(back->waited_s == Approx(30.25));
  CHECK(back->stalled_s == Approx(2.5));
  CHECK(back->op == "allreduce");
  CHECK(back->label == "bucket 1 x");  // tabs and newlines become spaces
  HangReport empty_label = report(0, 1, "barrier", "", -1, 0);
  REQUIRE(decode_hang_report(encode_hang_report(empty_label)));
  CHECK(decode_hang_report(encode_hang_report(empty_label))->label.empty());
  CHECK(decode_hang_report(encode_hang_report(empty_label))->step == -1);
  CHECK(decode_hang_report("v1\t0\t1\t0\t-1\t0\t0\tallreduce\t"));
  for (const char* bad : {"", "v1", "v2\t0\t1\t0\t-1\t0\t0\tallreduce\t", "v1\tx\t1\t0\t-1\t0\t0\tallreduce\t",
                          "v1\t0\t1\t0\t-1\t0\t0\t\t", "v1\t-1\t1\t0\t-1\t0\t0\tallreduce\t",
                          "v1\t0\t1\t0\t-1\t0\tallreduce\t", "v1\t0\t1\t0\t-1\t0\t0"})
    CHECK_FALSE(decode_hang_report(bad));
}

TEST_CASE("describe_hang: ranks that never report are stuck before the collective the others wait in", "[traced]") {
  HangInputs in;
  in.world = 3;
  in.reports = {report(2, 9412, "allreduce", "bucket 0", 4711, 30.4), report(0, 9412, "allreduce", "bucket 0", 4711, 30.1)};
  CHECK(describe_hang(in) == "rank 1 stuck before allreduce #9412 (bucket 0, step 4711); ranks 0,2 waited 30 s");
  // The same text on every rank, whoever builds it and in whatever order the reports came.
  in.me = 2;
  std::swap(in.reports[0], in.reports[1]);
  CHECK(describe_hang(in) == "rank 1 stuck before allreduce #9412 (bucket 0, step 4711); ranks 0,2 waited 30 s");

  HangInputs several;
  several.world = 5;
  several.reports = {report(1, 12, "barrier", "", -1, 0.46)};
  CHECK(describe_hang(several) == "ranks 0,2,3,4 stuck before barrier #12; rank 1 waited 0.5 s");
}

TEST_CASE("describe_hang: ranks waiting in different collectives", "[traced]") {
  // Rank 1 stopped inside #285: rank 0 got what it needed and went on to #286, rank 2 still waits in #285.
  HangInputs split;
  split.world = 3;
  split.reports = {report(0, 286, "allreduce", "bucket 0", -1, 5.02), report(2, 285, "allreduce", "", -1, 5.1)};
  CHECK(describe_hang(split) ==
        "rank 1 stuck before allreduce #286 (bucket 0); rank 0 waited 5 s in allreduce #286 (bucket 0), rank 2 waited "
        "5 s in allreduce #285");
  // Nobody missing: a rank still in a collective the others have finished is the one named.
  HangInputs in;
  in.world = 3;
  in.reports = {report(0, 9412), report(1, 9412), report(2, 9411, "broadcast", "", 4711, 31)};
  CHECK(describe_hang(in) == "rank 2 stuck in broadcast #9411 (step 4711) (the others finished it); ranks 0,1 waited "
                             "30 s in allreduce #9412 (bucket 0, step 4711)");
  HangInputs mixed;
  mixed.world = 4;
  mixed.reports = {report(0, 9412), report(2, 9411, "broadcast", "", 4711, 31), report(3, 9412)};
  CHECK(describe_hang(mixed) ==
        "rank 1 stuck before allreduce #9412 (bucket 0, step 4711); ranks 0,3 waited 30 s in allreduce #9412 (bucket 0, "
        "step 4711), rank 2 waited 31 s in broadcast #9411 (step 4711)");
}

TEST_CASE("describe_hang: a rank that was not running when its watchdog was due is one of the stuck", "[traced]") {
  // Rank 1 was stopped inside #9412 and continued later: its report comes, 2 s late.
  HangInputs in;
  in.world = 3;
  HangReport late = report(1, 9412, "allreduce", "bucket 0", 4711, 32.0);
  late.stalled_s = 2.04;
  in.reports = {report(0, 9412), late, report(2, 9412)};
  const std::string expected =
      "rank 1 stuck in allreduce #9412 (bucket 0, step 4711) (not running for 2.0 s: stopped?); ranks 0,2 waited 30 s "
      "in allreduce #9412 (bucket 0, step 4711)";
  CHECK(describe_hang(in) == expected);
  in.me = 1;  // the same from the late rank itself
  CHECK(describe_hang(in) == expected);
  // Alone, a late report still describes its collective (nothing better is known).
  in.reports = {late};
  CHECK(describe_hang(in) == "ranks 0,2 stuck before allreduce #9412 (bucket 0, step 4711); rank 1 waited 32 s");
}

TEST_CASE("describe_hang: every rank in the same collective, agreeing or not", "[traced]") {
  HangInputs in;
  in.world = 2;
  in.reports = {report(0, 7), report(1, 7)};
  CHECK(describe_hang(in) ==
        "all 2 ranks waited 30 s in allreduce #7 (bucket 0, step 4711): none is missing (mismatched sizes or a "
        "network problem?)");
  in.reports[1] = report(1, 7, "broadcast", "", 4711);
  CHECK(describe_hang(in) == "the ranks disagree on collective #7: rank 0 allreduce #7 (bucket 0, step 4711), rank 1 "
                             "broadcast #7 (step 4711); ranks 0,1 waited 30 s");
}

TEST_CASE("describe_hang: the store's host is named when the store does not answer", "[traced]") {
  HangInputs in;
  in.world = 3;
  in.me = 2;
  in.store_host = 0;
  in.store_silent = true;
  in.store_problem = "timed out after 1000 ms";
  in.reports = {report(2, 9412, "allreduce", "bucket 0", 4711, 5.04)};
  CHECK(describe_hang(in) ==
        "rank 0 stuck before allreduce #9412 (bucket 0, step 4711): the store it hosts does not answer; rank 2 "
        "waited 5 s");
  // A lost connection (the host exited) or no store at all: this rank speaks for itself only.
  in.store_silent = false;
  in.store_problem = "lost the connection";
  CHECK(describe_hang(in) ==
        "rank 2 waited 5 s in allreduce #9412 (bucket 0, step 4711); the other ranks' state is unknown: lost the "
        "connection");
  in.store_silent = true;
  in.store_problem = "timed out after 1000 ms";
  in.me = 0;
  in.reports = {report(0, 3, "barrier", "", -1, 5)};
  CHECK(describe_hang(in) == "rank 0 waited 5 s in barrier #3; the other ranks' state is unknown: timed out after 1000 ms");
}

TEST_CASE("write_reason_once: the first writer wins, whole lines only", "[traced]") {
  char dir_template[] = "/tmp/dpt_reason_XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  const std::string path = dir + "/reason";
  CHECK_FALSE(write_reason_once("", "nothing"));
  CHECK(write_reason_once(path, "rank 1 stuck before allreduce #3"));
  CHECK_FALSE(write_reason_once(path, "rank 2 stuck before allreduce #3"));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "rank 1 stuck before allreduce #3\n");
  CHECK_FALSE(write_reason_once(dir + "/no/such/dir/reason", "x"));
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);  // no temp left
  std::filesystem::remove_all(dir);
}

namespace {

// A backend whose collectives record their label and, when asked, block until released or throw.
class FakeGroup final : public ProcessGroup {
 public:
  FakeGroup(int rank, int size, bool async = false) : ProcessGroup(rank, size), async_(async) {}
  std::string backend() const override { return "fake"; }
  bool asynchronous() const override { return async_; }

  std::shared_ptr<Work> allreduce(Tensor&, const AllreduceOptions& opts) override { return run(opts.what); }
  std::shared_ptr<Work> broadcast(Tensor&, const BroadcastOptions& opts) override { return run(opts.what); }
  std::shared_ptr<Work> allgather(const Tensor&, Tensor&, const AllgatherOptions& opts) override {
    return run(opts.what);
  }
  std::shared_ptr<Work> barrier() override { return run(""); }

  void block_next() { block_ = true; }
  void throw_timeout_after(std::chrono::milliseconds t) { throw_after_ = t; }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<std::string> labels() {
    std::lock_guard lock(mu_);
    return labels_;
  }

  // An asynchronous backend's Work, completed by the test.
  class ManualWork final : public Work {
   public:
    void wait(std::chrono::milliseconds) override {}
    bool completed() const override { return done; }
    std::atomic<bool> done{false};
  };
  std::shared_ptr<ManualWork> last_work;

 private:
  std::shared_ptr<Work> run(const std::string& what) {
    {
      std::lock_guard lock(mu_);
      labels_.push_back(what);
    }
    if (throw_after_.count() > 0) {
      std::this_thread::sleep_for(throw_after_);
      throw TimeoutError("fake: timed out");
    }
    if (block_) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return released_; });
      throw CommError("fake: released after the report");
    }
    if (async_) return last_work = std::make_shared<ManualWork>();
    return std::make_shared<CompletedWork>();
  }

  bool async_;
  std::atomic<bool> block_{false};
  std::chrono::milliseconds throw_after_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<std::string> labels_;
};

// A store whose every request times out, as a stopped TcpStore server's does.
class SilentStore final : public Store {
 protected:
  void do_set(const std::string&, const std::vector<uint8_t>&) override { silent(); }
  std::vector<uint8_t> do_get(const std::string&) override { silent(); }
  int64_t do_add(const std::string&, int64_t) override { silent(); }
  void do_wait(const std::vector<std::string>&, std::chrono::milliseconds) override { silent(); }

 private:
  [[noreturn]] static void silent() { throw TimeoutError("timed out after 1000 ms waiting for the store"); }
};

}  // namespace

TEST_CASE("TracedGroup: numbers collectives in call order and hands the backend its label", "[traced]") {
  auto fake = std::make_unique<FakeGroup>(0, 2);
  FakeGroup* inner = fake.get();
  TracedGroup g(std::move(fake), {.timeout = 10s});
  CHECK(g.backend() == "fake");
  Tensor t = Tensor::zeros({1});
  g.allreduce(t, {.what = "loss stats"})->wait();
  g.set_step(7);
  g.broadcast(t)->wait();
  g.allreduce(t, {.op = ReduceOp::Avg, .what = "bucket 1"})->wait();
  g.barrier()->wait();
  Tensor gathered = Tensor::zeros({2});
  g.allgather(t, gathered, {.what = "params bucket 3"})->wait();
  g.allgather(t, gathered)->wait();
  CHECK(inner->labels() == std::vector<std::string>{"allreduce #1 (loss stats)", "broadcast #2 (step 7)",
                                                     "allreduce #3 (bucket 1, step 7)", "",
                                                     "allgather #5 (params bucket 3, step 7)",
                                                     "allgather #6 (step 7)"});
  const auto s = g.snapshot();
  CHECK(s.entered == 6);
  CHECK(s.completed == 6);
  CHECK_FALSE(s.oldest_in_flight);
  // Errors of the backend pass through, and the collective counts as done (the fake has no reduce_scatter).
  CHECK_THROWS_AS(g.reduce_scatter(gathered, t), UnsupportedError);
  CHECK(g.snapshot().entered == 7);
  CHECK(g.snapshot().completed == 7);
}

TEST_CASE("TracedGroup: three ranks, one never comes: both others name it, once each, and the reason is written",
          "[traced][multirank]") {
  char dir_template[] = "/tmp/dpt_reason_XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string reason = std::string(dir_template) + "/reason";
  auto store = std::make_shared<HashStore>(1s);
  std::vector<std::unique_ptr<TracedGroup>> groups;
  std::vector<FakeGroup*> fakes;
  std::mutex mu;
  std::vector<std::string> messages(3);
  for (int r = 0; r < 3; ++r) {
    auto fake = std::make_unique<FakeGroup>(r, 3);
    fakes.push_back(fake.get());
    TracedGroupOptions o;
    o.timeout = 300ms;
    o.report_store = std::make_shared<PrefixStore>("dpt/restart0/hang", store);
    o.store_host = 0;
    o.report_window = 1500ms;
    o.reason_file = reason;
    o.on_hang = [&, r](const std::string& m) {
      {
        std::lock_guard lock(mu);
        messages[static_cast<size_t>(r)] = m;
      }
      fakes[static_cast<size_t>(r)]->release();
    };
    groups.push_back(std::make_unique<TracedGroup>(std::move(fake), std::move(o)));
  }
  // Every rank does collective #1; then ranks 0 and 2 go on to #2 while rank 1 stays away.
  for (auto& g : groups) {
    g->set_step(4);
    g->barrier()->wait();
  }
  fakes[0]->block_next();
  fakes[2]->block_next();
  std::vector<std::string> thrown(3);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      Tensor t = Tensor::zeros({1});
      try {
        groups[static_cast<size_t>(r)]->allreduce(t, {.what = "bucket 0"});
      } catch (const std::exception& e) {
        thrown[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Both reported (and their collective then failed with the report's text, as on_hang returned).
  for (int r : {0, 2}) {
    INFO("rank " << r);
    CHECK_THAT(messages[static_cast<size_t>(r)],
               StartsWith("hang: rank 1 stuck before allreduce #2 (bucket 0, step 4); ranks 0,2 waited 0."));
    CHECK_THAT(thrown[static_cast<size_t>(r)], StartsWith("hang: rank 1 stuck before allreduce #2"));
  }
  CHECK(messages[1].empty());
  // The timeout, then the window (rank 1 never reports), not much more.
  CHECK(took >= 1.7);
  CHECK(took < 5.0);
  std::ifstream in(reason);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, StartsWith("rank 1 stuck before allreduce #2 (bucket 0, step 4); ranks 0,2 waited 0."));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  std::filesystem::remove_all(dir_template);
}

TEST_CASE("TracedGroup: a backend's own timeout takes the report path", "[traced]") {
  auto fake = std::make_unique<FakeGroup>(1, 2);
  fake->throw_timeout_after(100ms);
  TracedGroup g(std::move(fake), {.timeout = 10s});  // no store, no on_hang: the collective throws the report
  Tensor t = Tensor::zeros({1});
  CHECK_THROWS_MATCHES(g.allreduce(t, {.what = "bucket 2"}), TimeoutError,
                       Catch::Matchers::Predicate<TimeoutError>([](const TimeoutError& e) {
                         const std::string m = e.what();
                         return m.starts_with("hang: rank 1 waited 0.") &&
                                m.find(" s in allreduce #1 (bucket 2); the other ranks' state is unknown: no store") !=
                                    std::string::npos;
                       }));
}

TEST_CASE("TracedGroup: an allgather's hang report names its label and step", "[traced]") {
  auto fake = std::make_unique<FakeGroup>(1, 2);
  fake->throw_timeout_after(100ms);
  TracedGroup g(std::move(fake), {.timeout = 10s});
  g.set_step(12);
  Tensor slot = Tensor::zeros({1});
  Tensor params = Tensor::zeros({2});
  CHECK_THROWS_MATCHES(g.allgather(slot, params, {.what = "params bucket 3"}), TimeoutError,
                       Catch::Matchers::Predicate<TimeoutError>([](const TimeoutError& e) {
                         const std::string m = e.what();
                         return m.starts_with("hang: rank 1 waited 0.") &&
                                m.find(" s in allgather #1 (params bucket 3, step 12); the other ranks' state is "
                                       "unknown: no store") != std::string::npos;
                       }));
}

TEST_CASE("TracedGroup: a store that does not answer names the rank that hosts it", "[traced]") {
  auto fake = std::make_unique<FakeGroup>(2, 3);
  FakeGroup* inner = fake.get();
  inner->block_next();
  std::string message;
  TracedGroupOptions o;
  o.timeout = 200ms;
  o.report_store = std::make_shared<SilentStore>();
  o.store_host = 0;
  o.on_hang = [&](const std::string& m) {
    message = m;
    inner->release();
  };
  TracedGroup g(std::move(fake), std::move(o));
  Tensor t = Tensor::zeros({1});
  CHECK_THROWS_AS(g.allreduce(t, {.what = "bucket 0"}), TimeoutError);
  CHECK_THAT(message, StartsWith("hang: rank 0 stuck before allreduce #1 (bucket 0): the store it hosts does not "
                                 "answer; rank 2 waited 0."));
}

TEST_CASE("TracedGroup: an asynchronous backend's collective completes with its Work", "[traced]") {
  auto fake = std::make_unique<FakeGroup>(0, 2, /*async=*/true);
  FakeGroup* inner = fake.get();
  TracedGroup g(std::move(fake), {.timeout = 10s, .watchdog = false});
  CHECK(g.asynchronous());
  Tensor t = Tensor::zeros({1});
  auto w1 = g.allreduce(t, {.what = "bucket 0"});
  auto first = inner->last_work;
  auto w2 = g.allreduce(t, {.what = "bucket 1"});
  auto second = inner->last_work;
  auto s = g.snapshot();
  CHECK(s.entered == 2);
  CHECK(s.completed == 0);
  REQUIRE(s.oldest_in_flight);
  CHECK(s.oldest_in_flight->seq == 1);
  CHECK(s.oldest_in_flight->label == "bucket 0");
  // Done on the device, never asked about: the next collective's call notices.
  first->done = true;
  auto w3 = g.barrier();
  s = g.snapshot();
  CHECK(s.entered == 3);
  CHECK(s.completed == 1);
  REQUIRE(s.oldest_in_flight);
  CHECK(s.oldest_in_flight->seq == 2);
  // wait() records completion.
  w2->wait();
  s = g.snapshot();
  CHECK(s.completed == 2);
  REQUIRE(s.oldest_in_flight);
  CHECK(s.oldest_in_flight->seq == 3);
  // So does completed() saying so.
  inner->last_work->done = true;
  CHECK(g.snapshot().oldest_in_flight);  // not asked yet
  CHECK(w3->completed());
  CHECK_FALSE(g.snapshot().oldest_in_flight);
  CHECK(g.snapshot().completed == 3);
}
