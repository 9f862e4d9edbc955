// comm/collective_checks.h: argument checks every backend applies before a collective (host tensors, dtypes,
// sizes, roots), so that all backends reject the same mistakes with the same words. Internal to comm/.
#pragma once

#include <string>

#include "comm/process_group.h"

namespace dpt::comm::detail {

// The tensor lives in host memory (CPU backends); UnsupportedError otherwise.
void check_host_tensor(const std::string& backend, const char* op, const Tensor& t);
// F32, F64, I32 or I64; Avg only for F32/F64; BF16 with Sum only (UnsupportedError naming the dtype otherwise).
void check_reduce_dtype(const std::string& backend, const char* op, const Tensor& t, ReduceOp reduce);
// output has size * input.numel() elements of input's dtype, and input either lies outside output or is rank's
// slot of it (the in-place form); InternalError otherwise: a caller bug.
void check_allgather_shapes(const std::string& backend, const Tensor& input, const Tensor& output, int rank,
                            int size);
// input has size * output.numel() elements of output's dtype (InternalError naming both counts otherwise).
void check_reduce_scatter_shapes(const std::string& backend, const Tensor& input, const Tensor& output, int size);
void check_root(const std::string& backend, int root, int size);
// Avg after Sum: divides every element of a float tensor by n.
void divide_in_place(Tensor& t, int n);

}  // namespace dpt::comm::detail
