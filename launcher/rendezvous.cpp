// launcher/rendezvous.cpp: the elastic rendezvous: the round's plan as text, the master's decision, and the
// store keys each node reads and writes (see rendezvous.h).
#include "launcher/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/net.h"
#include "launcher/launcher.h"  // kConfigErrorCode

namespace dpt::launcher {

namespace {

std::string key(int round, std::string_view what) { return fmt::format("rdzv/{}/{}", round, what); }

int to_int(std::string_view text, std::string_view what) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
    DPT_THROW(CommError, "rendezvous store: {} '{}' is not a number", what, text);
  }
  return v;
}

// "NODE_RANK NPROC NAME" (the name last: it may hold spaces).
std::string encode_node(const NodeInfo& n) { return fmt::format("{} {} {}", n.node_rank, n.nproc, n.name); }

NodeInfo decode_node(std::string_view line) {
  const auto a = line.find(' ');
  const auto b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (b == std::string_view::npos) DPT_THROW(CommError, "rendezvous store: '{}' is not a node record", line);
  return NodeInfo{to_int(line.substr(0, a), "node rank"), to_int(line.substr(a + 1, b - a - 1), "rank count"),
                  std::string(line.substr(b + 1))};
}

}  // namespace

std::string describe(const NodeInfo& node) {
  return node.name.empty() ? fmt::format("node {}", node.node_rank)
                           : fmt::format("node {} ({})", node.node_rank, node.name);
}

int RoundPlan::index_of(int node_rank, int slot) const {
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].node_rank != node_rank) continue;
    return slot == 0 || nodes[i].slot == 0 || nodes[i].slot == slot ? static_cast<int>(i) : -1;
  }
  return -1;
}

int RoundPlan::world_size() const { return first_rank(static_cast<int>(nodes.size())); }

int RoundPlan::first_rank(int index) const {
  int r = 0;
  for (int i = 0; i < index; ++i) r += nodes[static_cast<std::size_t>(i)].nproc;
  return r;
}

// "run PORT" and a line per node ("SLOT " and its record), or "end CODE" and the message.
std::string encode_plan(const RoundPlan& plan) {
  if (plan.ended) return fmt::format("end {}\n{}", plan.end_code, plan.end_message);
  std::string text = fmt::format("run {}", plan.rank_port);
  for (const NodeInfo& n : plan.nodes) {
    text += '\n';  // appended apart: "\n" + string trips GCC 12's false -Wrestrict (GCC PR 105329)
    text += fmt::format("{} {}", n.slot, encode_node(n));
  }
  return text;
}

RoundPlan decode_plan(int round, const std::string& text) {
  RoundPlan plan;
  plan.round = round;
  const auto nl = text.find('\n');
  const std::string_view head = std::string_view(text).substr(0, nl);
  const std::string_view rest = nl == std::string::npos ? std::string_view{} : std::string_view(text).substr(nl + 1);
  if (head.starts_with("end ")) {
    plan.ended = true;
    plan.end_code = to_int(head.substr(4), "exit code");
    plan.end_message = std::string(rest);
    return plan;
  }
  if (!head.starts_with("run ")) DPT_THROW(CommError, "rendezvous store: round {}'s plan '{}' is malformed", round, head);
  plan.rank_port = to_int(head.substr(4), "port");
  std::istringstream lines{std::string(rest)};
  for (std::string line; std::getline(lines, line);) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) DPT_THROW(CommError, "rendezvous store: '{}' is not a plan's node line", line);
    NodeInfo n = decode_node(std::string_view(line).substr(sp + 1));
    n.slot = to_int(std::string_view(line).substr(0, sp), "slot");
    plan.nodes.push_back(std::move(n));
  }
  if (plan.nodes.empty()) DPT_THROW(CommError, "rendezvous store: round {}'s plan names no node", round);
  return plan;
}

