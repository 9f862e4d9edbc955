// comm/init.h: init_process_group: pick the backend, rendezvous, and return the ready ProcessGroup.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/env.h"
#include "comm/process_group.h"

namespace dpt::comm {

struct InitOptions {
  std::string backend = "auto";  // auto | gloo | mpi | nccl
  std::chrono::milliseconds timeout = kDefaultTimeout;  // rendezvous and collectives
  Device device = Device::cpu();  // this rank's device: nccl needs cuda; gloo and mpi stage GPU tensors
  // gloo: the network interface to listen on (dist.interface); empty: GLOO_SOCKET_IFNAME if set, else the
  // interface whose address routes to MASTER_ADDR (gloo_bind).
  std::string interface;
  // Called when the job cannot go on and this process should end: nccl's watchdog aborted the communicator (a
  // collective failed or timed out), or a collective outlived the timeout on any backend (the message then
  // starts with kHangPrefix and names the stuck rank: comm/traced_group.h).
  std::function<void(const std::string&)> on_fatal;
};

// The backend for this environment and device. auto: "nccl" on a GPU when every local rank has a GPU of
// its own (device_count >= LOCAL_WORLD_SIZE), else "mpi" when env.mpi_available, else "gloo" (which stage
// GPU tensors through host memory). An explicit nccl on the CPU or in a CPU-only build is refused with the
// reason and the fix; with fewer visible GPUs than local ranks it is allowed (each rank may see only its own).
std::string resolve_backend(const std::string& requested, const DistEnv& env, Device device = Device::cpu(),
                            int device_count = 0);

// Where rank 0 hosts the job's store when no MASTER_ADDR says (under mpirun, which sets none): 127.0.0.1 when every
// rank is on rank 0's host (its local world size is the world size); else the address of `iface` (dist.interface or
// GLOO_SOCKET_IFNAME; the first name of a list) when it has an IPv4 one; else what this host's name resolves to, when
// that is not loopback (Debian maps it to 127.0.1.1); else the address of the interface of the default route; else
// the first address of an interface that is up and not loopback; else the host name. `why` says which, for the log.
struct ChosenAddress {
  std::string addr;
  std::string why;
};
ChosenAddress rank0_address(const DistEnv& env, const std::string& iface);

// Rendezvous (through a TcpStore hosted by rank 0 for gloo and nccl, MPI_Init for mpi; under mpirun, nccl
// passes its unique id by MPI broadcast; for gloo, rank 0 hosts the store at MASTER_ADDR or else rank0_address, on
// MASTER_PORT or else a free port, and sends the address and port to every rank by MPI) and build the group.
// Throws ConfigError for an unknown backend name (listing the valid ones) and CommError/TimeoutError when
// peers cannot be reached, naming the address.
std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, const InitOptions& opts = {});

}  // namespace dpt::comm
