// comm/init.cpp: resolve_backend and init_process_group: a TcpStore hosted by rank 0 and a Gloo group, or
// an MPI group, checked against the launcher's environment.
#include "comm/init.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "comm/gloo_backend.h"
#include "comm/mpi_backend.h"
#include "comm/staging.h"
#include "comm/store.h"
#include "comm/tcp_store.h"
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

// The job's TcpStore: rank 0 hosts it at MASTER_ADDR:MASTER_PORT; one process needs none.
std::shared_ptr<Store> job_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return std::make_shared<HashStore>(timeout);
  TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.master_port;
  so.is_server = env.rank == 0;
  so.timeout = timeout;
  return std::make_shared<TcpStore>(so);
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

std::unique_ptr<ProcessGroup> init_host_backend(const std::string& backend, const DistEnv& env,
                                                const InitOptions& opts) {
  if (backend == "mpi") {
    auto pg = std::make_unique<MpiProcessGroup>(&env);
    if (env.rank == 0) spdlog::info("process group: mpi, world {}", env.world_size);
    return pg;
  }
  // gloo. A single process needs no server (and no port): the job store is then in-process.
  // Keys of an earlier attempt of a restarted job stay away from this one's.
  auto prefixed = std::make_shared<PrefixStore>(fmt::format("dpt/restart{}/gloo", env.restart_count),
                                                job_store(env, opts.timeout));
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

}  // namespace

std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, const InitOptions& opts) {
  const std::string backend = resolve_backend(opts.backend, env, opts.device, cuda::device_count());
  DPT_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "rank {} of {}", env.rank,
            env.world_size);
#ifdef DPT_WITH_CUDA
  if (backend == "nccl") return init_nccl(env, opts);
#endif
  auto pg = init_host_backend(backend, env, opts);
  if (!opts.device.is_cuda()) return pg;
  if (env.rank == 0)
    spdlog::info("process group: {} stages GPU tensors through pinned host memory{}", backend,
                 opts.backend == "auto" ? fmt::format(" ({} local ranks, {} visible GPU(s); if each rank has a GPU of "
                                                      "its own, dist.backend = nccl is faster)",
                                                      env.local_world_size, cuda::device_count())
                                        : "");
  return std::make_unique<HostStagedGroup>(std::move(pg));
}

}  // namespace dpt::comm
