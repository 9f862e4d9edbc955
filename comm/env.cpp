// comm/env.cpp: detect_env (dprun/torchrun, Open MPI, Slurm or a single process) over a recorded
// environment, and expand_hostlist for Slurm's compressed node lists.
#include "comm/env.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/check.h"
#include "core/thread_env.h"

extern char** environ;  // POSIX: the process environment

namespace dpt::comm {

namespace {

constexpr int kDefaultMasterPort = 29500;
constexpr const char* kDefaultMasterAddr = "127.0.0.1";

const std::string* find(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

bool has(const EnvMap& env, const std::string& name) { return find(env, name) != nullptr; }

// The whole text must be a (possibly negative) decimal integer that fits in int.
int parse_int(const std::string& name, const std::string& text) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
    DPT_THROW(ConfigError, "environment variable {}='{}' is not an integer", name, text);
  }
  return v;
}

int require_int(const EnvMap& env, const std::string& name) {
  const std::string* v = find(env, name);
  if (!v) DPT_THROW(ConfigError, "environment variable {} is not set", name);
  return parse_int(name, *v);
}

std::optional<int> optional_int(const EnvMap& env, const std::string& name) {
  const std::string* v = find(env, name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

// Master address and port from MASTER_ADDR / MASTER_PORT, falling back to the given defaults.
void read_master(const EnvMap& env, DistEnv& d, const std::string& default_addr, int default_port = kDefaultMasterPort) {
  const std::string* addr = find(env, "MASTER_ADDR");
  d.master_addr = addr ? *addr : default_addr;
  d.master_addr_set = addr != nullptr;
  d.master_port_set = has(env, "MASTER_PORT");
  if (d.master_addr.empty()) DPT_THROW(ConfigError, "environment variable MASTER_ADDR is set but empty");
  d.master_port = optional_int(env, "MASTER_PORT").value_or(default_port);
  if (d.master_port < 1 || d.master_port > 65535) {
    DPT_THROW(ConfigError, "environment variable MASTER_PORT={} is out of range 1..65535", d.master_port);
  }
}

// MASTER_ADDR=localhost, or a 127.x.x.x or ::1 address (`export MASTER_ADDR=localhost`, a torchrun habit), where the
// launcher placed the ranks on several hosts: every other host's ranks would look for rank 0's store at their own
// loopback until dist.timeout_s. ConfigError naming it and `how` to do without it.
void refuse_loopback_master(const DistEnv& d, const char* launcher, const char* local_var, const char* how) {
  if (!d.master_addr_set || d.local_world_size >= d.world_size) return;
  const std::string& m = d.master_addr;
  const bool loop = m == "localhost" || m == "::1" ||
                    (m.rfind("127.", 0) == 0 && m.find_first_not_of("0123456789.") == std::string::npos);
  if (!loop) return;
  DPT_THROW(ConfigError, "MASTER_ADDR={} is a loopback address, but {} placed the {} ranks on several hosts ({} on "
            "this one: {}): the other hosts' ranks would look for rank 0's store at their own. {}", m, launcher,
            d.world_size, d.local_world_size, local_var, how);
}

// "2(x3),1" -> 2 2 2 1: Slurm's per-node task counts (SLURM_STEP_TASKS_PER_NODE and friends).
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        DPT_THROW(ConfigError, "environment variable {}='{}' is malformed near '{}'", name, text, item);
      }
      repeat = parse_int(name, item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int count = parse_int(name, item);
    if (count < 1 || repeat < 1) {
      DPT_THROW(ConfigError, "environment variable {}='{}' has a count below 1", name, text);
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

void validate(DistEnv& d, const char* rank_var, const char* world_var, const char* local_rank_var,
              const char* local_world_var) {
  if (d.world_size < 1) {
    DPT_THROW(ConfigError, "environment variable {}={} must be at least 1", world_var, d.world_size);
  }
  if (d.rank < 0 || d.rank >= d.world_size) {
    DPT_THROW(ConfigError, "environment variable {}={} is out of range for {}={} (0 <= rank < world size)",
              rank_var, d.rank, world_var, d.world_size);
  }
  if (d.local_world_size < 1 || d.local_world_size > d.world_size) {
    DPT_THROW(ConfigError, "environment variable {}={} is out of range 1..{} ({})", local_world_var,
              d.local_world_size, d.world_size, world_var);
  }
  if (d.local_rank < 0 || d.local_rank >= d.local_world_size) {
    DPT_THROW(ConfigError, "environment variable {}={} is out of range for {}={} (0 <= local rank < local world)",
              local_rank_var, d.local_rank, local_world_var, d.local_world_size);
  }
  if (d.node_rank < 0) DPT_THROW(ConfigError, "node rank {} is negative", d.node_rank);
  if (d.restart_count < 0) {
    DPT_THROW(ConfigError, "environment variable DPT_RESTART_COUNT={} is negative", d.restart_count);
  }
}

DistEnv detect_dprun(const EnvMap& env) {
  DistEnv d;
  d.launcher = Launcher::Dprun;
  d.rank = require_int(env, "RANK");
  d.world_size = require_int(env, "WORLD_SIZE");
  // Started by hand with only RANK and WORLD_SIZE: assume one node.
  d.local_rank = optional_int(env, "LOCAL_RANK").value_or(d.rank);
  d.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE").value_or(d.world_size);
  if (has(env, "NODE_RANK")) {
    d.node_rank = require_int(env, "NODE_RANK");
    if (d.node_rank < 0) DPT_THROW(ConfigError, "environment variable NODE_RANK={} is negative", d.node_rank);
  } else if (has(env, "GROUP_RANK")) {
    d.node_rank = require_int(env, "GROUP_RANK");
    if (d.node_rank < 0) DPT_THROW(ConfigError, "environment variable GROUP_RANK={} is negative", d.node_rank);
  }
  read_master(env, d, kDefaultMasterAddr);
  d.restart_count = optional_int(env, "DPT_RESTART_COUNT").value_or(0);
  if (has(env, "TORCHELASTIC_RUN_ID")) {  // torchrun's elastic agent: its restarts, its store
    d.launcher = Launcher::Torchrun;
    if (!has(env, "DPT_RESTART_COUNT")) {
      d.restart_count = optional_int(env, "TORCHELASTIC_RESTART_COUNT").value_or(0);
      if (d.restart_count < 0)
        DPT_THROW(ConfigError, "environment variable TORCHELASTIC_RESTART_COUNT={} is negative", d.restart_count);
    }
    const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
    d.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  }
  validate(d, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return d;
}

DistEnv detect_openmpi(const EnvMap& env) {
  DistEnv d;
  d.launcher = Launcher::OpenMPI;
  d.mpi_available = true;
  d.rank = require_int(env, "OMPI_COMM_WORLD_RANK");
  d.world_size = require_int(env, "OMPI_COMM_WORLD_SIZE");
  d.local_rank = optional_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(d.rank);
  d.local_world_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(d.world_size);
  // Open MPI has no "index of my node" variable: OMPI_COMM_WORLD_NODE_RANK is this process's rank among the
  // processes on its node (equal to LOCAL_RANK for one job), not the node's index. The node index below is
  // exact for mpirun's default by-slot mapping with the same number of ranks on every node.
  if (d.local_world_size > 0) d.node_rank = d.rank / d.local_world_size;
  read_master(env, d, kDefaultMasterAddr);
  d.restart_count = optional_int(env, "DPT_RESTART_COUNT").value_or(0);
  validate(d, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
           "OMPI_COMM_WORLD_LOCAL_SIZE");
  return d;
}

DistEnv detect_slurm(const EnvMap& env) {
  DistEnv d;
  d.launcher = Launcher::Slurm;
  d.rank = require_int(env, "SLURM_PROCID");
  d.world_size = require_int(env, "SLURM_NTASKS");
  d.local_rank = optional_int(env, "SLURM_LOCALID").value_or(0);
  d.node_rank = optional_int(env, "SLURM_NODEID").value_or(0);
  if (d.node_rank < 0) DPT_THROW(ConfigError, "environment variable SLURM_NODEID={} is negative", d.node_rank);

  // Tasks on this node: "2(x3),1" lists them per node, so pick this node's entry. The step's own layout first:
  // SLURM_NTASKS_PER_NODE is the job's request (sbatch --ntasks-per-node=8), which an srun --ntasks=1 in that job
  // inherits unchanged; read first, it once failed such a step ("SLURM_NTASKS_PER_NODE=8 is out of range 1..1").
  const char* local_var = "SLURM_STEP_TASKS_PER_NODE";
  d.local_world_size = 1;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
    if (const std::string* v = find(env, name)) {
      auto counts = expand_tasks_per_node(name, *v);
      size_t node = static_cast<size_t>(d.node_rank);
      d.local_world_size = node < counts.size() ? counts[node] : counts.front();
      local_var = name;
      break;
    }
  }

  std::string master = kDefaultMasterAddr;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    const std::string* v = find(env, name);
    if (!v || v->empty()) continue;
    std::vector<std::string> hosts;
    try {
      hosts = expand_hostlist(*v);
    } catch (const ConfigError& e) {
      DPT_THROW(ConfigError, "environment variable {}: {}", name, e.what());
    }
    if (!hosts.empty()) master = hosts.front();
    break;
  }
  // Without MASTER_PORT, derive the port from the job id: two jobs sharing a node then rarely collide, and
  // every rank of one job computes the same port.
  // (The last four digits: job ids can exceed an int.)
  int port = kDefaultMasterPort;
  if (const std::string* job = find(env, "SLURM_JOB_ID"); job && !job->empty()) {
    const std::string tail = job->substr(job->size() > 4 ? job->size() - 4 : 0);
    port = 20000 + parse_int("SLURM_JOB_ID", tail);
  }
  read_master(env, d, master, port);
  d.restart_count = optional_int(env, "DPT_RESTART_COUNT").value_or(0);
  // srun starts MPI programs only with a PMI plugin (--mpi=pmix or pmi2), which sets these.
  d.mpi_available = has(env, "PMIX_RANK") || has(env, "PMI_RANK");
  validate(d, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_var);
  if (has(env, local_var))  // the placement known, not 1 a node for want of it
    refuse_loopback_master(d, "srun", local_var,
                           "Unset MASTER_ADDR (the first host of the step's node list is the default), or set one "
                           "every host reaches");
  return d;
}

// A process of MPICH's, Intel MPI's or MVAPICH's mpiexec (Hydra): PMI_RANK and PMI_SIZE, its local rank and count in
// MPI_LOCALRANKID and MPI_LOCALNRANKS. Each once trained alone as a single process ("1 rank(s) via none"), where
// another one's checkpoint.dir lock did not stop it first.
DistEnv detect_hydra(const EnvMap& env) {
  DistEnv d;
  d.launcher = Launcher::Hydra;
  d.rank = require_int(env, "PMI_RANK");
  d.world_size = require_int(env, "PMI_SIZE");
  d.local_rank = optional_int(env, "MPI_LOCALRANKID").value_or(d.rank);
  d.local_world_size = optional_int(env, "MPI_LOCALNRANKS").value_or(d.world_size);
  if (d.local_world_size > 0) d.node_rank = d.rank / d.local_world_size;
  read_master(env, d, kDefaultMasterAddr);
  d.restart_count = optional_int(env, "DPT_RESTART_COUNT").value_or(0);
  validate(d, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  refuse_loopback_master(d, "mpiexec", "MPI_LOCALNRANKS", "Set MASTER_ADDR to rank 0's host, one every host reaches");
  if (!d.master_addr_set && d.local_world_size < d.world_size) {
    DPT_THROW(ConfigError, "mpiexec (PMI_SIZE={}) placed ranks on several hosts (MPI_LOCALNRANKS={}) and MASTER_ADDR "
              "is unset: rank 0's store would be looked for at 127.0.0.1, each host's own. Set MASTER_ADDR to rank 0's "
              "host for every rank (mpiexec -genv MASTER_ADDR node01), or launch with dprun, Open MPI's mpirun or srun",
              d.world_size, d.local_world_size);
  }
  return d;
}

bool hydra_task(const EnvMap& env) { return has(env, "PMI_RANK") && has(env, "PMI_SIZE"); }

// A task of a job step, started by srun: SLURM_PROCID and SLURM_NTASKS with the step's id (SLURM_STEP_ID; older
// Slurm: SLURM_STEPID). Slurm's batch script has the first two as well (SLURM_PROCID=0, SLURM_NTASKS = the job's
// tasks) but no step id: it is one process, and taking it for rank 0 of SLURM_NTASKS once left it waiting at the
// rendezvous for ranks that nobody started, until dist.timeout_s.
bool slurm_task(const EnvMap& env) {
  return has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS") &&
         (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID"));
}

bool slurm_batch_script(const EnvMap& env) {
  return has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS") && !slurm_task(env);
}

// RANK and WORLD_SIZE that dprun (DPT_LAUNCHER=dprun) or torchrun's agent (TORCHELASTIC_RUN_ID) set: such a
// launcher may run inside mpirun or srun (scripts/slurm/dprun.sbatch: one dprun per node), and its numbering is
// the job's. Others were set by hand, or left over in the shell.
bool set_by_launcher(const EnvMap& env) {
  const std::string* launcher = find(env, "DPT_LAUNCHER");
  return (launcher && *launcher == "dprun") || has(env, "TORCHELASTIC_RUN_ID");
}

// RANK and WORLD_SIZE set by hand (`hand`) where mpirun or srun placed this process too: when both agree (and
// LOCAL_RANK, when both give one), that launcher's view (its name, MPI); when they disagree, ConfigError naming
// both. Leftovers once won silently: mpirun -np 2 started two processes that each trained alone as rank 0.
DistEnv against_outer_launcher(const EnvMap& env, const DistEnv& hand) {
  DistEnv outer;
  const char *name = nullptr, *rank_var = nullptr, *world_var = nullptr, *local_var = nullptr;
  if (has(env, "OMPI_COMM_WORLD_SIZE")) {
    outer = detect_openmpi(env);
    name = "mpirun";
    rank_var = "OMPI_COMM_WORLD_RANK";
    world_var = "OMPI_COMM_WORLD_SIZE";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else if (slurm_task(env)) {
    outer = detect_slurm(env);
    name = "Slurm";
    rank_var = "SLURM_PROCID";
    world_var = "SLURM_NTASKS";
    local_var = "SLURM_LOCALID";
  } else {
    return hand;
  }
  const bool compare_local = has(env, "LOCAL_RANK") && has(env, local_var);
  if (hand.rank == outer.rank && hand.world_size == outer.world_size &&
      (!compare_local || hand.local_rank == outer.local_rank)) {
    return outer;
  }
  std::string ours = fmt::format("RANK={}, WORLD_SIZE={}", hand.rank, hand.world_size);
  std::string theirs = fmt::format("{}={}, {}={}", rank_var, outer.rank, world_var, outer.world_size);
  if (compare_local && hand.local_rank != outer.local_rank) {
    ours += fmt::format(", LOCAL_RANK={}", hand.local_rank);
    theirs += fmt::format(", {}={}", local_var, outer.local_rank);
  }
  DPT_THROW(ConfigError,
            "the environment places this process twice, and the two disagree: {} (set by hand or left over in the "
            "shell: dprun would have set DPT_LAUNCHER=dprun) but {} (set by {}). Unset RANK and WORLD_SIZE to run "
            "where {} placed it, or make them agree",
            ours, theirs, name, name);
}

// ---- hostlists -------------------------------------------------------------------------------------------

[[noreturn]] void bad_hostlist(const std::string& expr, const std::string& why) {
  DPT_THROW(ConfigError, "malformed Slurm hostlist '{}': {}", expr, why);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "01-03,07" -> 01 02 03 07 (the width of a zero-padded low bound is kept).
std::vector<std::string> expand_ranges(const std::string& expr, const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9) {
      bad_hostlist(expr, fmt::format("'{}' is not a number or a range like 01-04", item));
    }
    long a = std::stol(lo);
    long b = std::stol(hi);
    if (a > b) bad_hostlist(expr, fmt::format("range '{}' runs backwards", item));
    if (b - a > 100000) bad_hostlist(expr, fmt::format("range '{}' is implausibly long", item));
    size_t width = lo.size();
    for (long i = a; i <= b; ++i) {
      std::string n = std::to_string(i);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// One host expression without top-level commas: "rack[1-2]-n[01-02]" -> the product of its brackets.
void expand_one(const std::string& expr, const std::string& item, std::vector<std::string>& out) {
  std::vector<std::string> partial{""};
  size_t pos = 0;
  while (pos < item.size()) {
    size_t open = item.find('[', pos);
    size_t stray = item.find(']', pos);
    if (stray != std::string::npos && (open == std::string::npos || stray < open)) {
      bad_hostlist(expr, "']' without '['");
    }
    std::string literal = item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    for (auto& p : partial) p += literal;
    if (open == std::string::npos) break;
    size_t close = item.find(']', open);
    if (close == std::string::npos) bad_hostlist(expr, "'[' without ']'");
    std::string body = item.substr(open + 1, close - open - 1);
    if (body.find('[') != std::string::npos) bad_hostlist(expr, "nested '['");
    if (body.empty()) bad_hostlist(expr, "empty '[]'");
    auto values = expand_ranges(expr, body);
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial) {
      for (const auto& v : values) next.push_back(p + v);
    }
    partial = std::move(next);
    pos = close + 1;
  }
  for (auto& p : partial) {
    if (p.empty()) bad_hostlist(expr, "empty host name");
    out.push_back(std::move(p));
  }
}

}  // namespace

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::None: return "none";
    case Launcher::Dprun: return "dprun";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::OpenMPI: return "openmpi";
    case Launcher::Slurm: return "slurm";
    case Launcher::Hydra: return "hydra";
  }
  return "?";
}

DistEnv detect_env(const EnvMap& env) {
  DistEnv d;
  // One of the two alone would once start a single process training alone ("1 rank(s) via none"). Under mpirun or
  // srun a lone leftover that agrees with their placement is let be; one that disagrees is named.
  const bool outer = has(env, "OMPI_COMM_WORLD_SIZE") || slurm_task(env);
  for (const auto& [set, unset] : {std::pair{"WORLD_SIZE", "RANK"}, std::pair{"RANK", "WORLD_SIZE"}}) {
    if (!has(env, set) || has(env, unset)) continue;
    if (outer) {
      const DistEnv placed = has(env, "OMPI_COMM_WORLD_SIZE") ? detect_openmpi(env) : detect_slurm(env);
      const int64_t want = std::string(set) == "RANK" ? placed.rank : placed.world_size;
      if (std::to_string(want) == *find(env, set)) continue;
      DPT_THROW(ConfigError, "environment variable {}={} (set by hand or left over in the shell) but {} placed this "
                "process with {} {}: unset {}", set, *find(env, set),
                has(env, "OMPI_COMM_WORLD_SIZE") ? "mpirun" : "Slurm", set, want, set);
    }
    DPT_THROW(ConfigError,
              "environment variable {}={} but {} is not set: set both to start a rank of a job by hand, or neither "
              "for a single process",
              set, *find(env, set), unset);
  }
  if (has(env, "RANK") && has(env, "WORLD_SIZE")) {
    d = detect_dprun(env);
    if (!set_by_launcher(env)) d = against_outer_launcher(env, d);
  } else if (has(env, "OMPI_COMM_WORLD_SIZE")) {
    d = detect_openmpi(env);
  } else if (slurm_task(env)) {
    d = detect_slurm(env);
  } else if (hydra_task(env)) {
    d = detect_hydra(env);
  } else {  // a single process started by hand (or in Slurm's batch script)
    if (slurm_batch_script(env) && *find(env, "SLURM_NTASKS") != "1") {
      d.warning = fmt::format("SLURM_NTASKS={} but this process is not one of the job's tasks (no SLURM_STEP_ID: "
                              "Slurm's batch script): it runs alone, as a single process. To run one rank per task, "
                              "start it with srun, as scripts/slurm/dptrain.sbatch does",
                              *find(env, "SLURM_NTASKS"));
    }
    d.launcher = Launcher::None;
    read_master(env, d, kDefaultMasterAddr);
    d.restart_count = optional_int(env, "DPT_RESTART_COUNT").value_or(0);
    validate(d, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  }
  if (const std::string* token = find(env, "DPT_STORE_TOKEN")) d.store_token = *token;
  return d;
}

EnvMap process_env() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> expand_hostlist(const std::string& expr) {
  std::vector<std::string> out;
  if (expr.empty()) return out;
  // Split at commas outside brackets: "a[1,3],b" -> "a[1,3]" and "b".
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') {
      ++depth;
    } else if (c == ']') {
      --depth;
      if (depth < 0) bad_hostlist(expr, "']' without '['");
    } else if (c == ',' && depth == 0) {
      std::string item = expr.substr(start, i - start);
      if (item.empty()) bad_hostlist(expr, "empty host name");
      expand_one(expr, item, out);
      start = i + 1;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      bad_hostlist(expr, "whitespace");
    }
  }
  if (depth != 0) bad_hostlist(expr, "'[' without ']'");
  return out;
}

int cpu_threads_per_rank(int local_ranks, int cpus_in_mask, int launcher_cpus, int cpus_per_task) {
  const int cpus = std::max(1, cpus_in_mask);
  if (cpus_per_task > 0) return std::min(cpus_per_task, cpus);
  const int64_t ranks = std::max(1, local_ranks);
  const int64_t host = std::max(cpus, launcher_cpus);
  const int64_t sharing = std::clamp<int64_t>((ranks * cpus + host - 1) / host, 1, ranks);  // ranks in this mask
  return std::max(1, static_cast<int>(cpus / sharing));
}

CpuThreads choose_cpu_threads(const DistEnv& d, const EnvMap& env, int cpus_in_mask, int launcher_cpus) {
  CpuThreads t;
  if (d.local_world_size <= 1) return t;
  int per_task = 0;
  if (d.launcher == Launcher::Slurm) {
    const std::string* v = find(env, "SLURM_CPUS_PER_TASK");
    if (v) std::from_chars(v->data(), v->data() + v->size(), per_task);  // malformed: 0, none
  }
  t.per_rank = cpu_threads_per_rank(d.local_world_size, cpus_in_mask, launcher_cpus, per_task);
  if (t.per_rank >= cpus_in_mask) return t;
  // Set the way each library reads it: an OMP_NUM_THREADS='' or 'abc' they ignore, and start a thread per CPU.
  const std::string* omp = find(env, "OMP_NUM_THREADS");
  if (!omp || !omp_num_threads_valid(*omp)) t.openmp = t.per_rank;
  auto blas_set = [&](const char* name) {
    const std::string* v = find(env, name);
    return v && blas_num_threads_set(*v);
  };
  if (!blas_set("OPENBLAS_NUM_THREADS") && !blas_set("GOTO_NUM_THREADS") && !blas_set("OMP_NUM_THREADS"))
    t.openblas = t.per_rank;
  return t;
}

}  // namespace dpt::comm
