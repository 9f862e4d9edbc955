// comm/init.cpp: resolve_backend and init_process_group: a TcpStore hosted by rank 0 and a Gloo group, or
// an MPI group, checked against the launcher's environment; either wrapped in a TracedGroup, whose hang reports
// travel through a store client of their own (MPI: a diagnostics store that rank 0 serves).
#include "comm/init.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include <spdlog/spdlog.h>

#include "comm/c10d_store.h"
#include "comm/gloo_backend.h"
#include "comm/mpi_backend.h"
#include "comm/staging.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "comm/traced_group.h"
#include "core/check.h"
#include "core/cuda.h"
#ifdef DPT_WITH_CUDA
#include "comm/nccl_backend.h"
#endif

namespace dpt::comm {

std::string resolve_backend(const std::string& requested, const DistEnv& env, Device device, int device_count) {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const char* host_backend = env.mpi_available ? "mpi" : "gloo";
  const bool gpu_each = device.is_cuda() && device_count >= env.local_world_size;
  if (name == "auto") return gpu_each && cuda::built() ? "nccl" : host_backend;
  if (name == "gloo" || name == "mpi") return name;
  if (name == "nccl") {
    if (!cuda::built())
      DPT_THROW(ConfigError, "backend nccl needs CUDA, and this dptrain was built without it; use gloo or mpi");
    if (!device.is_cuda())
      DPT_THROW(ConfigError, "dist.backend = nccl needs a GPU, and this rank runs on {}{}; use dist.backend = auto, gloo "
                "or mpi", device.str(), device_count == 0 ? " (" + cuda::unavailable_reason() + ")" : "");
    // Fewer visible GPUs than local ranks is fine when each rank sees only its own (CUDA_VISIBLE_DEVICES per
    // rank, Slurm --gpus-per-task); if two ranks do land on one GPU, NCCL itself refuses with its message.
    return name;
  }
  DPT_THROW(ConfigError, "unknown backend '{}'; valid: auto, gloo, mpi, nccl", requested);
}

namespace {

bool loopback(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

std::string address_text(const in_addr& a) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, text, sizeof(text));
  return text;
}

// The first IPv4 address of interface `name` ("" for none); with `name` empty, of the first interface that is up and
// not loopback, whose name goes to `*found`.
std::string interface_address(const std::string& name, std::string* found = nullptr) {
  struct ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string out;
  for (const struct ifaddrs* i = all; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (name.empty() ? ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0 || loopback(a))
                     : name != i->ifa_name)
      continue;
    out = address_text(a);
    if (found) *found = i->ifa_name;
  }
  ::freeifaddrs(all);
  return out;
}

// The first IPv4 address `host` resolves to that is not loopback; "" for none.
std::string resolve_not_loopback(const std::string& host) {
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return "";
  std::string out;
  for (const struct addrinfo* r = res; r != nullptr && out.empty(); r = r->ai_next) {
    const in_addr a = reinterpret_cast<const sockaddr_in*>(r->ai_addr)->sin_addr;
    if (!loopback(a)) out = address_text(a);
  }
  ::freeaddrinfo(res);
  return out;
}

// The interface of the IPv4 default route (/proc/net/route), "" for none.
std::string default_route_interface() {
  std::ifstream routes("/proc/net/route");
  std::string line;
  std::getline(routes, line);  // the header
  while (std::getline(routes, line)) {
    std::istringstream fields(line);
    std::string iface, destination;
    if (fields >> iface >> destination && destination == "00000000") return iface;
  }
  return "";
}

}  // namespace

ChosenAddress rank0_address(const DistEnv& env, const std::string& iface) {
  if (env.local_world_size >= env.world_size)
    return {"127.0.0.1", fmt::format("all {} ranks run on rank 0's host", env.world_size)};
  const std::string named = iface.substr(0, iface.find(','));
  if (!named.empty()) {
    if (std::string a = interface_address(named); !a.empty())
      return {a, fmt::format("the address of interface {} (dist.interface or GLOO_SOCKET_IFNAME)", named)};
  }
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) name[0] = 0;
  if (std::string a = resolve_not_loopback(name); !a.empty())
    return {a, fmt::format("what rank 0's host name {} resolves to", name)};
  if (const std::string route = default_route_interface(); !route.empty()) {
    if (std::string a = interface_address(route); !a.empty() && a.rfind("127.", 0) != 0)
      return {a, fmt::format("the address of {}, the interface of rank 0's default route", route)};
  }
  std::string first;
  if (std::string a = interface_address("", &first); !a.empty())
    return {a, fmt::format("the address of {}, rank 0's first interface that is up and not loopback", first)};
  return {name[0] ? name : "127.0.0.1", "rank 0's host name: its host has no IPv4 address but loopback"};
}

