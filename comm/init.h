// comm/init.h: init_process_group: pick the backend, rendezvous, and return the ready ProcessGroup.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/env.h"
#include "comm/process_group.h"

namespace dpt::comm {

struct InitOptions {
  std::string backend = "auto";  // auto | gloo | mpi
  std::chrono::milliseconds timeout = kDefaultTimeout;  // rendezvous and collectives
};

// The backend "auto" resolves to for this environment: "mpi" when env.mpi_available, else "gloo".
std::string resolve_backend(const std::string& requested, const DistEnv& env);

// Rendezvous (through a TcpStore hosted by rank 0 for gloo; MPI_Init for mpi) and build the group.
// Throws ConfigError for an unknown backend name (listing the valid ones) and CommError/TimeoutError when
// peers cannot be reached, naming the address.
std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, const InitOptions& opts = {});

}  // namespace dpt::comm
