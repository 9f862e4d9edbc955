// launcher/job_elastic.cpp: the Job of an elastic job: the rendezvous rounds, keep-alives, other nodes' failures (launcher/job.h).
#include "launcher/job.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace dpt::launcher {

void Job::connect_rendezvous() {
  comm::TcpStoreOptions so;
  so.host = *opts_.master_addr;
  so.port = *opts_.master_port;
  so.is_server = opts_.node_rank == 0;
  so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(rdzv_timeout_);
  so.token = opts_.store_token;
  try {
    store_ = std::make_unique<comm::TcpStore>(so);
  } catch (const CommError& e) {
    // Not "lost the rendezvous at node 0 ...; requeue the job" (Job::run): this node never had it.
    if (!so.is_server)
      DPT_THROW(CommError, "cannot join the job's rendezvous at {}:{}, which node 0's dprun hosts: {} (is node 0's "
                           "dprun running, given this --master-port, and the same DPT_STORE_TOKEN as this node?)",
                so.host, so.port, e.what());
    DPT_THROW(CommError, "node 0 cannot host the job's rendezvous: {} (is node 0's dprun running already? One dprun "
                         "per node, each with its own --node-rank)", e.what());
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string name = host;
  if (std::string addr = local_address_toward(*opts_.master_addr); !addr.empty()) {
    name += (name.empty() ? "" : " ") + addr;
  }
  rdzv_ = std::make_unique<Rendezvous>(*store_, NodeInfo{opts_.node_rank, opts_.nproc_per_node, name});
  if (rdzv_->is_master()) {
    rdzv_->mark_elastic();
    return;
  }
  // Node 0 marks its store at once: a store without the mark for a while is a plain job's rank 0's (node 0's dprun
  // was given other --nnodes or --max-restarts). This dprun once joined rounds in it, and ended 300 s later when
  // rank 0 gave up, "lost the rendezvous at node 0".
  if (!wait_for([&] { return rdzv_->marked_elastic(); }, std::min<JobClock::duration>(rdzv_timeout_, kMarkWait))) {
    if (stop_requested_) return;  // Job::run ends the job
    DPT_THROW(ConfigError,
              "{}:{} is not an elastic dprun job's rendezvous: a store answers there with this job's token, but not "
              "node 0's dprun's (it runs a job that is not elastic: its rank 0 serves that port). Give every node's "
              "dprun the same --nnodes and --max-restarts",
              *opts_.master_addr, *opts_.master_port);
  }
}

bool Job::wait_for(const std::function<bool()>& done, std::optional<JobClock::duration> limit) {
  const JobClock::time_point until = limit ? JobClock::now() + *limit : JobClock::time_point::max();
  bool stopped = false;
  for (;;) {
    keep_alive();
    if (done()) return true;
    if (stopped || JobClock::now() >= until) return false;
    pollfd p{signals_.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kRendezvousPoll.count())) < 0 && errno != EINTR) {
      DPT_THROW(IoError, "poll failed: {}", std::strerror(errno));
    }
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD) continue;
      note(fmt::format("received {}", signal_name(sig)));
      stop_requested_ = stopped = true;
      if (received_signal_ == 0) received_signal_ = sig;
    }
  }
}

