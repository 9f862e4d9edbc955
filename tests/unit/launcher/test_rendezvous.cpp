// tests/unit/launcher/test_rendezvous.cpp: the elastic rendezvous: a round's plan as stored text, the master's
// decision (when to close, who runs, who is named missing), and the store keys nodes meet through (HashStore).
#include <catch2/catch.hpp>

#include "comm/store.h"
#include "core/check.h"
#include "launcher/rendezvous.h"

using namespace dpt;
using namespace dpt::launcher;
using namespace std::chrono_literals;

namespace {
NodeInfo node(int rank, int nproc = 2) { return NodeInfo{rank, nproc, fmt::format("host{} 10.0.0.{}", rank, rank + 1)}; }
}  // namespace

TEST_CASE("RoundPlan: ranks numbered node after node, encode and decode give it back", "[launcher][rdzv]") {
  RoundPlan plan;
  plan.round = 4;
  plan.rank_port = 40001;
  plan.nodes = {node(0, 2), node(2, 3), node(5, 1)};
  CHECK(plan.world_size() == 6);
  CHECK(plan.index_of(2) == 1);
  CHECK(plan.index_of(1) == -1);
  CHECK(plan.first_rank(0) == 0);
  CHECK(plan.first_rank(1) == 2);
  CHECK(plan.first_rank(2) == 5);
  RoundPlan back = decode_plan(4, encode_plan(plan));
  CHECK_FALSE(back.ended);
  CHECK(back.rank_port == 40001);
  REQUIRE(back.nodes.size() == 3);
  CHECK(back.nodes[1].node_rank == 2);
  CHECK(back.nodes[1].nproc == 3);
  CHECK(back.nodes[1].name == "host2 10.0.0.3");
  // Which dprun runs each node (its join slot) travels with the plan: another dprun of node 2 is not in it.
  plan.nodes[1].slot = 3;
  back = decode_plan(4, encode_plan(plan));
  CHECK(back.nodes[1].slot == 3);
  CHECK(back.index_of(2, 3) == 1);
  CHECK(back.index_of(2, 4) == -1);
  CHECK(back.index_of(2) == 1);

  RoundPlan end;
  end.ended = true;
  end.end_code = 3;
  end.end_message = "only 1 of the 2 nodes needed\nsecond line";
  RoundPlan end_back = decode_plan(7, encode_plan(end));
  CHECK(end_back.ended);
  CHECK(end_back.round == 7);
  CHECK(end_back.end_code == 3);
  CHECK(end_back.end_message == end.end_message);

  CHECK_THROWS_AS(decode_plan(0, "nonsense"), CommError);
  CHECK_THROWS_AS(decode_plan(0, "run 12"), CommError);  // names no node
  CHECK_THROWS_AS(decode_plan(0, "run 12\n1 x host"), CommError);
}

TEST_CASE("decide_round: MAX joined closes at once, MIN after the timeout, too few ends naming the missing", "[launcher][rdzv]") {
  using Kind = RoundDecision::Kind;
  const std::vector<NodeInfo> none;
  // MIN 1, MAX 3: two nodes, before the timeout: wait; after it: run, in node-rank order.
  CHECK(decide_round({node(2), node(0)}, 1, 3, false, 5s, none, 0).kind == Kind::kWait);
  RoundDecision d = decide_round({node(2), node(0)}, 1, 3, true, 5s, none, 0);
  REQUIRE(d.kind == Kind::kRun);
  REQUIRE(d.nodes.size() == 2);
  CHECK(d.nodes[0].node_rank == 0);
  CHECK(d.nodes[1].node_rank == 2);
  // MAX joined: at once. More than MAX (a late one raced in): the first MAX to join.
  d = decide_round({node(0), node(2), node(1), node(3)}, 1, 3, false, 5s, none, 0);
  REQUIRE(d.kind == Kind::kRun);
  REQUIRE(d.nodes.size() == 3);
  CHECK(d.nodes[2].node_rank == 2);
  // MIN 2, one node after the timeout: the end, naming the node of the last round that is not back.
  d = decide_round({node(0)}, 2, 2, true, 5s, {node(0), node(1)}, 3);
  REQUIRE(d.kind == Kind::kEnd);
  CHECK_THAT(d.message, Catch::Contains("only 1 of the 2 nodes needed (--nnodes 2:2) joined round 3 within "
                                        "--rdzv-timeout 5 s: node 1 (host1 10.0.0.2) did not come back"));
  // The first round: no previous one; the node ranks never seen are named.
  d = decide_round({node(0)}, 3, 3, true, 5s, none, 0);
  REQUIRE(d.kind == Kind::kEnd);
  CHECK_THAT(d.message, Catch::Contains("node 1, node 2 did not come"));
  CHECK(decide_round({node(0)}, 3, 3, false, 5s, none, 0).kind == Kind::kWait);
  // Two nodes with one --node-rank: the end, naming both.
  d = decide_round({node(0), node(1), NodeInfo{1, 2, "other"}}, 1, 4, false, 5s, none, 0);
  REQUIRE(d.kind == Kind::kEnd);
  CHECK_THAT(d.message, Catch::Contains("as --node-rank 1: host1 10.0.0.2 and other"));
}