namespace {

// The c10d protocol of torchrun's agent store: DPT_C10D_PROTOCOL (1 or 2) when set, else asked of the server
// (comm/c10d_store.h). A 1.x server is silent while it serves another client's request, so where the environment is
// torchrun 1.x's (NCCL_ASYNC_ERROR_HANDLING, which 2.x renamed TORCH_NCCL_ASYNC_ERROR_HANDLING) the probe waits for
// its answer up to the store's timeout; elsewhere 2 s of silence mean 2.x's libuv server.
C10dProtocol agent_store_protocol(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (const char* forced = std::getenv("DPT_C10D_PROTOCOL"); forced && *forced) {
    const std::string v = forced;
    if (v == "1") return C10dProtocol::V1;
    if (v == "2") return C10dProtocol::V2;
    DPT_THROW(ConfigError, "environment variable DPT_C10D_PROTOCOL={} must be 1 (torch 1.x's c10d store) or 2", v);
  }
  const bool torch1_env = std::getenv("NCCL_ASYNC_ERROR_HANDLING") && !std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") &&
                          !std::getenv("TORCHELASTIC_SIGNALS_TO_HANDLE");
  const auto silence = torch1_env ? (timeout.count() < 0 ? std::chrono::milliseconds(300'000) : timeout)
                                  : std::chrono::milliseconds(2000);
  return probe_c10d_protocol(env.master_addr, env.master_port, timeout, silence);
}

// Under torchrun's agent store, a client of it (comm/c10d_store.h); its protocol found once per address.
std::shared_ptr<Store> agent_store_client(const DistEnv& env, std::chrono::milliseconds timeout) {
  static std::mutex mu;
  static std::map<std::string, C10dProtocol> known;
  std::lock_guard<std::mutex> lock(mu);
  const std::string address = fmt::format("{}:{}", env.master_addr, env.master_port);
  auto it = known.find(address);
  if (it == known.end()) {
    it = known.emplace(address, agent_store_protocol(env, timeout)).first;
    if (env.rank == 0)
      spdlog::info("store: torchrun's agent store at {} (c10d TCPStore, torch {} protocol)", address,
                   it->second == C10dProtocol::V1 ? "1.x" : "2.x");
  }
  return std::make_shared<C10dStore>(env.master_addr, env.master_port, timeout, &it->second);
}

// WORLD_SIZE must be the same on every rank. A node whose dprun had another --nproc-per-node (or a rank started by hand
// with another WORLD_SIZE) otherwise waited for ranks that do not exist until dist.timeout_s, or failed a Gloo check
// ("sizeof(impl_) == bytes.size()"). Rank 0 publishes its world size; every other rank compares its own with it and,
// on a difference, leaves the message in the store (for rank 0, whose rendezvous then fails with it) and throws it.
constexpr const char* kWorldSize = "world_size/0";
constexpr const char* kWorldMismatch = "world_size/mismatch";
constexpr const char* kWorldMismatches = "world_size/mismatches";

void check_world_size(Store& store, const DistEnv& env) {
  if (env.rank == 0) {
    store.set(kWorldSize, std::to_string(env.world_size));
    return;
  }
  const std::string theirs = store.get_string(kWorldSize);
  if (theirs == std::to_string(env.world_size)) return;
  const std::string msg = fmt::format(
      "rank {} has WORLD_SIZE {} but rank 0 has WORLD_SIZE {}: every rank of a job needs the same world size (dprun: "
      "the same --nnodes and --nproc-per-node on every node)", env.rank, env.world_size, theirs);
  store.set(kWorldMismatch, msg);
  store.add(kWorldMismatches, 1);
  DPT_THROW(ConfigError, "{}", msg);
}

// The job's TcpStore: rank 0 hosts it at MASTER_ADDR:MASTER_PORT; one process needs none. Under torchrun's agent
// store, that store (dptrain's keys are all under dpt/restartN/).
std::shared_ptr<Store> job_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return std::make_shared<HashStore>(timeout);
  if (env.agent_store) return agent_store_client(env, timeout);
  TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.is_server = env.rank == 0;
  so.timeout = timeout;
  so.token = env.store_token;  // DPT_STORE_TOKEN: clients without it are turned away
  auto store = std::make_shared<TcpStore>(so);
  if (!so.is_server && store->add(kElasticRendezvousKey, 0) > 0) {  // comm/store.h
    const std::string msg = fmt::format(
        "MASTER_ADDR:MASTER_PORT ({}:{}) is the rendezvous of an elastic dprun job (node 0's dprun was started with "
        "--nnodes MIN:MAX or --max-restarts), not rank 0's store: this rank's node was started as a job that is not "
        "elastic. Give every node's dprun the same --nnodes and --max-restarts", so.host, so.port);
    if (store->add(kNotElasticCount, 1) == 1) store->set(kNotElasticKey, fmt::format("rank {}: {}", env.rank, msg));
    DPT_THROW(ConfigError, "{}", msg);
  }
  return store;
}

// Hang reports (comm/traced_group.h) go through a store client of their own, whose requests time out quickly:
// a stopped rank 0, whose process serves the store, then costs a report about this long, never dist.timeout_s.
constexpr std::chrono::milliseconds kReportStoreTimeout = std::chrono::seconds(1);
// How long that client may take to connect at start-up, when the server is known to be up.
std::chrono::milliseconds report_connect_timeout(std::chrono::milliseconds timeout) {
  return timeout.count() < 0 ? std::chrono::seconds(30) : std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30));
}