std::optional<int> Job::enter_round(int round, int own_code) {
  for (;; ++round) {
    const int slot = rdzv_->join(round);
    const JobClock::time_point joined_at = JobClock::now();
    std::optional<RoundPlan> plan;
    const bool closed = wait_for([&] {
      plan = rdzv_->is_master() ? master_close(round, JobClock::now() - joined_at >= rdzv_timeout_) : rdzv_->closed(round);
      return plan.has_value();
    });
    if (!closed) {  // a stop signal
      const int code = 128 + received_signal_;
      if (rdzv_->is_master()) {
        rdzv_->end(round, code, fmt::format("node 0's dprun received {}", signal_name(received_signal_)));
        linger(round, /*self_joined=*/1, 0, kStoppedLinger);
      } else {
        // It once stayed counted: the next round ran with it, its ranks never came, and the round failed on them.
        try {
          rdzv_->withdraw(round, slot);
        } catch (const CommError&) {  // node 0 gone: nobody to tell
        }
      }
      return own_code != 0 ? own_code : code;
    }
    if (plan->ended) {
      note(fmt::format("the job ends: {}", plan->end_message));
      if (rdzv_->is_master()) {
        linger(round, /*self_joined=*/1, 0, rdzv_timeout_);
      } else {
        rdzv_->bye(round);
      }
      return own_code != 0 ? own_code : plan->end_code;
    }
    const int index = plan->index_of(opts_.node_rank, slot);
    if (const int other = plan->index_of(opts_.node_rank); index < 0 && other >= 0) {
      // Another dprun runs the round as this --node-rank: it once ran this node's ranks a second time (two rank 1s).
      note(fmt::format("round {} runs another dprun as node {} ({}): waiting for the next round, which a node's "
                       "second dprun joins only if the first is gone (two dprun with one --node-rank end the job)",
                       round, opts_.node_rank, plan->nodes[static_cast<std::size_t>(other)].name));
      continue;
    }
    if (index < 0) {
      note(fmt::format("round {} began with {} nodes, without this one: waiting for the next round (after a "
                       "failure), which takes up to {} nodes",
                       round, plan->nodes.size(), opts_.nnodes));
      continue;
    }
    plan_ = *plan;
    watch_.reset();
    restarts_ = round;
    placement_ = Placement{plan_.first_rank(index), plan_.world_size(), index, plan_.rank_port,
                           static_cast<int>(plan_.nodes.size())};
    std::vector<std::string> names;
    for (const NodeInfo& n : plan_.nodes) names.push_back(describe(n));
    note(fmt::format("round {}: {} node{} ({}), world size {}; this node runs ranks {}..{}{}", round,
                     plan_.nodes.size(), plan_.nodes.size() == 1 ? "" : "s", fmt::join(names, ", "),
                     placement_.world_size, placement_.first_rank,
                     placement_.first_rank + opts_.nproc_per_node - 1,
                     log_run_dir_.empty() ? "" : fmt::format(", logs in {}/attempt_{}", log_run_dir_, round)));
    return std::nullopt;
  }
}

std::optional<RoundPlan> Job::master_close(int round, bool timed_out) {
  // A rank of a node started as a plain job came to this store instead of its rank 0's: that node will not join.
  if (std::string stray = rdzv_->not_elastic(); !stray.empty()) {
    RoundPlan plan;
    plan.round = round;
    plan.ended = true;
    plan.end_code = kConfigErrorCode;
    plan.end_message = fmt::format("a node started as a job that is not elastic came to this rendezvous: {}", stray);
    rdzv_->close(plan);
    return plan;
  }
  RoundDecision d = decide_round(rdzv_->joined(round), min_nodes(opts_), opts_.nnodes, timed_out,
                                 std::chrono::duration_cast<std::chrono::milliseconds>(rdzv_timeout_),
                                 plan_.nodes, round);
  if (d.kind == RoundDecision::Kind::kWait) return std::nullopt;
  RoundPlan plan;
  plan.round = round;
  if (d.kind == RoundDecision::Kind::kEnd) {
    plan.ended = true;
    plan.end_code = 1;
    plan.end_message = d.message;
  } else {
    plan.nodes = std::move(d.nodes);
    plan.rank_port = find_free_port("0.0.0.0");  // rank 0's store listens on every interface
  }
  rdzv_->close(plan);
  return plan;
}

void Job::linger(int round, int self_joined, int expected, JobClock::duration limit) {
  (void)wait_for([&] {
    return rdzv_->byes(round) >= std::max(expected, rdzv_->joined_count(round) - self_joined);
  }, limit);
}

void Job::report_failure_once(int code, const std::string& what, bool by_signal, bool stop) {
  if (!elastic_ || !rdzv_ || reported_) return;
  reported_ = true;
  rdzv_->report_failure(plan_.round, code, what, by_signal, stop);
}

void Job::keep_alive() {
  if (!rdzv_ || rdzv_->is_master() || master_gone_ || JobClock::now() < next_keep_alive_) return;
  next_keep_alive_ = JobClock::now() + keep_alive_every_;
  try {
    rdzv_->keep_alive();
  } catch (const CommError&) {
    if (!reported_) throw;
    master_gone_ = true;  // it ended the job after this node's report (round_failure)
  }
}

void Job::watch_keep_alives() {
  if (!rdzv_->is_master() || JobClock::now() < next_watch_) return;
  next_watch_ = JobClock::now() + keep_alive_every_;
  for (const NodeInfo& n : plan_.nodes) {
    if (n.node_rank == rdzv_->self().node_rank) continue;
    if (!watch_.stale(n.node_rank, rdzv_->keep_alives(n.node_rank), JobClock::now())) continue;
    if (rdzv_->reported(plan_.round, n.node_rank)) continue;
    rdzv_->declare_lost(plan_.round, n, std::chrono::duration_cast<std::chrono::milliseconds>(rdzv_timeout_));
    return;  // one is enough: the round is over
  }
}

