// tests/unit/gpu/gpu_testing.h: what the [gpu] tests share: the device under test, random host tensors from a
// fixed-seed std::mt19937, explicit synchronous copies between host and device, NaN-poisoned output buffers,
// and a comparison that says where two float arrays differ.
//
// Synchronisation: every CUDA kernel runs asynchronously on its kernel set's stream. to_host() copies with no
// stream, which synchronises the whole device before the copy (core/cuda.cpp: cuda::memcpy), so the kernels
// queued before it have finished when it returns. The tests read device results only through to_host().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <limits>

#include "core/tensor.h"
#include "models/kernels/factory.h"
#include "models/kernels/kernel_params.h"

namespace dpt::gpu_test {

// The device the [gpu] tests run on.
Device gpu();
// The two kernel sets compared: the CPU's (the reference) and the GPU's.
inline models::Kernels& cpu_kernels() { return models::kernels_for(Device::cpu()); }
inline models::Kernels& gpu_kernels() { return models::kernels_for(gpu()); }
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A host F32 tensor of uniform draws in [lo, hi).
Tensor random_floats(std::vector<int64_t> shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f);
// A host F32 tensor of multiples of 1/16 in [-1, 1]: sums of up to 2^20 of them (and of their squares, multiples
// of 1/256) are exact in float and double, so every summation order gives the same bits.
inline Tensor sixteenths(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(std::move(shape));
  std::uniform_int_distribution<int> dist(-16, 16);
  for (size_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(dist(rng)) / 16.0f;
  return t;
}
// A host F32 tensor with every element `value`.
Tensor filled(std::vector<int64_t> shape, float value);
// A host tensor of `dtype` whose bytes are random (for copies, where only the bytes matter).
Tensor random_bytes(std::vector<int64_t> shape, DType dtype, std::mt19937& rng);

// A new tensor on `device` holding a copy of `t`; synchronous (complete when it returns). Unlike
// Tensor::to, it always copies, even when `t` is already on `device`.
Tensor copy_to(const Tensor& t, Device device);
inline Tensor to_device(const Tensor& host) { return copy_to(host, gpu()); }
inline Tensor to_host(const Tensor& t) { return copy_to(t, Device::cpu()); }
// An F32 device tensor whose every element is NaN: an element a kernel should have written but did not stays
// NaN, and fails any comparison.
Tensor nan_on_device(std::vector<int64_t> shape);

// How `got` differs from `want` (n elements each). Element i is bad unless |got - want| <= abs + rel * s_i, where
// s_i is scale[i] when given (the magnitude the error of a sum scales with: the sum of its terms' absolute
// values), else |want[i]|. NaN in `got` is always bad.
struct Diff {
  size_t n = 0;
  size_t bad = 0;          // elements outside the tolerance given to compare()
  size_t first_bad = 0;    // index of the first one
  float got_first_bad = 0, want_first_bad = 0;
  size_t nonfinite = 0;    // NaN or infinite elements of `got`
  double max_abs = 0;      // largest finite |got - want|
  double max_ratio = 0;    // largest finite |got - want| / allowed: how close to the tolerance (bad above 1)
  size_t worst = 0;        // the index where that ratio is reached
  double rel_l2 = 0;       // ||got - want|| / ||want|| (||got - want|| when want is all zeros); NaN if got has one
};
Diff compare(const float* got, const float* want, size_t n, double abs = 0.0, double rel = 0.0,
             const double* scale = nullptr);
inline Diff compare(const Tensor& got, const Tensor& want, double abs = 0.0, double rel = 0.0) {
  DPT_CHECK(got.device().is_cpu() && want.device().is_cpu(), "compare host tensors");
  DPT_CHECK_EQ(got.numel(), want.numel());
  return compare(got.data<float>(), want.data<float>(), got.numel(), abs, rel);
}
std::ostream& operator<<(std::ostream& os, const Diff& d);

// Bitwise equality with a message that says where it fails: "" when the `bytes` at got and want are the same, else
// `name`, how many of the elements (dtype's: F32, F64, BF16, I32, I64, U8) differ, the first such index and, for the
// floating types, the index of the largest |got - want| (a NaN on either side counts as largest), each with both
// values. Use as CHECK(bits_differ("dgamma", got, want) == ""): Catch prints the message on failure.
std::string bits_differ(std::string_view name, const void* got, const void* want, size_t bytes, DType dtype);
inline std::string bits_differ(std::string_view name, const Tensor& got, const Tensor& want) {
  DPT_CHECK(got.device().is_cpu() && want.device().is_cpu(), "bits_differ: host tensors");
  DPT_CHECK(got.dtype() == want.dtype() && got.bytes() == want.bytes(), "bits_differ: {} of the same dtype and size",
            name);
  return bits_differ(name, got.raw(), want.raw(), got.bytes(), got.dtype());
}
// A Diff with its tensor's name, for CHECK(named_diff("dx", d) == ""): "" when d has no bad element, else `name: d`.
std::string named_diff(std::string_view name, const Diff& d);

// |got - want| / |want| for doubles, |got - want| when want is 0.
double rel_err(double got, double want);

// ---- bf16 tensors (the transformer fast path's activations) ----
inline constexpr uint16_t kBf16NaN = 0x7FC0;
inline constexpr double kBf16Step = 0x1p-7;  // bf16's relative step: one rounding is within half of it

inline Tensor bf16_random(std::vector<int64_t> shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::BF16);
  std::uniform_real_distribution<float> u(lo, hi);
  for (size_t i = 0; i < t.numel(); ++i) t.data<BFloat16>()[i] = to_bfloat16(u(rng));
  return t;
}

inline Tensor bf16_nan(std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::BF16);
  for (size_t i = 0; i < t.numel(); ++i) t.data<BFloat16>()[i] = BFloat16{kBf16NaN};
  return t;
}