// A client of the store at so.host:so.port for this attempt's hang reports; null (with a warning) when it cannot
// connect: a hang is then reported by each rank about itself alone.
std::shared_ptr<Store> report_client(const DistEnv& env, const TcpStoreOptions& so) {
  try {
    auto tcp = std::make_shared<TcpStore>(so);
    tcp->set_timeout(kReportStoreTimeout);
    return std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/hang", env.restart_count), tcp);  // takes its timeout
  } catch (const std::exception& e) {
    spdlog::warn("no store for hang reports ({}): a hang will be reported by each rank about itself alone", e.what());
    return nullptr;
  }
}

// Gloo: the job's store, which rank 0 serves for the group's lifetime.
std::shared_ptr<Store> gloo_report_store(const DistEnv& env, const InitOptions& opts) {
  if (env.world_size == 1) return nullptr;
  if (env.agent_store) {
    try {
      auto c10d = agent_store_client(env, report_connect_timeout(opts.timeout));
      c10d->set_timeout(kReportStoreTimeout);
      return std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/hang", env.restart_count), c10d);
    } catch (const std::exception& e) {
      spdlog::warn("no store for hang reports ({}): a hang will be reported by each rank about itself alone", e.what());
      return nullptr;
    }
  }
  TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.timeout = report_connect_timeout(opts.timeout);
  so.token = env.store_token;  // as job_store's clients
  return report_client(env, so);
}