void Job::check_other_nodes() {
  // Every rank here has ended (this very wake-up): the attempt's outcome is theirs. Ranks that all exited 0 are this
  // node's report of done even when another node's failure came in the same moment (they once became a failure here,
  // its symptom, and whether they did depended on timing).
  if (all_ended() || JobClock::now() < next_check_) return;
  next_check_ = JobClock::now() + kRendezvousPoll;
  watch_keep_alives();
  std::optional<std::pair<int, std::string>> f = rdzv_->failure(plan_.round);
  if (!f) return;
  failure_ = f->second;
  // Another node's preemption (its dprun's stop signal, its ranks' exit 75) stops this node's ranks for it too: they
  // agree on the stop and exit 75, as that node's do. Any other failure is one here too, whatever this node's ranks
  // exit with: one still at the rendezvous answers the SIGTERM below with 75 at once (it once made this dprun end
  // the job with 75, "the ranks stopped for preemption", instead of restarting; a batch script requeued it).
  stopping_for_failure_ = f->first != kPreemptedCode && !rdzv_->stopped(plan_.round);
  // A preemption's stop gives the ranks --stop-timeout to reach the step and checkpoint it, as a stop signal to this
  // dprun does (it once gave them --grace-period: rank 0 was SIGKILLed before its checkpoint, the other node's ranks
  // failed, and this node restarted the job alone), and a stop signal to this dprun that follows is forwarded.
  preempting_ = !stopping_for_failure_;
  note(fmt::format("{}: stopping this node's ranks", failure_));
  report_failure_once(f->first, failure_);
  exit_code_ = f->first;
  begin_stop(SIGTERM, "stopping the other ranks", /*always_note=*/false);
}

std::optional<std::pair<int, std::string>> Job::round_failure(int round) {
  // Node 0 ends the job once every node has reported, and this one reported when its end began (a stop signal, a
  // failure), before its ranks were down: node 0 may be gone by now. This node's own end then stands (it once
  // exited 1, "lost the rendezvous at node 0", after a stop signal). Joining another round would fail, as it should.
  if (!master_gone_) {
    try {
      return rdzv_->failure(round);
    } catch (const CommError&) {
      if (rdzv_->is_master() || !reported_) throw;
      master_gone_ = true;
    }
  }
  note("node 0's rendezvous is gone (its dprun ends the job once every node has reported); this node's own end "
       "stands");
  return std::nullopt;
}

std::optional<int> Job::after_elastic_attempt() {
  const int round = plan_.round;
  if (exit_code_ == 0) {
    print_reason();
    reported_ = true;
    rdzv_->report_done(round);
    give_up(round);  // not a failure: it only tells node 0 that this node joins no further round
    if (rdzv_->is_master()) finish_as_master(round, 0, "the job finished (node 0's ranks did)");
    return 0;
  }
  if (failure_.empty()) failure_ = fmt::format("{}: its ranks ended with exit code {}", describe(rdzv_->self()), exit_code_);
  report_failure_once(exit_code_, failure_);
  // Every node names the round's failure alike: the rank killed by a signal, wherever it was (Rendezvous::failure),
  // and ends with its exit code, unless this node's own end says more (a stop signal, preemption, no program).
  // The reason line names it first too, when it is another node's (it once gave only this node's rank's error, its
  // connection to the killed rank reset, as if that were the cause).
  std::string cause_elsewhere;
  std::optional<std::pair<int, std::string>> f = round_failure(round);
  if (f) {
    const bool own_killed = failed_rank_ && failed_status_.signaled;
    const bool elsewhere = !f->second.starts_with(describe(rdzv_->self()) + ": ");
    if (!own_killed && elsewhere && rdzv_->signaled(round)) cause_elsewhere = f->second;
    // Another node's rank refused its configuration: its line is the reason here too.
    if (elsewhere && f->first == kConfigErrorCode && !rdzv_->signaled(round))
      cause_elsewhere = rdzv_->reason(round);
    // Another node's dprun was told to stop: its ranks went first, and this node's failed after them (a peer gone).
    if (!own_killed && cause_elsewhere.empty() && elsewhere && rdzv_->stopped(round)) cause_elsewhere = f->second;
    // Another node whose ranks all exited 0 while these still ran: they thought training was over, and the
    // failures here (their peers gone) follow from it, as from a rank of this node that exits 0 early.
    if (!own_killed && cause_elsewhere.empty() && !stop_requested_ && exit_code_ != kPreemptedCode)
      cause_elsewhere = finished_early(round);
    failure_ = f->second;
    if (!stop_requested_ && !exec_failed_ && exit_code_ != kPreemptedCode) exit_code_ = f->first;
  }
  print_reason(cause_elsewhere);
  std::string why;
  if (stop_requested_) why = "dprun was told to stop";
  else if (exec_failed_) why = "the program cannot be started";
  else if (exit_code_ == kPreemptedCode) why = "the ranks stopped for preemption";
  else if (exit_code_ == kConfigErrorCode) why = kConfigErrorWhy;
  // A stop signal to any node's dprun (Ctrl-C there) ends the job on every node. When this node's ranks did not exit 0
  // or 75 for it (a rank that failed on its peer, gone first; a program that dies of the SIGTERM), this node once
  // restarted the job without that node and trained on.
  else if (f && rdzv_->stopped(round)) why = "a node's dprun was told to stop, which ends the job on every node";
  // Node 0 gone after this node's report: it ended the job (restarts used, or a reason of its own to end it, such as a
  // program it cannot start). Joining the next round would only fail ("lost the rendezvous"; it once did, exit 1).
  if (!f && why.empty() && round < opts_.max_restarts) why = "node 0 has ended the job";
  if (!why.empty()) {
    note(fmt::format("{}; not restarting: {}", failure_, why));
    give_up(round);
    if (rdzv_->is_master()) finish_as_master(round, exit_code_, fmt::format("node 0: {}", why));
    return exit_code_;
  }
  if (round == opts_.max_restarts) {
    note(fmt::format("{}; all {} restart{} used, giving up", failure_, opts_.max_restarts,
                     opts_.max_restarts == 1 ? "" : "s"));
    give_up(round);
    if (rdzv_->is_master()) finish_as_master(round, exit_code_, fmt::format("all {} restarts used", opts_.max_restarts));
    return exit_code_;
  }
  note(fmt::format("{}; restart {} of {}: joining round {}", failure_, round + 1, opts_.max_restarts, round + 1));
  return enter_round(round + 1, exit_code_);
}

