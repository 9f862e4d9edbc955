// comm/init.cpp: resolve_backend and init_process_group: a TcpStore hosted by rank 0 and a Gloo group, or
// an MPI group, checked against the launcher's environment.
#include "comm/init.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "comm/gloo_backend.h"
#include "comm/mpi_backend.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
#include "core/check.h"

namespace dpt::comm {

std::string resolve_backend(const std::string& requested, const DistEnv& env) {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "auto") return env.mpi_available ? "mpi" : "gloo";
  if (name == "gloo" || name == "mpi") return name;
  if (name == "nccl") DPT_THROW(UnsupportedError, "backend nccl is not built in this version (use auto, gloo or mpi)");
  DPT_THROW(ConfigError, "unknown backend '{}'; valid: auto, gloo, mpi", requested);
}

std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, const InitOptions& opts) {
  const std::string backend = resolve_backend(opts.backend, env);
  DPT_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "rank {} of {}", env.rank,
            env.world_size);

  if (backend == "mpi") {
    auto pg = std::make_unique<MpiProcessGroup>(&env);
    if (env.rank == 0) spdlog::info("process group: mpi, world {}", env.world_size);
    return pg;
  }

  // gloo. A single process needs no server (and no port): an in-process store will do.
  std::shared_ptr<Store> store;
  if (env.world_size == 1) {
    store = std::make_shared<HashStore>(opts.timeout);
  } else {
    TcpStoreOptions so;
    so.host = env.master_addr;
    so.port = env.master_port;
    so.is_server = env.rank == 0;
    so.timeout = opts.timeout;
    store = std::make_shared<TcpStore>(so);
  }
  // Keys of an earlier attempt of a restarted job stay away from this one's.
  auto prefixed = std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/gloo", env.restart_count), store);

  GlooOptions go;
  go.timeout = opts.timeout;
  go.master_addr = env.master_addr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME")) go.iface = iface;
  // The constructor ends with a barrier: every rank is connected, so rank 0's store server (kept alive by the
  // group) is no longer needed by anyone's rendezvous.
  auto pg = std::make_unique<GlooProcessGroup>(prefixed, env.rank, env.world_size, go);
  if (env.rank == 0) {
    spdlog::info("process group: gloo, world {}, rendezvous {}:{}", env.world_size, env.master_addr,
                 env.master_port);
  }
  return pg;
}

}  // namespace dpt::comm