// MPI has no store: rank 0 serves one for the hang reports alone, on a free port, and tells the others where (and
// its token) by MPI broadcast. Its address: MASTER_ADDR when set, else rank0_address (its host name once, which
// may resolve to loopback, where no other host finds it: their report client then waited up to dist.timeout_s).
// The server lives as long as the returned store (rank 0's holds it).
std::shared_ptr<Store> mpi_report_store(ProcessGroup& mpi, const DistEnv& env, const InitOptions& opts) {
  if (env.world_size == 1) return nullptr;
  Tensor msg = Tensor::zeros({1024}, DType::U8);
  std::shared_ptr<TcpStore> server;
  if (env.rank == 0) {
    std::string line;
    try {
      const std::string host = env.master_addr_set ? env.master_addr : rank0_address(env, "").addr;
      std::string token = env.store_token;
      if (token.empty()) {  // keep strangers out of it all the same
        std::random_device rd;
        token = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
      }
      TcpStoreOptions so;
      so.host = "127.0.0.1";  // rank 0's own client; the server listens on every interface
      so.port = 0;
      so.is_server = true;
      so.timeout = report_connect_timeout(opts.timeout);
      so.token = token;
      server = std::make_shared<TcpStore>(so);
      line = fmt::format("{}\n{}\n{}", host, server->port(), token);
    } catch (const std::exception& e) {
      spdlog::warn("no store for hang reports under MPI ({}): a hang will be reported by each rank about itself alone",
                   e.what());
    }
    if (line.size() >= msg.numel()) {  // never skip the broadcast below: the others wait in it
      spdlog::warn("no store for hang reports under MPI: its address and token take {} bytes", line.size());
      line.clear();
      server.reset();
    }
    std::memcpy(msg.data<uint8_t>(), line.data(), line.size());
  }
  mpi.broadcast(msg)->wait();  // every rank takes part, whatever rank 0 managed
  const std::string line(reinterpret_cast<const char*>(msg.data<uint8_t>()));
  if (line.empty()) return nullptr;
  if (server) {
    server->set_timeout(kReportStoreTimeout);
    return std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/hang", env.restart_count), server);
  }
  const size_t a = line.find('\n'), b = line.find('\n', a + 1);
  DPT_CHECK(a != std::string::npos && b != std::string::npos, "diagnostics store address '{}'", line);
  TcpStoreOptions so;
  so.host = line.substr(0, a);
  so.port = std::stoi(line.substr(a + 1, b - a - 1));
  so.timeout = report_connect_timeout(opts.timeout);
  so.token = line.substr(b + 1);
  return report_client(env, so);
}

// MASTER_ADDR=localhost or 127.0.0.1 (a torchrun habit: `export MASTER_ADDR=localhost`) where the ranks span hosts:
// every other host's ranks would look for the store at their own loopback until dist.timeout_s. ConfigError.
void check_reachable_master(const DistEnv& env) {
  if (!env.master_addr_set || env.local_world_size >= env.world_size) return;
  in_addr a4{};
  in6_addr a6{};
  const std::string& m = env.master_addr;
  const bool loop = m == "localhost" || (::inet_pton(AF_INET, m.c_str(), &a4) == 1 && loopback(a4)) ||
                    (::inet_pton(AF_INET6, m.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6));
  if (!loop) return;
  DPT_THROW(ConfigError, "MASTER_ADDR={} is a loopback address, but mpirun placed the {} ranks on several hosts "
            "(OMPI_COMM_WORLD_LOCAL_SIZE={}): the other hosts' ranks would look for rank 0's store at their own. "
            "Unset MASTER_ADDR (rank 0 then sends its address to every rank by MPI), or set one every host reaches",
            m, env.world_size, env.local_world_size);
}

// Gloo under mpirun: with MASTER_ADDR unset, the default 127.0.0.1 once left every rank on another host looking for
// the store at its own loopback until dist.timeout_s (and with MASTER_PORT unset two jobs on one host met at 29500).
// Rank 0 hosts the store now, at MASTER_PORT or else a free port, and sends its address (MASTER_ADDR or else
// rank0_address) and port, or why it could not host it, to every rank by MPI; `env` gets them (rank 0's word
// wins). Returns rank 0's store (null on the other ranks), for the job's store.
std::shared_ptr<Store> store_by_mpi(ProcessGroup& mpi, DistEnv& env, const InitOptions& opts,
                                    const std::string& iface) {
  Tensor msg = Tensor::zeros({1024}, DType::U8);
  std::shared_ptr<TcpStore> store;
  std::exception_ptr failed;
  if (env.rank == 0) {
    std::string line;
    try {
      const ChosenAddress where = env.master_addr_set ? ChosenAddress{env.master_addr, "MASTER_ADDR"}
                                                      : rank0_address(env, iface);
      check_reachable_master(env);
      TcpStoreOptions so;
      so.host = "127.0.0.1";  // rank 0's own client; the server listens on every interface
      so.port = env.master_port_set ? env.master_port : 0;
      so.is_server = true;
      so.timeout = opts.timeout;
      so.token = env.store_token;
      store = std::make_shared<TcpStore>(so);
      line = fmt::format("{}\n{}", where.addr, store->port());
      spdlog::info("rendezvous under mpirun: rank 0 hosts the store at {}:{} and sent that to every rank by MPI "
                   "(address: {}; port: {})", where.addr, store->port(),
                   env.master_addr_set ? "MASTER_ADDR" : where.why + ", as MASTER_ADDR is unset",
                   env.master_port_set ? "MASTER_PORT" : "a free one, as MASTER_PORT is unset");
    } catch (const std::exception& e) {
      failed = std::current_exception();
      line = fmt::format("{}{}", dynamic_cast<const ConfigError*>(&e) ? '?' : '!', e.what());
    }
    line.resize(std::min<size_t>(line.size(), msg.numel() - 1));
    std::memcpy(msg.data<uint8_t>(), line.data(), line.size());
  }
  mpi.broadcast(msg)->wait();  // every rank takes part, whatever rank 0 managed
  if (failed) std::rethrow_exception(failed);
  const std::string line(reinterpret_cast<const char*>(msg.data<uint8_t>()));
  if (line.starts_with('?')) DPT_THROW(ConfigError, "{} (rank 0's finding)", line.substr(1));
  if (line.starts_with('!')) DPT_THROW(CommError, "rank 0 could not host the job's store: {}", line.substr(1));
  const size_t nl = line.find('\n');
  DPT_CHECK(nl != std::string::npos, "store address from rank 0: '{}'", line);
  env.master_addr = line.substr(0, nl);
  env.master_port = std::stoi(line.substr(nl + 1));
  return store;
}

