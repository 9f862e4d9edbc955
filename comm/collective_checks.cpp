// comm/collective_checks.cpp: argument checks shared by the backends, and the Avg division.
#include "comm/collective_checks.h"

#include <cstdint>

#include "core/check.h"

namespace dpt::comm::detail {

void check_host_tensor(const std::string& backend, const char* op, const Tensor& t) {
  DPT_CHECK(t.defined() || t.numel() == 0, "{} {}: tensor is undefined", backend, op);
  if (t.defined() && !t.device().is_cpu()) {
    DPT_THROW(UnsupportedError, "backend {} does not support {} on {} tensors (host memory only)", backend, op,
              t.device().str());
  }
}

void check_reduce_dtype(const std::string& backend, const char* op, const Tensor& t, ReduceOp reduce) {
  DType d = t.dtype();
  if (d == DType::BF16) {
    // The compressed gradient all-reduce: a sum, each addition in float32 rounded back to bfloat16 (as NCCL
    // does). The caller scales beforehand (the gradient codec divides by the world size before rounding).
    if (reduce != ReduceOp::Sum)
      DPT_THROW(UnsupportedError, "backend {} does not support {} with op {} on bfloat16 tensors (op sum only)",
                backend, op, reduce_op_name(reduce));
    return;
  }
  bool floating = d == DType::F32 || d == DType::F64;
  bool integer = d == DType::I32 || d == DType::I64;
  if (!floating && !integer) {
    DPT_THROW(UnsupportedError, "backend {} does not support {} on {} tensors (float32, float64, int32, int64)",
              backend, op, dtype_name(d));
  }
  if (reduce == ReduceOp::Avg && !floating) {
    DPT_THROW(UnsupportedError, "backend {} does not support {} with op avg on {} tensors (floating point only)",
              backend, op, dtype_name(d));
  }
}

void check_allgather_shapes(const std::string& backend, const Tensor& input, const Tensor& output, int rank,
                            int size) {
  DPT_CHECK(input.dtype() == output.dtype(), "{} allgather: input is {}, output is {}", backend,
            dtype_name(input.dtype()), dtype_name(output.dtype()));
  DPT_CHECK(output.numel() == input.numel() * static_cast<size_t>(size),
            "{} allgather: output has {} elements, expected {} (group size {} x input's {})", backend, output.numel(),
            input.numel() * static_cast<size_t>(size), size, input.numel());
  if (input.numel() == 0) return;
  // Addresses as integers (host or device memory: only compared). The backends copy the input into its slot, or
  // skip the copy when it is already there; an input across other slots would be overwritten while it is read.
  const auto in = reinterpret_cast<std::uintptr_t>(input.raw());
  const auto out = reinterpret_cast<std::uintptr_t>(output.raw());
  const bool overlap = in < out + output.bytes() && out < in + input.bytes();
  const std::uintptr_t slot = out + static_cast<size_t>(rank) * input.bytes();
  DPT_CHECK(!overlap || in == slot,
            "{} allgather on rank {}: the input starts at byte {} of the output, overlapping it, but this rank's slot "
            "starts at byte {}",
            backend, rank, static_cast<int64_t>(in - out), slot - out);
}

void check_reduce_scatter_shapes(const std::string& backend, const Tensor& input, const Tensor& output, int size) {
  DPT_CHECK(input.dtype() == output.dtype(), "{} reduce_scatter: input is {}, output is {}", backend,
            dtype_name(input.dtype()), dtype_name(output.dtype()));
  DPT_CHECK(input.numel() == output.numel() * static_cast<size_t>(size),
            "{} reduce_scatter: input has {} elements, expected {} (group size {} x output's {})", backend,
            input.numel(), output.numel() * static_cast<size_t>(size), size, output.numel());
}

void check_root(const std::string& backend, int root, int size) {
  DPT_CHECK(root >= 0 && root < size, "{} broadcast: root {} is out of range for a group of {}", backend, root,
            size);
}

void divide_in_place(Tensor& t, int n) {
  if (t.numel() == 0 || n == 1) return;
  if (t.dtype() == DType::F32) {
    float* p = t.data<float>();
    const float d = static_cast<float>(n);
    for (size_t i = 0; i < t.numel(); ++i) p[i] /= d;
  } else {
    DPT_CHECK(t.dtype() == DType::F64, "avg on {}", dtype_name(t.dtype()));
    double* p = t.data<double>();
    const double d = static_cast<double>(n);
    for (size_t i = 0; i < t.numel(); ++i) p[i] /= d;
  }
}

}  // namespace dpt::comm::detail
