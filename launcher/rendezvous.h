// launcher/rendezvous.h: the elastic rendezvous of dprun's nodes (--nnodes MIN:MAX, or --max-restarts with
// --nnodes > 1), torchrun's c10d rendezvous without Python. The master node's dprun (--node-rank 0) hosts a
// TcpStore at --master-addr:--master-port for the job's whole life; every node's dprun, the master's included,
// is a client of it. A job runs in rounds 0, 1, 2, ...:
//   - each node joins round k: a slot (counter rdzv/k/joined) and its record (rdzv/k/node/SLOT: node rank,
//     ranks on it, its name);
//   - the master alone closes the round (decide_round): when MAX nodes have joined, or when --rdzv-timeout has
//     passed since it joined with at least MIN; it writes the round's plan (rdzv/k/plan: the port the ranks
//     rendezvous at, the nodes in node-rank order) or the job's end (its exit code and why), then rdzv/k/closed;
//   - ranks are numbered node after node in node-rank order, so the master's ranks come first (rank 0 is there);
//   - a failure on any node is published (counter rdzv/k/failed, text rdzv/k/failure, the first one's); every
//     node tears its ranks down, reports (failed or done) and joins round k+1: DPT_RESTART_COUNT is the round;
//   - every other node's dprun counts up its keep-alive (rdzv/alive/NODE_RANK) about once a second; while the
//     round's ranks run, the master publishes as the round's failure a node whose count has not moved for
//     --rdzv-timeout and that has not reported (KeepAliveWatch): a host that froze or vanished with its ranks'
//     peers blocked on it.
// Every call here is one or a few store requests and never waits for another node: the waiting is dprun's
// poll loop (launcher/job.cpp), so that its signals are served meanwhile. Store errors (CommError,
// TimeoutError) propagate: a node that lost the master's store cannot go on.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"

namespace dpt::launcher {

// One node as it joined a round.
struct NodeInfo {
  int node_rank = 0;  // --node-rank: the node's identity for the whole job; 0 is the master
  int nproc = 1;      // ranks it runs
  std::string name;   // host name and address toward the master, for messages ("hostB 10.0.0.2")
  int slot = 0;       // its place in the order the round's nodes joined (1, 2, ...; 0: unknown): which dprun it is
};

// "node 1 (hostB 10.0.0.2)".
std::string describe(const NodeInfo& node);

// A closed round: the nodes that run it, or the job's end.
struct RoundPlan {
  int round = 0;
  bool ended = false;      // the master ended the job in this round: end_code, end_message
  int end_code = 0;
  std::string end_message;
  int rank_port = 0;             // MASTER_PORT of this round's ranks (rank 0 hosts their store there)
  std::vector<NodeInfo> nodes;   // in node-rank order; the master first

  // This node's index in `nodes`, or -1 when it came too late for this round. With `slot` (the one join() gave this
  // dprun), -1 also when another dprun runs the round as `node_rank` (--node-rank given twice, or a node's dprun
  // started again while the round still counts its first one).
  int index_of(int node_rank, int slot = 0) const;
  int world_size() const;
  int first_rank(int index) const;  // global rank of the first rank of nodes[index]
};

// The plan as the store holds it, and back. decode throws CommError for text that is not a plan.
std::string encode_plan(const RoundPlan& plan);
RoundPlan decode_plan(int round, const std::string& text);

// What the master does with a round, given the nodes that have joined it (in the order they joined):
// keep waiting, run it with `nodes`, or end the job with `message`. Pure.
struct RoundDecision {
  enum class Kind { kWait, kRun, kEnd } kind = Kind::kWait;
  std::vector<NodeInfo> nodes;  // kRun: the first max_nodes to join, in node-rank order
  std::string message;          // kEnd
};
// `timed_out`: --rdzv-timeout has passed since the master joined. `previous`: the nodes of the last round that
// ran (empty before the first), to name those missing.
RoundDecision decide_round(const std::vector<NodeInfo>& joined, int min_nodes, int max_nodes, bool timed_out,
                           std::chrono::milliseconds timeout, const std::vector<NodeInfo>& previous, int round);

// The store's keys for one job's rendezvous, as operations a node performs.
class Rendezvous {
 public:
  Rendezvous(comm::Store& store, NodeInfo self);
  const NodeInfo& self() const { return self_; }
  bool is_master() const { return self_.node_rank == 0; }

