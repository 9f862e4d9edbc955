// launcher/launcher.cpp: dprun's options: validation, the defaults it chooses (master address and port) and
// the environment each rank gets. launch() itself is in job.cpp.
#include "launcher/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/check.h"
#include "core/thread_env.h"
#include "launcher/process.h"

extern char** environ;

namespace dpt::launcher {

namespace {
constexpr double kMaxGracePeriodS = 24 * 3600.0;
constexpr int kMaxPort = 65535;
constexpr int kMaxRestarts = 1000000;  // a bound that no sane job reaches, so a typo cannot mean "forever"
}  // namespace

void check_not_one_of_many(const Options& opts, const std::function<const char*(const char*)>& getenv) {
  if (opts.nnodes > 1) return;  // one dprun per node, as asked
  auto count = [&](const char* name) {
    const char* v = getenv(name);
    int n = 0;
    if (v) std::from_chars(v, v + std::strlen(v), n);
    return n;
  };
  if (getenv("SLURM_STEP_ID") && count("SLURM_NTASKS") > 1) {
    DPT_THROW(ConfigError, "dprun runs as one of the {} tasks of a Slurm step (SLURM_NTASKS), but with --nnodes 1 "
              "each task would start a job of its own. Start one dprun per node (srun --ntasks-per-node=1) with "
              "--nnodes \"$SLURM_NNODES\" --node-rank \"$SLURM_NODEID\" and --master-addr (as "
              "scripts/slurm/dprun.sbatch does), or start the ranks with srun alone, without dprun",
              count("SLURM_NTASKS"));
  }
  if (count("OMPI_COMM_WORLD_SIZE") > 1) {
    DPT_THROW(ConfigError, "dprun runs as one of the {} processes of mpirun (OMPI_COMM_WORLD_SIZE), but with --nnodes "
              "1 each would start a job of its own. Start one dprun per node with --nnodes, --node-rank and "
              "--master-addr, or start the ranks with mpirun alone, without dprun", count("OMPI_COMM_WORLD_SIZE"));
  }
}

std::string node_rank_from_launcher(Options& opts, bool node_rank_given,
                                    const std::function<const char*(const char*)>& getenv) {
  if (node_rank_given || opts.nnodes <= 1) return "";
  auto count = [&](const char* name, int fallback) {
    const char* v = getenv(name);
    int n = fallback;
    if (v && std::from_chars(v, v + std::strlen(v), n).ec != std::errc{}) n = fallback;
    return n;
  };
  const char *rank_var = nullptr, *size_var = nullptr, *who = nullptr;
  if (count("OMPI_COMM_WORLD_SIZE", 0) > 1) {
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE", who = "processes of mpirun";
  } else if (getenv("SLURM_STEP_ID") && count("SLURM_NTASKS", 0) > 1) {
    rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS", who = "tasks of a Slurm step";
  } else {
    return "";
  }
  const int tasks = count(size_var, 0), index = count(rank_var, -1);
  const std::string nnodes = opts.min_nnodes ? fmt::format("{}:{}", *opts.min_nnodes, opts.nnodes)
                                             : std::to_string(opts.nnodes);
  if (tasks > opts.nnodes) {
    DPT_THROW(ConfigError, "dprun runs as one of the {} {} ({}), but --nnodes {} allows {} nodes: start one dprun per "
              "node (mpirun: -H host1:1,host2:1 or --map-by ppr:1:node; srun: --ntasks-per-node=1)", tasks, who,
              size_var, nnodes, opts.nnodes);
  }
  if (index < 0 || index >= tasks) DPT_THROW(ConfigError, "{} is missing or not in 0..{}", rank_var, tasks - 1);
  opts.node_rank = index;
  return fmt::format("--node-rank {} from {} (one dprun per node, as one of the {} {}; --node-rank overrides it)",
                     index, rank_var, tasks, who);
}

void validate(const Options& opts) {
  if (opts.nproc_per_node < 1) {
    DPT_THROW(ConfigError, "--nproc-per-node must be at least 1 (got {})", opts.nproc_per_node);
  }
  if (opts.nnodes < 1) DPT_THROW(ConfigError, "--nnodes must be at least 1 (got {})", opts.nnodes);
  if (opts.min_nnodes && (*opts.min_nnodes < 1 || *opts.min_nnodes > opts.nnodes)) {
    DPT_THROW(ConfigError, "--nnodes {}:{}: MIN must be in 1..MAX", *opts.min_nnodes, opts.nnodes);
  }
  if (opts.node_rank < 0 || opts.node_rank >= opts.nnodes) {
    DPT_THROW(ConfigError, "--node-rank must be in 0..{} with --nnodes {} (got {})", opts.nnodes - 1, opts.nnodes,
              opts.node_rank);
  }
  if (static_cast<std::int64_t>(opts.nproc_per_node) * opts.nnodes > INT32_MAX) {
    DPT_THROW(ConfigError, "--nproc-per-node {} x --nnodes {} is too large a world", opts.nproc_per_node,
              opts.nnodes);
  }
  if (opts.master_addr && opts.master_addr->empty()) DPT_THROW(ConfigError, "--master-addr must not be empty");
  if (opts.nnodes > 1 && !opts.master_addr) {
    DPT_THROW(ConfigError, "--nnodes {} needs --master-addr: the address of node 0, reachable from every node",
              opts.min_nnodes ? fmt::format("{}:{}", *opts.min_nnodes, opts.nnodes) : std::to_string(opts.nnodes));
  }
  if (opts.master_port && (*opts.master_port < 1 || *opts.master_port > kMaxPort)) {
    DPT_THROW(ConfigError, "--master-port must be in 1..{} (got {})", kMaxPort, *opts.master_port);
  }
  if (!(opts.stop_timeout_s >= 0 && opts.stop_timeout_s <= kMaxGracePeriodS)) {  // also rejects NaN
    DPT_THROW(ConfigError, "--stop-timeout must be between 0 and {} seconds (got {})", kMaxGracePeriodS,
              opts.stop_timeout_s);
  }
  if (!(opts.grace_period_s >= 0 && opts.grace_period_s <= kMaxGracePeriodS)) {  // also rejects NaN
    DPT_THROW(ConfigError, "--grace-period must be between 0 and {} seconds (got {})", kMaxGracePeriodS,
              opts.grace_period_s);
  }
  if (opts.max_restarts < 0 || opts.max_restarts > kMaxRestarts) {
    DPT_THROW(ConfigError, "--max-restarts must be in 0..{} (got {})", kMaxRestarts, opts.max_restarts);
  }
  if (!(opts.rdzv_timeout_s > 0 && opts.rdzv_timeout_s <= kMaxGracePeriodS)) {  // also rejects NaN
    DPT_THROW(ConfigError, "--rdzv-timeout must be more than 0 and at most {} seconds (got {})", kMaxGracePeriodS,
              opts.rdzv_timeout_s);
  }
  if (opts.command.empty()) {
    DPT_THROW(ConfigError, "no program to run: give it after '--', as in: dprun --nproc-per-node 2 -- ./train --lr 0.1");
  }
  if (opts.command[0].empty()) DPT_THROW(ConfigError, "the program name after '--' is empty");
}

void parse_nnodes(const std::string& text, Options& opts) {
  auto number = [&](std::string_view part) {
    int v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc{} || end != part.data() + part.size()) {
      DPT_THROW(ConfigError, "--nnodes must be a number of nodes N or a range MIN:MAX (got '{}')", text);
    }
    return v;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    opts.nnodes = number(text);
    opts.min_nnodes.reset();
  } else {
    opts.min_nnodes = number(std::string_view(text).substr(0, colon));
    opts.nnodes = number(std::string_view(text).substr(colon + 1));
  }
}