// "mpi", or "mpi (dist.backend = auto)" when the request named none.
std::string backend_phrase(const std::string& choice) {
  const size_t nl = choice.find('\n');
  const std::string resolved = choice.substr(0, nl), requested = nl == std::string::npos ? "" : choice.substr(nl + 1);
  return requested.empty() || requested == resolved ? resolved
                                                    : fmt::format("{} (dist.backend = {})", resolved, requested);
}

// Under mpirun, a rank whose backend differed from its peers' (dist.backend given to some ranks
// only, or auto finding a GPU on some ranks only) once waited until dist.timeout_s: in MPI_Init, which waits for
// every rank, or at a TcpStore the mpi ranks never came to, and then said only that. Every rank can start MPI
// whatever it chose, so the ranks first compare their choices there: on a difference every rank throws the same
// ConfigError, naming the ranks and their choices. Returns the MPI group, to keep until the real group exists.
std::unique_ptr<MpiProcessGroup> agree_on_backend(const std::string& backend, const std::string& requested,
                                                  const DistEnv& env) {
  auto mpi = std::make_unique<MpiProcessGroup>(&env);
  constexpr int64_t kSlot = 64;
  std::string lowered = requested;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string mine = (backend + "\n" + lowered).substr(0, kSlot - 1);
  Tensor one = Tensor::zeros({kSlot}, DType::U8);
  std::memcpy(one.data<uint8_t>(), mine.data(), mine.size());
  Tensor all = Tensor::zeros({kSlot * env.world_size}, DType::U8);
  mpi->allgather(one, all)->wait();
  std::vector<std::pair<std::string, std::vector<int>>> choices;  // in the order of their first rank
  for (int r = 0; r < env.world_size; ++r) {
    const auto* p = reinterpret_cast<const char*>(all.data<uint8_t>() + kSlot * r);
    const std::string choice(p, strnlen(p, kSlot));
    auto it = std::find_if(choices.begin(), choices.end(), [&](const auto& c) { return c.first == choice; });
    if (it == choices.end()) it = choices.insert(choices.end(), {choice, {}});
    it->second.push_back(r);
  }
  if (choices.size() == 1) return mpi;
  std::vector<std::string> parts;
  for (const auto& [choice, ranks] : choices) {
    constexpr size_t kListed = 8;
    std::vector<int> head(ranks.begin(), ranks.begin() + static_cast<long>(std::min(ranks.size(), kListed)));
    parts.push_back(fmt::format("{} {}{}: {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(head, ", "),
                                ranks.size() > kListed ? fmt::format(" and {} more", ranks.size() - kListed) : "",
                                backend_phrase(choice)));
  }
  // Every rank is here and throws: MPI can be shut down in order, rather than warned about (a failing rank's skip).
  mpi.reset();
  DPT_THROW(ConfigError, "the ranks chose different process-group backends ({}): every rank of a job needs the same "
            "one; give every rank the same dist.backend (or the same GPUs visible, for auto)", fmt::join(parts, "; "));
}

