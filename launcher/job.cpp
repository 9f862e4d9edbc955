// launcher/job.cpp: launch(): spawn the ranks, relay their output, watch them, tear the job down, and with
// --max-restarts start them all again after a failure.
//
// One thread, one poll loop over a signalfd (SIGCHLD and the stop signals) and the ranks' output pipes; each
// wake-up serves the signals first and reads each ready pipe at most once, so no rank can starve the loop.
// Ranks that end are observed with waitid(WNOWAIT) and reaped only at the very end: a zombie keeps its pid,
// hence its process group id, reserved, so signalling a rank's group can never hit an unrelated process.
// A restart begins only after every rank of the failed attempt has been reaped, with a fresh set of ranks.
// An elastic job (is_elastic) goes through a rendezvous round (launcher/rendezvous.h) before each attempt, and
// while its ranks run the loop also looks, every kRendezvousPoll, for a failure another node published.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

#include "comm/tcp_store.h"
#include "core/check.h"
#include "launcher/launcher.h"
#include "launcher/output.h"
#include "launcher/process.h"
#include "launcher/rendezvous.h"

namespace dpt::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// Elastic jobs: how often dprun looks at the rendezvous store while it waits or its ranks run (one small
// request each time), and the longest the master node waits for the others' goodbyes when it was told to stop.
constexpr std::chrono::milliseconds kRendezvousPoll{100};
// How often a node's dprun counts up its keep-alive (at most: a third of --rdzv-timeout when that is shorter), and
// node 0 looks at the others'.
constexpr std::chrono::milliseconds kKeepAliveEvery{1000};
constexpr std::chrono::seconds kStoppedLinger{10};

// dprun's own messages: one line on stderr, best effort.
void note(std::string_view msg) {
  clear_live_line();
  (void)write_fully(STDERR_FILENO, fmt::format("dprun: {}\n", msg));
}

bool is_loopback(const std::string& addr) {
  return addr.starts_with("127.") || addr == "localhost" || addr == "::1";
}

// With fd 0, 1 or 2 closed, the pipes and files opened below could land on them and be clobbered by the
// child's dup2 calls; /dev/null fills the gaps.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int got = ::open("/dev/null", O_RDWR);  // the lowest free fd: this one
    if (got < 0) DPT_THROW(IoError, "opening /dev/null failed: {}", std::strerror(errno));
    if (got != fd) {
      ::close(got);
      DPT_THROW(InternalError, "fd {} was closed, but /dev/null opened as fd {}", fd, got);
    }
  }
}

// "exit code 3", "killed by SIGKILL": how a rank ended, for the restart line.
std::string brief(const ExitStatus& st) {
  return st.signaled ? fmt::format("killed by {}", signal_name(st.code)) : fmt::format("exit code {}", st.code);
}

std::string join_ranks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

struct Rank {
  int local = 0;
  int global = 0;
  pid_t pid = -1;            // also its process group id
  bool ended = false;        // seen ended (a zombie until reaped)
  bool reaped = false;
  ExitStatus status;
  std::string log_path;      // with --log-dir
  std::unique_ptr<RankStream> out, err;  // without --log-dir
};

