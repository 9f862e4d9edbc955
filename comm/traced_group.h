// comm/traced_group.h: TracedGroup, the decorator init_process_group puts around every backend: it numbers
// the collectives, remembers where this rank is, and when one has been in flight longer than the timeout, a
// watchdog thread asks every rank where it is and names the one that is missing:
//   rank 1 stuck before allreduce #9412 (bucket 0, step 4711); ranks 0,2 waited 30 s
//
// Numbering. Every collective gets the next sequence number (1, 2, ...) in call order; all ranks issue the same
// collectives in the same order (ProcessGroup's contract), so #9412 is the same operation on every rank. Each
// is recorded with its op, the caller's label (AllreduceOptions::what, BroadcastOptions::what) and the step
// given to set_step(). A collective is in flight from the call until it completes: for a synchronous backend
// (gloo, mpi) when the call returns (or throws); for an asynchronous one (nccl), when its Work is seen
// complete: its wait() returned, its completed() said so, or a later collective's call found it done.
//
// The watchdog (synchronous backends, more than one rank, a timeout): when the oldest collective in flight
// has waited longer than the timeout, this rank publishes a HangReport to the report store (a client of its own
// with a short timeout, under a restart-scoped prefix), waits up to report_window for the other ranks'
// reports (theirs fire too: they wait in the same collective), builds the message with describe_hang (the same
// function on every rank, so the same message where the same reports arrived), writes it to reason_file (first
// writer wins: write_reason_once in core/logging.h) and calls on_hang with kHangPrefix + the message,
// which is expected to end the process (main() exits with its hang code). The launcher then tears the job down.
// A rank that never reports never entered or never finished that collective (stopped, busy elsewhere, dead).
// If the report store does not answer within its timeout, the rank serving it is named instead: "rank 0 stuck
// before allreduce #12 (...): the store it hosts does not answer; rank 2 waited 30 s". The store's host reads
// 250 ms longer than the others (its exit takes the store away); a rank whose watchdog ran more than a second
// late (it was stopped) says so in its report and reads what is there without waiting.
//
// A backend's own timeout and the watchdog cooperate: a TimeoutError from the backend (Gloo's) takes the same
// report path, and so does any CommError (a peer that has just exited after its report) once a report is
// under way; the collective then throws TimeoutError with the report's message if on_hang returned.
// NCCL has a watchdog of its own (it aborts the communicator): there the group only numbers and labels the
// collectives (watchdog = false), and the label reaches NCCL's messages through opts.what.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/store.h"
#include "core/logging.h"  // write_reason_once