std::string Job::finished_early(int round) {
  if (master_gone_) return {};
  const int nodes = static_cast<int>(plan_.nodes.size());
  // A node that finished reports it once its ranks are reaped, maybe a moment after this node's failure: wait for it.
  (void)wait_for([&] { return rdzv_->reports(round) >= nodes; },
                 std::min<JobClock::duration>(rdzv_timeout_, kFinishedReportWait));
  std::vector<std::string> early;
  for (int i = 0; i < nodes; ++i) {
    const NodeInfo& n = plan_.nodes[static_cast<std::size_t>(i)];
    if (n.node_rank == rdzv_->self().node_rank || !rdzv_->done(round, n.node_rank)) continue;
    std::vector<int> ranks(static_cast<std::size_t>(n.nproc));
    for (int k = 0; k < n.nproc; ++k) ranks[static_cast<std::size_t>(k)] = plan_.first_rank(i) + k;
    early.push_back(fmt::format("{}: its {} exited 0", describe(n), join_ranks(ranks)));
  }
  if (early.empty()) return {};
  return fmt::format("{} before the others had finished", fmt::join(early, ", "));
}

void Job::give_up(int round) {  // and a node whose ranks finished
  if (rdzv_->is_master() || master_gone_) return;
  try {
    rdzv_->leave(round + 1);  // node 0 waits for it, as for the goodbye of a node that rejoins and reads the end
  } catch (const CommError&) {
    master_gone_ = true;  // it has stopped waiting: nothing to tell it
  }
}

void Job::finish_as_master(int round, int code, const std::string& why) {
  const JobClock::duration limit = stop_requested_ ? std::min<JobClock::duration>(rdzv_timeout_, kStoppedLinger) : rdzv_timeout_;
  const int nodes = static_cast<int>(plan_.nodes.size());
  if (rdzv_->reports(round) < nodes) note("waiting for the other nodes to finish");
  (void)wait_for([&] { return rdzv_->reports(round) >= nodes; }, limit);
  rdzv_->end(round + 1, code, why);
  // Every other node of `round` that reported and was not declared lost leaves round + 1: it rejoins, reads the end
  // and says goodbye, or it ends without joining (give_up). Wait for each, and for the goodbye of every node that
  // joined (late ones too). Node 0 once stopped serving while a node still tearing its ranks down was about to rejoin
  // (one that restarts where node 0 does not: node 0 could not start the program), and that node ended "lost the
  // rendezvous at node 0 ...; requeue the job", exit 1.
  std::vector<int> others;
  for (const NodeInfo& n : plan_.nodes) {
    const int r = n.node_rank;
    if (r != rdzv_->self().node_rank && rdzv_->reported(round, r) && !rdzv_->lost(round, r)) others.push_back(r);
  }
  (void)wait_for([&] {
    std::erase_if(others, [&](int r) { return rdzv_->left(round + 1, r); });
    return others.empty() && rdzv_->byes(round + 1) >= rdzv_->joined_count(round + 1);
  }, limit);
}

}  // namespace dpt::launcher
