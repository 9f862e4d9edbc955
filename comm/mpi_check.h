// comm/mpi_check.h: DPT_MPI_CHECK(call): runs an MPI call whose errors return (MPI_ERRORS_RETURN) and throws
// CommError naming the call, MPI's own error text, file:line and the rank. Internal to comm/: include it only
// where <mpi.h> is available. (Named DPT_MPI_CHECK, not MPI_CHECK: the MPI standard reserves MPI_ names.)
#pragma once

#include <mpi.h>

namespace dpt::comm::detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace dpt::comm::detail

#define DPT_MPI_CHECK(call)                                                          \
  do {                                                                               \
    int dpt_mpi_rc_ = (call);                                                        \
    if (dpt_mpi_rc_ != MPI_SUCCESS) {                                                \
      ::dpt::comm::detail::throw_mpi_error(dpt_mpi_rc_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)