RoundDecision decide_round(const std::vector<NodeInfo>& joined, int min_nodes, int max_nodes, bool timed_out,
                           std::chrono::milliseconds timeout, const std::vector<NodeInfo>& previous, int round) {
  RoundDecision d;
  // Two dprun claiming one --node-rank would give two nodes the same ranks: a mistake on the command line.
  for (std::size_t i = 0; i < joined.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (joined[i].node_rank == joined[j].node_rank) {
        d.kind = RoundDecision::Kind::kEnd;
        d.message = fmt::format("two nodes joined round {} as --node-rank {}: {} and {}; give each node its own",
                                round, joined[i].node_rank, joined[j].name, joined[i].name);
        return d;
      }
    }
  }
  const int n = static_cast<int>(joined.size());
  if (n >= max_nodes || (timed_out && n >= min_nodes)) {
    d.kind = RoundDecision::Kind::kRun;
    d.nodes.assign(joined.begin(), joined.begin() + std::min(n, max_nodes));
    std::sort(d.nodes.begin(), d.nodes.end(), [](const NodeInfo& a, const NodeInfo& b) { return a.node_rank < b.node_rank; });
    return d;
  }
  if (!timed_out) return d;
  // Too few: name the nodes of the last round that are not back, or (first round) the node ranks never seen.
  std::vector<std::string> missing;
  std::set<int> present;
  for (const NodeInfo& j : joined) present.insert(j.node_rank);
  if (!previous.empty()) {
    for (const NodeInfo& p : previous) {
      if (!present.contains(p.node_rank)) missing.push_back(describe(p));
    }
  } else {
    for (int r = 0; r < max_nodes; ++r) {
      if (!present.contains(r)) missing.push_back(fmt::format("node {}", r));
    }
  }
  d.kind = RoundDecision::Kind::kEnd;
  d.message = fmt::format("only {} of the {} nodes needed (--nnodes {}:{}) joined round {} within --rdzv-timeout {}: {} "
                          "did not come{}",
                          n, min_nodes, min_nodes, max_nodes, round, comm::detail::format_duration(timeout),
                          fmt::join(missing, ", "), previous.empty() ? "" : " back");
  return d;
}

Rendezvous::Rendezvous(comm::Store& store, NodeInfo self) : store_(store), self_(std::move(self)) {}

int Rendezvous::current_round() { return static_cast<int>(counter("rdzv/round")); }

int Rendezvous::join(int round) {
  if (is_master()) {
    const int64_t now = counter("rdzv/round");
    if (round > now) store_.add("rdzv/round", round - now);  // only the master writes it
  }
  const int64_t slot = store_.add(key(round, "joined"), 1);
  store_.set(key(round, fmt::format("node/{}", slot)), encode_node(self_));
  return static_cast<int>(slot);
}

std::optional<RoundPlan> Rendezvous::closed(int round) {
  if (counter(key(round, "closed")) == 0) return std::nullopt;
  return decode_plan(round, store_.get_string(key(round, "plan")));
}

std::vector<NodeInfo> Rendezvous::joined(int round) {
  const int64_t n = counter(key(round, "joined"));
  std::vector<NodeInfo> nodes;
  // A node sets its record right after taking its slot: get() waits the moment between.
  for (int64_t slot = 1; slot <= n; ++slot) {
    if (counter(key(round, fmt::format("withdrawn/{}", slot))) > 0) continue;
    nodes.push_back(decode_node(store_.get_string(key(round, fmt::format("node/{}", slot)))));
    nodes.back().slot = static_cast<int>(slot);
  }
  return nodes;
}

void Rendezvous::withdraw(int round, int slot) {
  store_.add(key(round, fmt::format("withdrawn/{}", slot)), 1);
  bye(round);
}

void Rendezvous::close(const RoundPlan& plan) {
  store_.set(key(plan.round, "plan"), encode_plan(plan));
  store_.add(key(plan.round, "closed"), 1);
}

void Rendezvous::end(int round, int code, const std::string& message) {
  RoundPlan plan;
  plan.round = round;
  plan.ended = true;
  plan.end_code = code;
  plan.end_message = message;
  close(plan);
}

void Rendezvous::report_failure(int round, int code, const std::string& what, bool by_signal, bool stop) {
  store_.add(key(round, fmt::format("reported/{}", self_.node_rank)), 1);
  if (stop) store_.add(key(round, "stopped"), 1);  // before "failed" counts: a reader that sees it sees this
  // The first to count writes the text; a reader that sees the count waits the moment until it is there. A
  // signal's text is written before "failed" counts this report, so a reader that sees "signaled" finds it.
  const std::string text = fmt::format("{} {}", code, what);
  if (by_signal && store_.add(key(round, "signaled"), 1) == 1) store_.set(key(round, "failure_signaled"), text);
  if (!by_signal && code == kConfigErrorCode && store_.add(key(round, "config"), 1) == 1)
    store_.set(key(round, "failure_config"), text);
  if (store_.add(key(round, "failed"), 1) == 1) store_.set(key(round, "failure"), text);
  store_.add(key(round, "reports"), 1);
}