namespace dpt::comm {

// One rank's state when its watchdog fired (or its backend timed out): the oldest collective it has entered
// and not completed.
struct HangReport {
  int rank = -1;
  int64_t seq = 0;        // that collective's number (1 = the group's first)
  std::string op;         // "allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"
  std::string label;      // the caller's label; may be empty
  int64_t step = -1;      // set_step's value when it was entered; -1: none was given
  double waited_s = 0;    // how long it had been in flight
  double stalled_s = 0;   // how late its watchdog ran: over a second, this rank was not running (stopped)
  int64_t completed = 0;  // the last collective this rank completed
};

// One line of text, for the store ("v1\t..."); decode returns nullopt for anything malformed.
std::string encode_hang_report(const HangReport& r);
std::optional<HangReport> decode_hang_report(const std::string& text);

// "allreduce #9412 (bucket 0, step 4711)", "barrier #3", "broadcast #2 (step 0)".
std::string describe_collective(int64_t seq, const std::string& op, const std::string& label, int64_t step);

struct HangInputs {
  int world = 1;
  int me = 0;                       // the rank building the message
  std::vector<HangReport> reports;  // those that arrived, this rank's included; any order, one per rank
  // Non-empty when the report store failed (no answer within its timeout, connection lost, or none at all):
  // `reports` then holds this rank's only. When it did not answer (store_silent), store_host (the rank whose
  // process serves the store; -1: none) is named as stuck if it is another rank.
  std::string store_problem;
  bool store_silent = false;  // the store did not answer in time (rather than: the connection was lost)
  int store_host = -1;
};

// The one-line diagnosis, a pure function of its inputs (no kHangPrefix):
//  - ranks that did not report, stuck before the furthest collective any rank waits in: "rank 1 stuck before
//    allreduce #9412 (bucket 0, step 4711); ranks 0,2 waited 30 s". A rank stopped inside a collective can leave
//    the others split between it and the next: then each group says where it waits ("...; rank 0 waited 30 s
//    in allreduce #9412 (...), rank 2 waited 30 s in allreduce #9411 (...)").
//  - a rank that was not running when its watchdog was due (stopped, then continued; HangReport::stalled_s)
//    counts among the stuck: "rank 1 stuck in allreduce #9412 (...) (not running for 2.0 s: stopped?); ..."
//  - nobody missing, one rank still in a collective the others finished: "rank 2 stuck in broadcast #9411
//    (step 4711) (the others finished it); ranks 0,1 waited 30 s in allreduce #9412 (...)"
//  - every rank in the same collective: "all 3 ranks waited 30 s in allreduce #9412 (...): none is missing ...",
//    or "the ranks disagree on collective #9412: ..." when their ops or labels differ
//  - the store's host silent: "rank 0 stuck before allreduce #9412 (...): the store it hosts does not answer;
//    rank 2 waited 30 s"
// "waited" is the shortest wait among the ranks named (whole seconds from 1 s on).
std::string describe_hang(const HangInputs& in);

struct TracedGroupOptions {
  std::chrono::milliseconds timeout = kDefaultTimeout;  // in flight longer than this is a hang; negative: never
  bool watchdog = true;  // false: number and record only (a backend with a watchdog of its own: nccl)
  // Where the ranks' reports meet: already prefixed for this group and restart, with a short timeout (each
  // request to it may cost that much when its server is stopped). Null: this rank's report alone.
  std::shared_ptr<Store> report_store;
  int store_host = -1;  // the rank whose process serves report_store (-1: none of the ranks)
  std::chrono::milliseconds report_window = std::chrono::seconds(2);  // how long to wait for the others' reports
  // Called once, from the thread that built the message, with kHangPrefix + the message; expected to end the
  // process. Null, or if it returns: the collective throws TimeoutError with that text once its backend gives up.
  std::function<void(const std::string&)> on_hang;
  std::string reason_file;  // DPT_REASON_FILE: the message goes there first (write_reason_once); empty: nowhere
};

class TracedGroup final : public ProcessGroup {
 public:
  TracedGroup(std::unique_ptr<ProcessGroup> inner, TracedGroupOptions opts);
  ~TracedGroup() override;

  std::string backend() const override { return inner_->backend(); }
  bool asynchronous() const override { return inner_->asynchronous(); }
  void set_step(int64_t step) override;
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {}) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> barrier() override;

  ProcessGroup& inner() { return *inner_; }

  // Where this rank is (for tests and logs).
  struct Snapshot {
    int64_t entered = 0;    // the last collective entered
    int64_t completed = 0;  // the last completed
    std::optional<HangReport> oldest_in_flight;
  };
  Snapshot snapshot() const;

  // Completion of collective `seq` (an asynchronous backend's Work); public for TracedWork.
  void complete(int64_t seq);

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    int64_t seq = 0;
    const char* op = "";
    std::string label;
    int64_t step = -1;
    Clock::time_point entered;
    std::shared_ptr<Work> work;  // asynchronous backends: the inner Work, checked for completion
  };

  // Numbers and records a collective, runs `call` (the inner collective), and records its completion (or takes
  // the hang path when it fails after the timeout).
  template <class F>
  std::shared_ptr<Work> traced(const char* op, const std::string& label, F&& call);
  HangReport report_of(const Entry& e, Clock::time_point now) const;  // mu_ held
  // The hang report, once per group: the first caller builds it and calls on_hang; later ones wait until on_hang
  // has returned (normally never: it ends the process), so that none of them ends the process some other way.
  // stalled_s: how late the watchdog ran (HangReport::stalled_s).
  std::string report_hang(double stalled_s = 0);
  std::string build_report(double stalled_s);
  void watch();

  std::unique_ptr<ProcessGroup> inner_;
  TracedGroupOptions opts_;
  bool armed_ = false;  // the watchdog runs, and backend timeouts take the report path
  std::atomic<int64_t> step_{-1};

  mutable std::mutex mu_;  // the records below
  std::condition_variable cv_;  // stop (the watchdog polls: see watch())
  int64_t entered_ = 0, completed_ = 0;
  std::deque<Entry> in_flight_;  // by sequence number
  bool stop_ = false;

  std::mutex hang_mu_;
  std::condition_variable hang_cv_;
  enum class HangState { kNone, kRunning, kDone } hang_state_ = HangState::kNone;
  std::string hang_message_;

  std::thread watchdog_;
};

}  // namespace dpt::comm