Placement static_placement(const Options& opts) {
  DPT_CHECK(opts.master_port.has_value(), "static_placement needs resolved options (call resolve)");
  return Placement{global_rank(opts, 0), opts.nnodes * opts.nproc_per_node, opts.node_rank, *opts.master_port,
                   opts.nnodes};
}

Options resolve(Options opts) {
  validate(opts);
  if (!opts.master_addr) opts.master_addr = kLoopbackAddr;  // validate() ensured nnodes == 1
  if (!opts.master_port) opts.master_port = opts.nnodes > 1 ? kDefaultMultiNodePort : find_free_port();
  return opts;
}

Environment rank_environment(const Options& opts, int local_rank, const Environment& inherited, int restart) {
  DPT_CHECK(opts.master_addr && opts.master_port, "rank_environment needs resolved options (call resolve)");
  return rank_environment(opts, static_placement(opts), local_rank, inherited, restart);
}

Environment rank_environment(const Options& opts, const Placement& where, int local_rank,
                             const Environment& inherited, int restart) {
  using namespace std::string_literals;
  DPT_CHECK(opts.master_addr && opts.master_port, "rank_environment needs resolved options (call resolve)");
  DPT_CHECK(local_rank >= 0 && local_rank < opts.nproc_per_node, "local rank {} of {}", local_rank,
            opts.nproc_per_node);
  DPT_CHECK(restart >= 0, "restart count {}", restart);
  Environment env = inherited;
  env["RANK"] = std::to_string(where.first_rank + local_rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(where.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(opts.nproc_per_node);
  env["NODE_RANK"] = std::to_string(where.group_rank);
  env["GROUP_RANK"] = std::to_string(where.group_rank);  // torchrun's name for the node rank
  // torchrun's too: the nodes, and the rank and world of the one role dprun has (torchrun's default role's name).
  env["GROUP_WORLD_SIZE"] = std::to_string(where.group_world_size);
  env["ROLE_RANK"] = env["RANK"];
  env["ROLE_WORLD_SIZE"] = env["WORLD_SIZE"];
  env["ROLE_NAME"] = "default"s;
  env["MASTER_ADDR"] = *opts.master_addr;
  env["MASTER_PORT"] = std::to_string(where.master_port);
  // std::string values ("0"s): assigning a char literal trips GCC 12's false -Wrestrict (GCC PR 105329).
  env["DPT_RESTART_COUNT"] = std::to_string(restart);  // 0 first; k on the k-th restart (--max-restarts)
  // The numbering above is the job's, even where dprun runs inside mpirun or srun (one dprun per node), whose
  // OMPI_COMM_WORLD_* or SLURM_* the ranks inherit: dptrain checks RANK against those only without this.
  env["DPT_LAUNCHER"] = "dprun"s;
  // Through the environment only: a command line is world-readable in /proc/PID/cmdline, the environment is not.
  if (!opts.store_token.empty()) env["DPT_STORE_TOKEN"] = opts.store_token;
  // N ranks each starting one OpenMP thread per core would oversubscribe the machine N times (torchrun does
  // the same); a value the user set is theirs, unless OpenMP would ignore it ('', 'abc', '0': core/thread_env.h).
  if (auto omp = env.find("OMP_NUM_THREADS"); omp == env.end() || !omp_num_threads_valid(omp->second))
    env["OMP_NUM_THREADS"] = "1"s;
  // With prefixes, the trainer leaves the rank out of its own log lines; with log files it must keep it.
  if (opts.log_dir.empty()) {
    env["DPT_RANK_PREFIXED"] = "1"s;
    // dprun's stdout is a terminal: rank 0 may keep its progress on one live line ('\r'), which dprun relays in
    // place (launcher/output.h). A value the user set is theirs (DPT_LIVE_LINE=0 turns it off).
    if (::isatty(STDOUT_FILENO) == 1) env.try_emplace("DPT_LIVE_LINE", "1"s);
  } else {
    env.erase("DPT_RANK_PREFIXED");
  }
  return env;
}

std::string job_store_token(const Options& opts, const Environment& inherited) {
  if (auto it = inherited.find("DPT_STORE_TOKEN"); it != inherited.end() && !it->second.empty()) return it->second;
  if (opts.nnodes > 1) {
    DPT_THROW(ConfigError,
              "--nnodes {} needs DPT_STORE_TOKEN in the environment, the same on every node: rank 0's rendezvous "
              "store admits only processes that present the job's token, and each node's dprun would make up a "
              "different one. Make one, e.g. export DPT_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'), "
              "and export that value on every node",
              opts.nnodes);
  }
  return random_token();
}

std::string random_token() {
  constexpr std::size_t kBytes = 16;  // 128 bits
  unsigned char bytes[kBytes];
  std::size_t got = 0;
  while (got < kBytes) {
    const ssize_t n = ::getrandom(bytes + got, kBytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // no getrandom (ENOSYS on an old kernel): /dev/urandom below
    got += static_cast<std::size_t>(n);
  }
  if (got < kBytes) {
    const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      DPT_THROW(IoError, "no random bytes for the rendezvous token: opening /dev/urandom failed: {}",
                std::strerror(errno));
    }
    got = 0;
    while (got < kBytes) {
      const ssize_t n = ::read(fd, bytes + got, kBytes - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        ::close(fd);
        DPT_THROW(IoError, "no random bytes for the rendezvous token: reading /dev/urandom failed: {}",
                  std::strerror(err));
      }
      got += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
  std::string hex;
  hex.reserve(2 * kBytes);
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

bool port_bindable(int port) {
  DPT_CHECK(port >= 1 && port <= kMaxPort, "port {}", port);
  // IPv4 wildcard: it conflicts with a listener on any IPv4 address and with a dual-stack IPv6 one alike.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) DPT_THROW(IoError, "checking port {}: socket failed: {}", port, std::strerror(errno));
  int one = 1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                  ::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);  // never listened: leaves no TIME_WAIT behind
  return ok;
}

Environment current_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.try_emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));  // first one wins, as getenv
  }
  return env;
}

}  // namespace dpt::launcher