#ifdef DPT_WITH_CUDA
std::unique_ptr<ProcessGroup> init_nccl(const DistEnv& env, const InitOptions& opts) {
  // Rank 0 makes the communicator's id; the others get it through the store, or by MPI under mpirun.
  std::string uid;
  std::shared_ptr<void> keep;
  if (env.world_size == 1) {
    uid = nccl_unique_id();
  } else if (env.mpi_available) {
    auto mpi = std::make_shared<MpiProcessGroup>(&env);
    Tensor bytes = Tensor::zeros({128}, DType::U8);
    if (env.rank == 0) {
      const std::string id = nccl_unique_id();
      std::copy(id.begin(), id.end(), bytes.data<uint8_t>());
    }
    mpi->broadcast(bytes)->wait();
    uid.assign(reinterpret_cast<const char*>(bytes.data<uint8_t>()), 128);
    keep = mpi;
  } else {
    auto store = std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/nccl", env.restart_count),
                                               job_store(env, opts.timeout));
    if (env.rank == 0) store->set("unique_id", nccl_unique_id());
    auto v = store->get("unique_id");
    uid.assign(v.begin(), v.end());
    keep = store;
  }
  auto pg = std::make_unique<NcclProcessGroup>(env.rank, env.world_size, opts.device.index, uid,
                                               NcclOptions{.timeout = opts.timeout, .on_fatal = opts.on_fatal}, keep);
  // All ranks joined: a barrier also proves the communicator works before training starts.
  pg->barrier();
  if (env.rank == 0) spdlog::info("process group: nccl {}, world {}", nccl_version(), env.world_size);
  return pg;
}
#endif

// The interface Gloo is told to listen on must exist on this host. A one-node job listens on loopback whatever it
// names (gloo_bind), so a misspelt dist.interface went unnoticed there, to fail only once the job ran on two nodes.
void check_interface(const std::string& list, const std::string& from) {
  const std::string name = list.substr(0, list.find(','));  // GLOO_SOCKET_IFNAME may list several; Gloo takes one
  if (name.empty() || ::if_nametoindex(name.c_str()) != 0) return;
  std::vector<std::string> names;
  if (struct if_nameindex* all = ::if_nameindex()) {
    for (const struct if_nameindex* i = all; i->if_index != 0; ++i) names.emplace_back(i->if_name);
    ::if_freenameindex(all);
  }
  DPT_THROW(ConfigError, "{} = {}: this host has no network interface {} (it has: {})", from, list, name,
            fmt::join(names, ", "));
}

// The interface Gloo listens on: dist.interface, else GLOO_SOCKET_IFNAME, else none (found from the route).
std::string gloo_interface(const InitOptions& opts) {
  if (!opts.interface.empty()) return opts.interface;
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  return iface ? iface : "";
}

// `trace` gets the store the group's hang reports meet in. `hosted`: the job's store when store_by_mpi made it
// already (rank 0 under mpirun), else null.
std::unique_ptr<ProcessGroup> init_host_backend(const std::string& backend, const DistEnv& env,
                                                const InitOptions& opts, TracedGroupOptions& trace,
                                                std::shared_ptr<Store> hosted) {
  trace.store_host = 0;
  if (backend == "mpi") {
    auto pg = std::make_unique<MpiProcessGroup>(&env);
    trace.report_store = mpi_report_store(*pg, env, opts);
    if (env.rank == 0) spdlog::info("process group: mpi, world {}", env.world_size);
    return pg;
  }
  // gloo. A single process needs no server (and no port): the job store is then in-process.
  // Keys of an earlier attempt of a restarted job stay away from this one's.
  GlooOptions go;
  go.timeout = opts.timeout;
  go.master_addr = env.master_addr;
  go.iface = gloo_interface(opts);
  check_interface(go.iface, opts.interface.empty() ? "GLOO_SOCKET_IFNAME" : "dist.interface");
  auto prefixed = std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/gloo", env.restart_count),
                                                hosted ? hosted : job_store(env, opts.timeout));
  if (env.world_size > 1) check_world_size(*prefixed, env);
  // The constructor ends with a barrier: every rank is connected, so rank 0's store server (kept alive by the
  // group) is no longer needed by anyone's rendezvous.
  std::unique_ptr<GlooProcessGroup> pg;
  try {
    pg = std::make_unique<GlooProcessGroup>(prefixed, env.rank, env.world_size, go);
  } catch (const CommError& e) {
    // Rank 0 waited for ranks that another world size left out: say so rather than only that they never came.
    if (env.rank == 0 && prefixed->add(kWorldMismatches, 0) > 0)
      DPT_THROW(ConfigError, "{}; so the rendezvous failed: {}", prefixed->get_string(kWorldMismatch), e.what());
    throw;
  }
  trace.report_store = gloo_report_store(env, opts);
  if (env.rank == 0) {
    spdlog::info("process group: gloo, world {}, rendezvous {}:{}{}", env.world_size, env.master_addr,
                 env.master_port, env.agent_store ? " (torchrun's agent store)" : "");
  }
  return pg;
}

}  // namespace