TEST_CASE("Rendezvous: nodes join, the master closes, a failure is seen by all, the end reaches late nodes", "[launcher][rdzv]") {
  comm::HashStore store(2s);
  Rendezvous master(store, node(0, 2));
  Rendezvous b(store, node(1, 3));
  Rendezvous late(store, node(2, 1));
  CHECK(master.is_master());
  CHECK_FALSE(b.is_master());
  CHECK(b.current_round() == 0);
  b.join(0);
  master.join(0);
  CHECK_FALSE(b.closed(0).has_value());
  std::vector<NodeInfo> joined = master.joined(0);
  REQUIRE(joined.size() == 2);
  CHECK(joined[0].node_rank == 1);  // in the order they joined
  CHECK(joined[0].slot == 1);
  CHECK(joined[1].slot == 2);
  {  // A node that takes its slot back (stopped while it waited) is no longer among those joined.
    comm::HashStore other(2s);
    Rendezvous m(other, node(0));
    Rendezvous quitter(other, node(1));
    m.join(0);
    quitter.withdraw(0, quitter.join(0));
    REQUIRE(m.joined(0).size() == 1);
    CHECK(m.joined(0)[0].node_rank == 0);
    CHECK(m.byes(0) == 1);
  }
  RoundDecision d = decide_round(joined, 1, 2, false, 1s, {}, 0);
  REQUIRE(d.kind == RoundDecision::Kind::kRun);
  RoundPlan plan;
  plan.round = 0;
  plan.rank_port = 555;
  plan.nodes = d.nodes;
  master.close(plan);
  std::optional<RoundPlan> seen = b.closed(0);
  REQUIRE(seen.has_value());
  CHECK(seen->index_of(1) == 1);
  CHECK(seen->first_rank(1) == 2);
  CHECK(seen->world_size() == 5);
  // A node that comes now joins the running round and is not in its plan.
  late.join(late.current_round());
  CHECK(late.closed(0)->index_of(2) == -1);

  // b fails first, then the master (its symptom): the first text wins; both reports count.
  CHECK_FALSE(master.failure(0).has_value());
  b.report_failure(0, 137, "node 1: rank 2 failed (killed by SIGKILL)");
  master.report_failure(0, 1, "node 0: rank 0 failed (exit code 1)");
  auto f = master.failure(0);
  REQUIRE(f.has_value());
  CHECK(f->first == 137);
  CHECK(f->second == "node 1: rank 2 failed (killed by SIGKILL)");
  CHECK(master.failures(0) == 2);
  CHECK(master.reports(0) == 2);
  // A rank killed by a signal is the cause even when its peer's symptom was reported first.
  master.report_failure(5, 1, "node 0: rank 0 failed (exit code 1)");
  CHECK(b.failure(5)->second == "node 0: rank 0 failed (exit code 1)");
  b.report_failure(5, 137, "node 1: rank 2 failed (killed by SIGKILL)", /*by_signal=*/true);
  CHECK(master.failure(5)->first == 137);
  CHECK(master.failure(5)->second == "node 1: rank 2 failed (killed by SIGKILL)");
  // A node whose dprun was told to stop marks the round so: the others stop their ranks as for a preemption, not a
  // failure. A failure does not.
  CHECK_FALSE(master.stopped(0));
  CHECK_FALSE(master.stopped(5));
  b.report_failure(6, 138, "node 1: its dprun received SIGUSR1", /*by_signal=*/false, /*stop=*/true);
  CHECK(master.stopped(6));
  CHECK(master.failure(6)->first == 138);

  // Round 1: the master joins first (and makes it current); it ends the job; b reads the end and says bye.
  master.join(1);
  CHECK(late.current_round() == 1);
  b.join(1);
  master.end(1, 3, "all 0 restarts used");
  std::optional<RoundPlan> end = b.closed(1);
  REQUIRE(end.has_value());
  CHECK(end->ended);
  CHECK(end->end_code == 3);
  CHECK(end->end_message == "all 0 restarts used");
  CHECK(master.byes(1) == 0);
  CHECK_FALSE(master.left(1, 1));
  b.bye(1);
  CHECK(master.byes(1) == 1);
  CHECK(master.left(1, 1));  // a goodbye leaves the round; leave() alone (a node that gives up) does not count a bye
  late.leave(1);
  CHECK(master.left(1, 2));
  CHECK(master.byes(1) == 1);
  CHECK(master.joined_count(1) == 2);
  // Round 0's done reports count with the failures.
  late.report_done(0);
  CHECK(master.reports(0) == 3);
}