class Job {
 public:
  // `port_given`: the user chose opts.master_port (a restart keeps it whatever happens).
  Job(const Options& opts, Environment inherited, bool port_given)
      : opts_(opts),
        inherited_(std::move(inherited)),
        port_given_(port_given),
        elastic_(is_elastic(opts)),
        rdzv_timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.rdzv_timeout_s))),
        keep_alive_every_(std::min<Clock::duration>(kKeepAliveEvery, rdzv_timeout_ / 3)),
        watch_(rdzv_timeout_),
        stdout_(STDOUT_FILENO, "stdout"),
        stderr_(STDERR_FILENO, "stderr"),
        placement_(static_placement(opts_)) {}

  // The safety net: whatever happened (an exception included), nothing dprun started outlives it.
  ~Job() {
    for (Rank& r : ranks_) {
      if (r.pid <= 0 || r.reaped) continue;
      try {
        (void)signal_group(r.pid, SIGKILL);
        reap(r.pid);
      } catch (...) {  // nothing more to do in a destructor; PR_SET_PDEATHSIG remains as the last resort
      }
    }
    if (!reason_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(reason_dir_, ec);
    }
  }

  int run() {
    announce();
    open_stdin();
    make_reason_dir();
    if (!elastic_) return run_attempts();
    try {
      connect_rendezvous();
      if (std::optional<int> ended = enter_round(rdzv_->is_master() ? 0 : rdzv_->current_round(), 0)) return *ended;
      return run_attempts();
    } catch (const CommError& e) {
      if (rdzv_ && rdzv_->is_master()) throw;
      // Node 0 hosts the rendezvous and rank 0: without it there is no job (the ranks are SIGKILLed on the way out).
      DPT_THROW(CommError,
                "lost the rendezvous at node 0 ({}:{}): {}. An elastic job cannot go on without its master node "
                "(node 0); requeue the job (Slurm: sbatch --requeue)",
                *opts_.master_addr, *opts_.master_port, e.what());
    }
  }

 private:
  enum class Phase { kRunning, kStopping, kKilling };

  // Attempts until one ends the job: start the ranks, watch them, tear down, then restart or not.
  int run_attempts() {
    for (;;) {
      ranks_.reserve(static_cast<std::size_t>(opts_.nproc_per_node));
      for (int local = 0; local < opts_.nproc_per_node && phase_ == Phase::kRunning; ++local) start(local);
      monitor();
      finish();
      settle_preemption();
      print_reason();
      if (elastic_) {
        if (std::optional<int> code = after_elastic_attempt()) return *code;
        reset_attempt();
      } else if (!restart()) {
        return exit_code_;
      }
    }
  }

  void reset_attempt() {
    ranks_.clear();
    preempting_ = preempted_exit_ = false;
    phase_ = Phase::kRunning;
    exit_code_ = 0;
    failed_rank_.reset();
    failure_.clear();
    reported_ = false;
  }

  // ---- elastic jobs: the rendezvous rounds (launcher/rendezvous.h) ----

  // Node 0 hosts the rendezvous store at --master-port; every node (node 0 too) is a client of it. A node that
  // starts before node 0 keeps trying to connect for --rdzv-timeout.
  void connect_rendezvous() {
    comm::TcpStoreOptions so;
    so.host = *opts_.master_addr;
    so.port = *opts_.master_port;
    so.is_server = opts_.node_rank == 0;
    so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(rdzv_timeout_);
    so.token = opts_.store_token;
    store_ = std::make_unique<comm::TcpStore>(so);
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    std::string name = host;
    if (std::string addr = local_address_toward(*opts_.master_addr); !addr.empty()) {
      name += (name.empty() ? "" : " ") + addr;
    }
    rdzv_ = std::make_unique<Rendezvous>(*store_, NodeInfo{opts_.node_rank, opts_.nproc_per_node, name});
  }

  // Calls `done` every kRendezvousPoll until it returns true (then true), `limit` has passed or a stop signal
  // arrives meanwhile (then false; stop_requested_ says which). Serves dprun's signals while it waits.
  bool wait_for(const std::function<bool()>& done, std::optional<Clock::duration> limit = std::nullopt) {
    const Clock::time_point until = limit ? Clock::now() + *limit : Clock::time_point::max();
    bool stopped = false;
    for (;;) {
      keep_alive();
      if (done()) return true;
      if (stopped || Clock::now() >= until) return false;
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

  // Joins rounds from `round` on until one places this node: returns nullopt with the attempt's placement set,
  // or the exit code when the job ended there (`own_code` when this node's last attempt failed, else the
  // master's) or dprun was told to stop while waiting.
  std::optional<int> enter_round(int round, int own_code) {
    for (;; ++round) {
      rdzv_->join(round);
      const Clock::time_point joined_at = Clock::now();
      std::optional<RoundPlan> plan;
      const bool closed = wait_for([&] {
        plan = rdzv_->is_master() ? master_close(round, Clock::now() - joined_at >= rdzv_timeout_) : rdzv_->closed(round);
        return plan.has_value();
      });
      if (!closed) {  // a stop signal
        const int code = 128 + received_signal_;
        if (rdzv_->is_master()) {
          rdzv_->end(round, code, fmt::format("node 0's dprun received {}", signal_name(received_signal_)));
          linger(round, /*self_joined=*/1, 0, kStoppedLinger);
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
      const int index = plan->index_of(opts_.node_rank);
      if (index < 0) {
        note(fmt::format("round {} began with {} nodes, without this one: waiting for the next round (after a "
                         "failure), which takes up to {} nodes",
                         round, plan->nodes.size(), opts_.nnodes));
        continue;
      }
      plan_ = *plan;
      watch_.reset();
      restarts_ = round;
      placement_ = Placement{plan_.first_rank(index), plan_.world_size(), index, plan_.rank_port};
      std::vector<std::string> names;
      for (const NodeInfo& n : plan_.nodes) names.push_back(describe(n));
      note(fmt::format("round {}: {} node{} ({}), world size {}; this node runs ranks {}..{}", round,
                       plan_.nodes.size(), plan_.nodes.size() == 1 ? "" : "s", fmt::join(names, ", "),
                       placement_.world_size, placement_.first_rank,
                       placement_.first_rank + opts_.nproc_per_node - 1));
      return std::nullopt;
    }
  }

  // Node 0: closes `round` when decide_round says so, and returns its plan (nullopt: keep waiting).
  std::optional<RoundPlan> master_close(int round, bool timed_out) {
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

  // Node 0, ending the job: waits until the nodes that join `round` (less itself, `self_joined`), and at least
  // `expected` of them, have read its end, for at most `limit`: the store must outlive their last request.
  void linger(int round, int self_joined, int expected, Clock::duration limit) {
    (void)wait_for([&] {
      return rdzv_->byes(round) >= std::max(expected, rdzv_->joined_count(round) - self_joined);
    }, limit);
  }

  // This node's outcome in the store, once per round: the first failure's text is what every node prints.
  void report_failure_once(int code, const std::string& what, bool by_signal = false) {
    if (!elastic_ || !rdzv_ || reported_) return;
    reported_ = true;
    rdzv_->report_failure(plan_.round, code, what, by_signal);
  }

  // Every node but the master: counts up its keep-alive, every keep_alive_every_ (called on every wake-up of its
  // waits and of the ranks' watch).
  void keep_alive() {
    if (!rdzv_ || rdzv_->is_master() || Clock::now() < next_keep_alive_) return;
    next_keep_alive_ = Clock::now() + keep_alive_every_;
    rdzv_->keep_alive();
  }

  // The master, while its ranks run: publishes as the round's failure a node whose keep-alive has stopped for
  // --rdzv-timeout and that has not reported (done, or failed) in this round. Its ranks' peers may be blocked on
  // it for dist.timeout_s; this is the bounded time.
  void watch_keep_alives() {
    if (!rdzv_->is_master() || Clock::now() < next_watch_) return;
    next_watch_ = Clock::now() + keep_alive_every_;
    for (const NodeInfo& n : plan_.nodes) {
      if (n.node_rank == rdzv_->self().node_rank) continue;
      if (!watch_.stale(n.node_rank, rdzv_->keep_alives(n.node_rank), Clock::now())) continue;
      if (rdzv_->reported(plan_.round, n.node_rank)) continue;
      rdzv_->declare_lost(plan_.round, n, std::chrono::duration_cast<std::chrono::milliseconds>(rdzv_timeout_));
      return;  // one is enough: the round is over
    }
  }

  // Between polls of the ranks: has another node published a failure in this round (or, on the master, gone
  // silent)? Then stop this node's ranks.
  void check_other_nodes() {
    if (Clock::now() < next_check_) return;
    next_check_ = Clock::now() + kRendezvousPoll;
    watch_keep_alives();
    std::optional<std::pair<int, std::string>> f = rdzv_->failure(plan_.round);
    if (!f) return;
    failure_ = f->second;
    note(fmt::format("{}: stopping this node's ranks", failure_));
    report_failure_once(f->first, failure_);
    exit_code_ = f->first;
    begin_stop(SIGTERM, /*received=*/false);
  }

  // After an elastic attempt: node 0 ends the job or every node joins the next round. Returns the exit code,
  // or nullopt when this node runs the next attempt.
  std::optional<int> after_elastic_attempt() {
    const int round = plan_.round;
    if (exit_code_ == 0) {
      reported_ = true;
      rdzv_->report_done(round);
      if (rdzv_->is_master()) finish_as_master(round, 0, "the job finished (node 0's ranks did)");
      return 0;
    }
    if (failure_.empty()) failure_ = fmt::format("{}: its ranks ended with exit code {}", describe(rdzv_->self()), exit_code_);
    report_failure_once(exit_code_, failure_);
    // Every node names the round's failure alike: the rank killed by a signal, wherever it was (Rendezvous::failure),
    // and ends with its exit code, unless this node's own end says more (a stop signal, preemption, no program).
    if (std::optional<std::pair<int, std::string>> f = rdzv_->failure(round)) {
      failure_ = f->second;
      if (!stop_requested_ && !exec_failed_ && exit_code_ != kPreemptedCode) exit_code_ = f->first;
    }
    std::string why;
    if (stop_requested_) why = "dprun was told to stop";
    else if (exec_failed_) why = "the program cannot be started";
    else if (exit_code_ == kPreemptedCode) why = "the ranks stopped for preemption";
    if (!why.empty()) {
      note(fmt::format("{}; not restarting: {}", failure_, why));
      if (rdzv_->is_master()) finish_as_master(round, exit_code_, fmt::format("node 0: {}", why));
      return exit_code_;
    }
    if (round == opts_.max_restarts) {
      note(fmt::format("{}; all {} restart{} used, giving up", failure_, opts_.max_restarts,
                       opts_.max_restarts == 1 ? "" : "s"));
      if (rdzv_->is_master()) finish_as_master(round, exit_code_, fmt::format("all {} restarts used", opts_.max_restarts));
      return exit_code_;
    }
    note(fmt::format("{}; restart {} of {}: joining round {}", failure_, round + 1, opts_.max_restarts, round + 1));
    return enter_round(round + 1, exit_code_);
  }

  // Node 0's last duty: wait (up to --rdzv-timeout) until every node of `round` has reported its outcome, end
  // round + 1 for whoever joins it (nodes that failed and rejoin, late nodes), and wait for their goodbyes.
  void finish_as_master(int round, int code, const std::string& why) {
    const Clock::duration limit = stop_requested_ ? std::min<Clock::duration>(rdzv_timeout_, kStoppedLinger) : rdzv_timeout_;
    const int nodes = static_cast<int>(plan_.nodes.size());
    if (rdzv_->reports(round) < nodes) note("waiting for the other nodes to finish");
    (void)wait_for([&] { return rdzv_->reports(round) >= nodes; }, limit);
    rdzv_->end(round + 1, code, why);
    // The others that failed rejoin unless they gave up too (restarts used up, a stop signal).
    const bool they_rejoin = code == 0 && round < opts_.max_restarts;
    linger(round + 1, /*self_joined=*/0, they_rejoin ? rdzv_->failures(round) : 0, limit);
  }

  // After an attempt has ended and every rank is reaped: starts the next one if it should be (a rank failed,
  // dprun was not told to stop, restarts are left) and returns true; otherwise returns false.
  bool restart() {
    if (exit_code_ == 0 || !failed_rank_) return false;  // success, or dprun was told to stop
    // Without restarts, leave a late stop signal pending: it is delivered when the signal mask is restored.
    if (opts_.max_restarts == 0) return false;
    // A stop signal that came after the last look (during the final reaping) still forbids a restart.
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD) continue;
      stop_requested_ = true;
      note(fmt::format("received {}", signal_name(sig)));
    }
    const std::string failure = fmt::format("rank {} failed ({})", *failed_rank_, brief(failed_status_));
    if (stop_requested_) {
      note(fmt::format("{}; not restarting: dprun was told to stop", failure));
      return false;
    }
    if (exec_failed_) {
      note(fmt::format("{}; not restarting: the program cannot be started", failure));
      return false;
    }
    if (restarts_ == opts_.max_restarts) {
      note(fmt::format("{}; all {} restart{} used, giving up", failure, opts_.max_restarts,
                       opts_.max_restarts == 1 ? "" : "s"));
      return false;
    }
    ++restarts_;
    note(fmt::format("{}; restart {} of {}", failure, restarts_, opts_.max_restarts));
    if (!port_given_ && !port_bindable(*opts_.master_port)) {
      // dprun chose the port, and something else has taken it since: choose again rather than fail.
      int old = *opts_.master_port;
      opts_.master_port = find_free_port();  // as resolve() does
      placement_.master_port = *opts_.master_port;
      note(fmt::format("master port {} is taken now; using {}", old, *opts_.master_port));
    }
    reset_attempt();
    return true;
  }

  void announce() {
    int world = opts_.nnodes * opts_.nproc_per_node;
    int first = global_rank(opts_, 0);
    int last = global_rank(opts_, opts_.nproc_per_node - 1);
    std::string master = fmt::format("{}:{}", *opts_.master_addr, *opts_.master_port);
    if (elastic_) {
      note(fmt::format("node {}: elastic job of {} to {} nodes, {} rank{} each, up to {} restart{}; rendezvous {} {}",
                       opts_.node_rank, min_nodes(opts_), opts_.nnodes, opts_.nproc_per_node,
                       opts_.nproc_per_node == 1 ? "" : "s", opts_.max_restarts, opts_.max_restarts == 1 ? "" : "s",
                       opts_.node_rank == 0 ? "hosted here at" : "at", master));
      first = 0;  // the ranks' numbers come with each round
      last = world - 1;
    } else if (opts_.nnodes == 1) {
      note(fmt::format("starting {} rank{} (world size {}), master {}", world, world == 1 ? "" : "s", world, master));
    } else {
      note(fmt::format("node {} of {}: starting ranks {}..{} of world size {}, master {}", opts_.node_rank,
                       opts_.nnodes, first, last, world, master));
    }
    if (!opts_.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(opts_.log_dir, ec);
      if (ec) DPT_THROW(IoError, "cannot create --log-dir {}: {}", opts_.log_dir, ec.message());
      note(fmt::format("writing each rank's stdout and stderr to {}/rank_{}.log{}", opts_.log_dir, first,
                       first == last ? "" : fmt::format(" .. rank_{}.log", last)));
    }
  }

  void open_stdin() {
    // Ranks run in their own process groups, in the background of the terminal: one reading the terminal
    // would be stopped by SIGTTIN and hang the job. They read end-of-file instead.
    devnull_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (devnull_.get() < 0) DPT_THROW(IoError, "opening /dev/null failed: {}", std::strerror(errno));
  }

  void start(int local) {
    Rank& r = ranks_.emplace_back();
    r.local = local;
    r.global = placement_.first_rank + local;

    ChildSpec spec;
    spec.argv = opts_.command;
    Environment env = rank_environment(opts_, placement_, local, inherited_, restarts_);
    if (!reason_dir_.empty()) env["DPT_REASON_FILE"] = reason_dir_ + "/reason";  // see make_reason_dir
    for (const auto& [name, value] : env) {
      spec.env.push_back(name + "=" + value);
    }
    spec.stdin_fd = devnull_.get();

    Fd log;
    Pipe out, err;
    if (!opts_.log_dir.empty()) {
      r.log_path = fmt::format("{}/rank_{}.log", opts_.log_dir, r.global);
      // A restarted rank's output goes after the earlier attempts', below a line that says so.
      const int mode = restarts_ == 0 ? O_TRUNC : O_APPEND;
      log = Fd(::open(r.log_path.c_str(), O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644));
      if (log.get() < 0) DPT_THROW(IoError, "cannot open {}: {}", r.log_path, std::strerror(errno));
      if (restarts_ > 0) {
        (void)write_fully(log.get(), fmt::format("dprun: restart {} of {} (DPT_RESTART_COUNT={})\n", restarts_,
                                                 opts_.max_restarts, restarts_));
      }
      spec.stdout_fd = spec.stderr_fd = log.get();
    } else {
      out = make_pipe();
      err = make_pipe();
      spec.stdout_fd = out.write.get();
      spec.stderr_fd = err.write.get();
    }

    Spawned s = spawn(spec, signals_);
    r.pid = s.pid;
    if (!opts_.log_dir.empty()) {
      log.reset();
    } else {
      // Only the child holds the write ends now, so end of file means it (and all it started) is done.
      out.write.reset();
      err.write.reset();
      std::string prefix = fmt::format("[rank {}] ", r.global);
      r.out = std::make_unique<RankStream>(nonblocking(std::move(out.read)), prefix, stdout_);
      r.err = std::make_unique<RankStream>(nonblocking(std::move(err.read)), prefix, stderr_);
    }
    if (!s.error.empty()) {
      r.ended = r.reaped = true;
      r.status = ExitStatus{false, kExecFailedCode, false};
      exec_failed_ = true;
      fail({&r}, {s.error + fmt::format(" (exit code {})", kExecFailedCode)});
    }
  }

  static int nonblocking(Fd fd) {
    int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
      DPT_THROW(IoError, "fcntl(O_NONBLOCK) on a rank's pipe failed: {}", std::strerror(errno));
    }
    return fd.release();
  }

  bool all_ended() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.ended; });
  }

  void monitor() {
    std::vector<pollfd> fds;
    std::vector<RankStream*> streams;  // streams[i] goes with fds[i + 1]
    while (!all_ended()) {
      fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
      streams.clear();
      for (Rank& r : ranks_) {
        for (RankStream* s : {r.out.get(), r.err.get()}) {
          if (s && s->open()) {
            fds.push_back(pollfd{s->fd(), POLLIN, 0});
            streams.push_back(s);
          }
        }
      }
      int timeout_ms = -1;
      if (phase_ == Phase::kStopping) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<decltype(left)>(left, 0, 1000 * 1000));
      }
      if (elastic_) {  // to look for other nodes' failures, and count up the keep-alive (in a teardown too)
        const int poll_ms = static_cast<int>(kRendezvousPoll.count());
        timeout_ms = timeout_ms < 0 ? poll_ms : std::min(timeout_ms, poll_ms);
      }
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) DPT_THROW(IoError, "poll failed: {}", std::strerror(errno));
      if (n > 0) {
        // Signals first: they are served on every wake-up however busy the pipes are. (A rank's last words
        // still come before dprun's line about its end: check_ranks drains its pipes before that line.)
        if (fds[0].revents != 0) handle_signals();
        // Then one bounded read per ready pipe, so a rank that writes without pause cannot starve the loop.
        // A stream closed by handle_signals is skipped by pump().
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) streams[i - 1]->pump();
        }
      }
      if (phase_ == Phase::kStopping && Clock::now() >= deadline_) kill_remaining();
      if (elastic_) keep_alive();
      if (elastic_ && phase_ == Phase::kRunning) check_other_nodes();
    }
  }

  void handle_signals() {
    bool child_ended = false;
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD) {
        child_ended = true;
      } else {
        on_stop_signal(sig);
      }
    }
    if (child_ended) check_ranks();
  }

  // Signals coalesce: one SIGCHLD may stand for several ranks, so every running rank is asked. Ranks found ended
  // badly together are named killed-by-a-signal first: such a rank died at once (kill -9, the OOM killer, a
  // crash), while one that exited with a code is most likely reacting to it (its peer's connection reset), and
  // the first named is the job's failure (its exit code, its reason).
  void check_ranks() {
    std::vector<Rank*> ended;
    for (Rank& r : ranks_) {
      if (r.ended) continue;
      std::optional<ExitStatus> st = peek_exit(r.pid);
      if (!st) continue;
      r.ended = true;
      r.status = *st;
      ended.push_back(&r);
    }
    std::stable_partition(ended.begin(), ended.end(), [](const Rank* r) { return r->status.signaled; });
    std::vector<Rank*> failed;
    std::vector<std::string> why;
    for (Rank* r : ended) {
      for (RankStream* s : {r->out.get(), r->err.get()}) {
        if (s) s->drain();  // its last words, before the line about its end
      }
      if (!r->status.signaled && r->status.code == kPreemptedCode) {
        on_preempted_exit(*r);
        continue;
      }
      if (!r->status.ok()) {
        failed.push_back(r);
        why.push_back(r->status.describe() + (r->log_path.empty() ? "" : fmt::format("; see {}", r->log_path)));
      }
    }
    if (!failed.empty()) fail(failed, why);
  }

  // Ranks ended badly on their own. The first failure names the culprits and starts the teardown; ranks that
  // end while it is under way were most likely stopped by it and are not reported.
  void fail(const std::vector<Rank*>& failed, const std::vector<std::string>& why) {
    if (phase_ != Phase::kRunning) return;
    for (std::size_t i = 0; i < failed.size(); ++i) {
      const Rank& r = *failed[i];
      note(fmt::format("rank {} (pid {}) {}", r.global, r.pid, why[i]));
    }
    exit_code_ = failed.front()->status.exit_code();
    failed_rank_ = failed.front()->global;
    failed_status_ = failed.front()->status;
    failure_ = fmt::format("{}: rank {} failed ({})", elastic_ ? describe(rdzv_->self()) : "this node", *failed_rank_,
                           brief(failed_status_));
    report_failure_once(exit_code_, failure_, failed_status_.signaled);
    begin_stop(SIGTERM, /*received=*/false);
  }

  static bool is_preemption(int sig) { return sig == SIGUSR1 || sig == SIGTERM; }

  void on_stop_signal(int sig) {
    stop_requested_ = true;  // whenever it comes: no restart after it
    const int first = received_signal_;
    if (received_signal_ == 0) received_signal_ = sig;
    if (phase_ == Phase::kRunning) {
      exit_code_ = 128 + sig;
      if (elastic_) {
        failure_ = fmt::format("{}: its dprun received {}", describe(rdzv_->self()), signal_name(sig));
        report_failure_once(exit_code_, failure_);
      }
      preempting_ = is_preemption(sig);
      begin_stop(sig, /*received=*/true);
    } else if (phase_ == Phase::kStopping && preempting_ && (sig == SIGUSR1 || (sig == SIGTERM && first != SIGTERM))) {
      // The ranks are checkpointing: SIGUSR1 again, or SIGTERM after a SIGUSR1 (Slurm's warning, then its time
      // limit) must not cut that short. It is forwarded (a rank keeps only the first) and the deadline stays.
      // SIGTERM twice, SIGINT or SIGHUP still mean "now", below.
      note(fmt::format("received {} while the ranks stop for preemption: forwarded; the stop timeout stays", signal_name(sig)));
      signal_all(sig);
    } else if (phase_ == Phase::kStopping) {
      note(fmt::format("received {} again: not waiting for the grace period", signal_name(sig)));
      kill_remaining();
    }
  }

  // Sends `sig` to every rank's process group (a rank that has ended may have left processes behind in
  // it), then gives the ranks the grace period before SIGKILL. `received`: dprun was sent `sig` itself.
  void begin_stop(int sig, bool received) {
    phase_ = Phase::kStopping;
    const double wait_s = preempting_ ? opts_.stop_timeout_s : opts_.grace_period_s;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
    std::string why = received ? fmt::format("received {}", signal_name(sig)) : "stopping the other ranks";
    std::vector<int> running = running_ranks();
    if (!running.empty()) {
      note(fmt::format("{}: sending {} to {}; SIGKILL after {} s to any still running", why, signal_name(sig),
                       join_ranks(running), wait_s));
    } else if (received) {
      note(why);
    }
    signal_all(sig);
    // A stopped rank (SIGSTOP, Ctrl-Z) would see `sig` only when continued, i.e. at the SIGKILL: continue it now.
    signal_all(SIGCONT);
  }

  // DPT_REASON_FILE, given to every rank: a private temporary directory's "reason", where the rank that diagnoses
  // a failure (a hang report names the stuck rank) writes one line, first writer wins. Without the directory the
  // ranks get no variable, and the job runs all the same.
  void make_reason_dir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string path = fmt::format("{}/dprun.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (::mkdtemp(path.data())) {
      reason_dir_ = path;
    } else {
      note(fmt::format("cannot create a temporary directory {} for the ranks' failure reason: {}", path,
                       std::strerror(errno)));
    }
  }

  // After an attempt has ended: when it failed, "dprun: reason: ...", once: the line a rank left (failure_reason:
  // after the name and signal of a rank killed by one, which could leave none); the file is removed so that a
  // restart starts without one.
  void print_reason() {
    if (reason_dir_.empty()) return;
    const std::string path = reason_dir_ + "/reason";
    std::string line;
    if (Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); fd.get() >= 0) {
      char buf[4096];
      const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n > 0) line.assign(buf, static_cast<std::size_t>(n));
      line = line.substr(0, line.find('\n'));
    }
    if (exit_code_ != 0) {
      // A rank's own failure names it (a signal it could not report), else the line written is the reason.
      const std::string reason = failed_rank_ ? failure_reason(*failed_rank_, failed_status_, line) : line;
      if (!reason.empty()) note("reason: " + reason);
    }
    ::unlink(path.c_str());
  }

  // A rank exited kPreemptedCode: it stopped for a stop signal after all ranks agreed on the step and rank 0's
  // checkpoint was written (dptrain), so the others are about to do the same. Not a failure: no teardown, but
  // a deadline (the stop timeout) for the rest.
  void on_preempted_exit(const Rank& r) {
    preempted_exit_ = true;
    if (phase_ != Phase::kRunning) return;
    note(fmt::format("rank {} stopped for preemption (exit code {}); waiting up to {} s for the others",
                     r.global, kPreemptedCode, opts_.stop_timeout_s));
    phase_ = Phase::kStopping;
    preempting_ = true;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(opts_.stop_timeout_s));
  }

  // After every rank has ended: when some rank stopped for preemption and every rank exited 0 or 75, the job
  // was preempted (75); when some did not, the first of those is the job's failure.
  void settle_preemption() {
    if (!preempted_exit_) return;
    const Rank* bad = nullptr;
    for (const Rank& r : ranks_) {
      const bool clean = !r.status.signaled && (r.status.code == 0 || r.status.code == kPreemptedCode);
      if (!clean && !bad) bad = &r;
    }
    if (!bad) {
      exit_code_ = kPreemptedCode;
      note(fmt::format("the ranks stopped for preemption with a checkpoint; exit code {}", kPreemptedCode));
    } else if (exit_code_ == 0) {
      exit_code_ = bad->status.exit_code();
      note(fmt::format("rank {} {} while the others stopped for preemption", bad->global, bad->status.describe()));
    }
  }

  void kill_remaining() {
    phase_ = Phase::kKilling;
    std::vector<int> running = running_ranks();
    if (!running.empty()) note(fmt::format("sending SIGKILL to {}", join_ranks(running)));
    signal_all(SIGKILL);
  }

  std::vector<int> running_ranks() const {
    std::vector<int> out;
    for (const Rank& r : ranks_) {
      if (!r.ended) out.push_back(r.global);
    }
    return out;
  }

  void signal_all(int sig) {
    for (const Rank& r : ranks_) {
      if (r.reaped) continue;
      int err = signal_group(r.pid, sig);
      // ESRCH: the group is empty. (A group holding only the zombie rank takes the signal without complaint.)
      if (err != 0 && err != ESRCH) {
        note(fmt::format("cannot send {} to rank {} (process group {}): {}", signal_name(sig), r.global, r.pid,
                         std::strerror(err)));
      }
    }
  }

  void finish() {
    // Every rank has ended. Relay what is left in the pipes without waiting for a grandchild that may hold
    // one open, then make sure such leftovers do not outlive the job: SIGTERM after a clean run, SIGKILL after
    // a teardown (they have had their SIGTERM).
    for (Rank& r : ranks_) {
      if (r.out) r.out->finish();
      if (r.err) r.err->finish();
    }
    signal_all(phase_ == Phase::kRunning ? SIGTERM : SIGKILL);
    for (Rank& r : ranks_) {
      if (r.reaped) continue;
      reap(r.pid);
      r.reaped = true;
    }
  }

  Options opts_;  // master_port may change between attempts
  Environment inherited_;
  const bool port_given_;
  const bool elastic_;                  // is_elastic(opts_): rendezvous rounds
  const Clock::duration rdzv_timeout_;  // --rdzv-timeout
  const Clock::duration keep_alive_every_;
  KeepAliveWatch watch_;  // the master's, over the other nodes of the round running
  SignalCatcher signals_;  // before any fork: a signal arriving during the spawning stays pending
  OutputSink stdout_, stderr_;
  Fd devnull_;
  std::string reason_dir_;  // DPT_REASON_FILE's directory; empty: none (make_reason_dir)
  std::vector<Rank> ranks_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point deadline_{};
  int exit_code_ = 0;
  // The attempt under way: restarts so far (its DPT_RESTART_COUNT), and the rank whose failure ended it.
  int restarts_ = 0;
  std::optional<int> failed_rank_;
  ExitStatus failed_status_;
  bool stop_requested_ = false;  // dprun received SIGINT, SIGTERM, SIGHUP or SIGUSR1
  int received_signal_ = 0;      // the first stop signal dprun received
  bool preempting_ = false;      // the stop under way is for preemption (SIGUSR1/SIGTERM, or a rank exited 75)
  bool preempted_exit_ = false;  // a rank exited kPreemptedCode
  bool exec_failed_ = false;     // the program could not be started: a restart would fail the same way
  Placement placement_;          // this attempt's ranks in the world (a round's, when elastic)
  // Elastic jobs: the store (hosted here on node 0), the rendezvous over it, the round running, and whether this
  // node's outcome of it is published; failure_: what ended the attempt, as every node prints it.
  std::unique_ptr<comm::TcpStore> store_;
  std::unique_ptr<Rendezvous> rdzv_;
  RoundPlan plan_;
  bool reported_ = false;
  std::string failure_;
  Clock::time_point next_check_{}, next_keep_alive_{}, next_watch_{};
};

}  // namespace

int launch(const Options& given) {
  Options opts = resolve(given);
  ensure_standard_fds();
  Environment inherited = current_environment();
  // One token for the whole job, every attempt of it: the Job keeps these options across restarts.
  opts.store_token = job_store_token(opts, inherited);
  if (!inherited.contains("OMP_NUM_THREADS")) {
    note("setting OMP_NUM_THREADS=1 for every rank, so that the ranks do not overload the machine; set it "
         "yourself to tune it");
  }
  if (opts.nnodes > 1 && is_loopback(*opts.master_addr)) {
    note(fmt::format("warning: --master-addr {} is a loopback address: the other nodes cannot reach it unless "
                     "all {} nodes run on this machine",
                     *opts.master_addr, opts.nnodes));
  }
  Job job(opts, std::move(inherited), /*port_given=*/given.master_port.has_value());
  return job.run();
}

}  // namespace dpt::launcher