std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, const InitOptions& opts) {
  // A peer that exits closes its sockets, and gloo writes to them with writev (no MSG_NOSIGNAL): SIGPIPE, whose
  // default action killed this rank silently (exit 141, no message) before the collective could name the peer.
  // Ignored for the process, as Python (and so PyTorch) ignores it: the write fails with EPIPE, the collective
  // throws, and the rank exits 1 saying which peer went away.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
  const std::string backend = resolve_backend(opts.backend, env, opts.device, cuda::device_count());
  DPT_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "rank {} of {}", env.rank,
            env.world_size);
  // Under mpirun, the backends compared first (through MPI, which every rank mpirun started can start); gloo then
  // needs MPI no more, and it is finalised at once, on every rank together. Not under srun with PMI: an Open MPI
  // built without that PMI's support aborts in MPI_Init, and gloo ranks there never started MPI. (A process whose MPI
  // was finalised already: skipped.)
  std::unique_ptr<MpiProcessGroup> agreement;
  if (env.launcher == Launcher::OpenMPI && env.world_size > 1 && !MpiProcessGroup::finalized())
    agreement = agree_on_backend(backend, opts.backend, env);
  // Every gloo rank under mpirun takes rank 0's word for the store's address (store_by_mpi), whatever its own
  // environment says: all of them or none take part in the broadcast.
  DistEnv placed = env;
  std::shared_ptr<Store> hosted;
  if (agreement && backend == "gloo") hosted = store_by_mpi(*agreement, placed, opts, gloo_interface(opts));
  if (backend == "gloo") agreement.reset();
  TracedGroupOptions trace;
  trace.timeout = opts.timeout;
  trace.on_hang = opts.on_fatal;
  if (const char* reason = std::getenv("DPT_REASON_FILE")) trace.reason_file = reason;  // dprun's
#ifdef DPT_WITH_CUDA
  if (backend == "nccl") {
    // NCCL's own watchdog decides (and calls on_fatal); its reason goes to the reason file first.
    InitOptions o = opts;
    o.on_fatal = [reason_file = trace.reason_file, rank = env.rank, fatal = opts.on_fatal](const std::string& why) {
      std::string_view line = why;
      if (line.starts_with(kHangPrefix)) line.remove_prefix(kHangPrefix.size());
      write_reason_once(reason_file, fmt::format("rank {}: {}", rank, line));
      if (fatal) fatal(why);
    };
    trace.watchdog = false;
    return std::make_unique<TracedGroup>(init_nccl(env, o), std::move(trace));
  }
#endif
  auto pg = init_host_backend(backend, placed, opts, trace, std::move(hosted));
  if (!opts.device.is_cuda()) return std::make_unique<TracedGroup>(std::move(pg), std::move(trace));
  if (env.rank == 0)
    spdlog::info("process group: {} stages GPU tensors through pinned host memory{}", backend,
                 opts.backend == "auto" ? fmt::format(" ({} local ranks, {} visible GPU(s); if each rank has a GPU of "
                                                      "its own, dist.backend = nccl is faster)",
                                                      env.local_world_size, cuda::device_count())
                                        : "");
  return std::make_unique<TracedGroup>(std::make_unique<HostStagedGroup>(std::move(pg)), std::move(trace));
}

}  // namespace dpt::comm