// A host bf16 tensor's values one element into a device buffer of numel + 1 (its first element NaN): pass
// `.data<BFloat16>() + 1`, rows 2-byte aligned and never 16, to reach the kernels' unaligned paths. shifted_back:
// such a buffer's values after its first element, on the host, in `shape`.
inline Tensor shifted_on_device(const Tensor& host) {
  Tensor t = bf16_nan({static_cast<int64_t>(host.numel()) + 1});
  std::memcpy(t.data<BFloat16>() + 1, host.raw(), host.bytes());
  return to_device(t);
}
inline Tensor shifted_back(const Tensor& device, std::vector<int64_t> shape) {
  const Tensor h = to_host(device);
  Tensor out = bf16_nan(std::move(shape));
  std::memcpy(out.raw(), h.data<BFloat16>() + 1, out.bytes());
  return out;
}

// A host bf16 tensor widened to float32 (exact).
inline Tensor widened(const Tensor& t) {
  DPT_CHECK(t.dtype() == DType::BF16, "widened: a bf16 tensor");
  Tensor out = Tensor::empty(t.shape());
  for (size_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = to_float(t.data<BFloat16>()[i]);
  return out;
}

// The device bf16 tensor `got` against the host bf16 `want`, as floats.
inline Diff compare_bf16(const Tensor& got_device, const Tensor& want, double abs, double rel) {
  return compare(widened(to_host(got_device)), widened(want), abs, rel);
}

// ---- low precision ------------------------------------------------------------------------------------------

// Sets the CPU and the GPU kernel sets to `p` while it lives, then both back to F32 (also when a REQUIRE throws),
// so a low-precision test leaves the shared kernel sets as every other test expects them.
class ScopedPrecision {
 public:
  explicit ScopedPrecision(models::Precision p);
  ~ScopedPrecision();
  ScopedPrecision(const ScopedPrecision&) = delete;
  ScopedPrecision& operator=(const ScopedPrecision&) = delete;
};
// "fp32", "bf16", "fp16" (for CAPTURE).
const char* precision_name(models::Precision p);
// The unit roundoff of p's type: the largest relative error of a rounding to nearest (2^-8 bf16, 2^-11 fp16,
// 2^-24 fp32).
double unit_roundoff(models::Precision p);

}  // namespace dpt::gpu_test