void Rendezvous::report_done(int round) {
  // Before "reported": a reader that sees the report sees this.
  store_.add(key(round, fmt::format("done/{}", self_.node_rank)), 1);
  store_.add(key(round, fmt::format("reported/{}", self_.node_rank)), 1);
  store_.add(key(round, "reports"), 1);
}

bool Rendezvous::reported(int round, int node_rank) {
  return counter(key(round, fmt::format("reported/{}", node_rank))) > 0;
}

void Rendezvous::mark_elastic() { store_.add(comm::kElasticRendezvousKey, 1); }
bool Rendezvous::marked_elastic() { return counter(comm::kElasticRendezvousKey) > 0; }
std::string Rendezvous::not_elastic() {
  return counter(comm::kNotElasticCount) == 0 ? std::string{} : store_.get_string(comm::kNotElasticKey);
}

bool Rendezvous::done(int round, int node_rank) {
  return counter(key(round, fmt::format("done/{}", node_rank))) > 0;
}

void Rendezvous::keep_alive() { store_.add(fmt::format("rdzv/alive/{}", self_.node_rank), 1); }

int64_t Rendezvous::keep_alives(int node_rank) { return counter(fmt::format("rdzv/alive/{}", node_rank)); }

void Rendezvous::declare_lost(int round, const NodeInfo& node, std::chrono::milliseconds silent) {
  const std::string what = fmt::format("{}: lost: its dprun sent no keep-alive for {} (--rdzv-timeout)",
                                       describe(node), comm::detail::format_duration(silent));
  store_.add(key(round, fmt::format("reported/{}", node.node_rank)), 1);
  store_.add(key(round, fmt::format("lost/{}", node.node_rank)), 1);
  if (store_.add(key(round, "failed"), 1) == 1) store_.set(key(round, "failure"), fmt::format("1 {}", what));
  store_.add(key(round, "reports"), 1);
}

bool KeepAliveWatch::stale(int node_rank, int64_t count, Clock::time_point now) {
  auto [it, fresh] = seen_.try_emplace(node_rank, Seen{count, now});
  if (fresh || it->second.count != count) {
    it->second = Seen{count, now};
    return false;
  }
  return now - it->second.since >= timeout_;
}

std::optional<std::pair<int, std::string>> Rendezvous::failure(int round) {
  if (counter(key(round, "failed")) == 0) return std::nullopt;
  const bool signaled = counter(key(round, "signaled")) > 0;
  const bool config = !signaled && counter(key(round, "config")) > 0;
  const std::string text =
      store_.get_string(key(round, signaled ? "failure_signaled" : config ? "failure_config" : "failure"));
  const auto sp = text.find(' ');
  return std::pair{to_int(std::string_view(text).substr(0, sp), "exit code"),
                   sp == std::string::npos ? std::string{} : text.substr(sp + 1)};
}

void Rendezvous::publish_reason(int round, const std::string& line) {
  if (store_.add(key(round, "reasons"), 1) == 1) store_.set(key(round, "reason"), line);
}

std::string Rendezvous::reason(int round) {
  return counter(key(round, "reasons")) == 0 ? std::string{} : store_.get_string(key(round, "reason"));
}

int Rendezvous::reports(int round) { return static_cast<int>(counter(key(round, "reports"))); }
int Rendezvous::failures(int round) { return static_cast<int>(counter(key(round, "failed"))); }
bool Rendezvous::lost(int round, int node_rank) { return counter(key(round, fmt::format("lost/{}", node_rank))) > 0; }
bool Rendezvous::stopped(int round) { return counter(key(round, "stopped")) > 0; }
bool Rendezvous::signaled(int round) { return counter(key(round, "signaled")) > 0; }
void Rendezvous::bye(int round) {
  leave(round);
  store_.add(key(round, "bye"), 1);
}
void Rendezvous::leave(int round) { store_.add(key(round, fmt::format("left/{}", self_.node_rank)), 1); }
bool Rendezvous::left(int round, int node_rank) { return counter(key(round, fmt::format("left/{}", node_rank))) > 0; }
int Rendezvous::byes(int round) { return static_cast<int>(counter(key(round, "bye"))); }
int Rendezvous::joined_count(int round) { return static_cast<int>(counter(key(round, "joined"))); }

std::string local_address_toward(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res) return {};
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN] = {};
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) {
      out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace dpt::launcher