TEST_CASE("KeepAliveWatch: a count that has not moved for the timeout is stale, a reset forgets", "[launcher][rdzv]") {
  using C = KeepAliveWatch::Clock;
  const C::time_point t0{};
  KeepAliveWatch w(3s);
  // Node 1 counts up; node 2 stops at 4 (its first read starts its timeout).
  CHECK_FALSE(w.stale(1, 0, t0));
  CHECK_FALSE(w.stale(2, 4, t0 + 1s));
  CHECK_FALSE(w.stale(1, 1, t0 + 2s));
  CHECK_FALSE(w.stale(2, 4, t0 + 3999ms));
  CHECK(w.stale(2, 4, t0 + 4s));
  CHECK_FALSE(w.stale(1, 2, t0 + 4s));
  CHECK_FALSE(w.stale(1, 2, t0 + 4999ms));  // unchanged since 4 s: 0.999 s
  CHECK(w.stale(1, 2, t0 + 7s));
  // Moving again: fresh; a new round: every node gets the whole timeout again.
  CHECK_FALSE(w.stale(2, 5, t0 + 8s));
  w.reset();
  CHECK_FALSE(w.stale(1, 2, t0 + 20s));
  CHECK_FALSE(w.stale(1, 2, t0 + 22s));
  CHECK(w.stale(1, 2, t0 + 23s));
}

TEST_CASE("Rendezvous: keep-alives count per node, a lost node is the round's failure and counts as reported", "[launcher][rdzv]") {
  comm::HashStore store(2s);
  Rendezvous master(store, node(0, 2));
  Rendezvous b(store, node(1, 1));
  Rendezvous c(store, node(2, 1));
  CHECK(master.keep_alives(1) == 0);
  b.keep_alive();
  b.keep_alive();
  c.keep_alive();
  CHECK(master.keep_alives(1) == 2);
  CHECK(master.keep_alives(2) == 1);

  // Round 3: c finished; b went silent and is declared lost: its failure is every node's, and it counts as reported.
  c.report_done(3);
  CHECK(master.reported(3, 2));
  CHECK_FALSE(master.reported(3, 1));
  CHECK(master.done(3, 2));  // its ranks all exited 0 (a node that failed, or was lost, is not done)
  master.declare_lost(3, node(1, 1), 3000ms);
  CHECK(master.reported(3, 1));
  CHECK_FALSE(master.done(3, 1));
  CHECK(master.reports(3) == 2);
  CHECK(master.failures(3) == 1);
  CHECK(master.lost(3, 1));  // the master waits for no goodbye from it when it ends the job
  CHECK_FALSE(master.lost(3, 2));
  CHECK_FALSE(master.lost(4, 1));
  auto f = c.failure(3);
  REQUIRE(f.has_value());
  CHECK(f->first == 1);
  CHECK(f->second == "node 1 (host1 10.0.0.2): lost: its dprun sent no keep-alive for 3 s (--rdzv-timeout)");
  // A configuration error (exit 2) is the round's failure even when a peer's symptom was reported first; a rank
  // killed by a signal still comes before it.
  b.report_failure(5, 1, "node 1: rank 2 failed (exit code 1)");
  c.report_failure(5, 2, "node 2: rank 3 failed (exit code 2)");
  CHECK(master.failure(5)->second == "node 2: rank 3 failed (exit code 2)");
  CHECK(master.failure(5)->first == 2);
  master.report_failure(5, 137, "node 0: rank 0 failed (killed by SIGKILL)", /*by_signal=*/true);
  CHECK(b.failure(5)->first == 137);
  // A failure reported first stays the round's.
  b.report_failure(4, 137, "node 1: rank 2 failed (killed by SIGKILL)");
  CHECK(b.reported(4, 1));
  CHECK_FALSE(b.done(4, 1));
  master.declare_lost(4, node(2, 1), 3000ms);
  CHECK(master.failure(4)->second == "node 1: rank 2 failed (killed by SIGKILL)");
}

TEST_CASE("Rendezvous: a failed rank's line published by its node reaches every node, the first one stays",
          "[launcher][rdzv]") {
  comm::HashStore store(2s);
  Rendezvous master(store, node(0, 1));
  Rendezvous b(store, node(1, 1));
  CHECK(master.reason(0).empty());
  b.publish_reason(0, "node 1 (host1 10.0.0.2): rank 1: unknown config key 'train.lrr'");
  master.publish_reason(0, "node 0 (host0 10.0.0.1): rank 0: a later line");
  CHECK(master.reason(0) == "node 1 (host1 10.0.0.2): rank 1: unknown config key 'train.lrr'");
  CHECK(b.reason(0) == master.reason(0));
  CHECK(b.reason(1).empty());
}