  // The newest round the master has opened (0 before it opened any): where a node that starts late joins.
  int current_round();
  // Takes a slot in `round` and writes this node's record; returns the slot. The master also makes `round` the
  // current one.
  int join(int round);
  // The plan once the master has closed `round`; nullopt while it is open.
  std::optional<RoundPlan> closed(int round);
  // Master: the nodes that have joined `round` so far, in the order they joined, less those withdrawn.
  std::vector<NodeInfo> joined(int round);
  // A node that stops while it waits for `round` to close (a stop signal) takes back its slot, so that the master
  // does not close the round with it (its ranks would never come), and says goodbye.
  void withdraw(int round, int slot);
  // Master: writes the plan of `round` (plan.round) and closes it.
  void close(const RoundPlan& plan);
  // Master: closes `round` with the job's end: every node that joins it learns `code` and `message`.
  void end(int round, int code, const std::string& message);

  // This node's attempt in `round` failed (exit `code`; `what` says how; `by_signal`: a rank was killed by a
  // signal; `stop`: its dprun was told to stop, which every node's ranks stop for) or finished. Call one of them
  // once per node and round.
  void report_failure(int round, int code, const std::string& what, bool by_signal = false, bool stop = false);
  void report_done(int round);
  // The failure of `round` as every node names it: its exit code and text; nullopt when none was reported.
  // A rank killed by a signal (kill -9, the OOM killer) is the cause, and its peers' failures on other nodes
  // (a connection reset) only symptoms, whichever node reported first: the first report of a rank killed by a
  // signal wins, else the first configuration error (exit kConfigErrorCode: its peers' connection reset may be
  // reported first, and would restart the job), else the first report.
  std::optional<std::pair<int, std::string>> failure(int round);
  // Nodes that have reported (failed or done) in `round`, and those that reported a failure.
  int reports(int round);
  int failures(int round);
  // Whether the master declared `node_rank` lost in `round`.
  bool lost(int round, int node_rank);
  // Whether a node reported `round`'s end as its dprun's stop signal (report_failure's `stop`).
  bool stopped(int round);
  // Whether `round`'s failure (failure()) is a rank killed by a signal.
  bool signaled(int round);
  // The line a failed rank left (DPT_REASON_FILE), published by its node before its report_failure so that the
  // other nodes can print it too (a configuration error: every node ends the job with it); the first one stays.
  // reason(): empty when none was published.
  void publish_reason(int round, const std::string& line);
  std::string reason(int round);
  // After reading an ended round's plan, a node says goodbye, so that the master knows it may stop serving.
  void bye(int round);
  int byes(int round);
  // A node of round k that ends without joining round k + 1 (its ranks finished, or it gives up: restarts used, no
  // restart for its reason) leaves it: leave(k + 1). bye(k + 1) leaves it too. left(): whether `node_rank` has.
  void leave(int round);
  bool left(int round, int node_rank);
  int joined_count(int round);
  // Whether `node_rank` has reported (failed or done) in `round`, and whether it reported done (report_done: its
  // ranks all exited 0).
  bool reported(int round, int node_rank);
  bool done(int round, int node_rank);

  // Master: marks the store as an elastic job's rendezvous (comm::kElasticRendezvousKey), first thing. Other nodes:
  // whether it is marked so (a plain job's rank 0 serves no such key), and the message a rank of a node started as a
  // plain job left when it came here instead of to its rank 0 (comm::kNotElasticKey; empty: none).
  void mark_elastic();
  bool marked_elastic();
  std::string not_elastic();

  // Keep-alives: each node but the master counts up its own; the master reads the others'.
  void keep_alive();
  int64_t keep_alives(int node_rank);
  // Master: publishes `node` lost in `round` (its keep-alive stopped `silent` ago) as a failure with exit code 1,
  // and counts its report (it will send none).
  void declare_lost(int round, const NodeInfo& node, std::chrono::milliseconds silent);

 private:
  int64_t counter(const std::string& key) { return store_.add(key, 0); }
  comm::Store& store_;
  NodeInfo self_;
};

// Node 0's watch over the other nodes' keep-alive counts while a round's ranks run. Pure: the caller reads the
// counts and the clock, so that it is tested without a store or a wait.
class KeepAliveWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit KeepAliveWatch(Clock::duration timeout) : timeout_(timeout) {}
  // A new round: forget every count seen.
  void reset() { seen_.clear(); }
  // `count`: `node_rank`'s keep-alive count read at `now`. True when that count has not changed for the timeout
  // (since it was first seen after reset(): a node gets the whole timeout from then).
  bool stale(int node_rank, int64_t count, Clock::time_point now);

 private:
  struct Seen {
    int64_t count = 0;
    Clock::time_point since;
  };
  Clock::duration timeout_;
  std::map<int, Seen> seen_;
};

// The address this host would use to reach `master_addr` (an IPv4 address or name), as text; empty when
// unknown. Sends nothing (a UDP socket's connect only chooses the route).
std::string local_address_toward(const std::string& master_addr);

}  // namespace dpt::launcher
