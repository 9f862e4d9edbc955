// tests/unit/gpu/gpu_testing.cpp: the [gpu] tests' shared helpers (see gpu_testing.h).
#include "gpu_testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "models/kernels/factory.h"

namespace dpt::gpu_test {

Device gpu() { return Device::cuda(0); }

Tensor random_floats(std::vector<int64_t> shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(std::move(shape));
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (size_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor filled(std::vector<int64_t> shape, float value) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  for (size_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor random_bytes(std::vector<int64_t> shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::uniform_int_distribution<int> dist(0, 255);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.bytes(); ++i) p[i] = static_cast<unsigned char>(dist(rng));
  return t;
}

Tensor copy_to(const Tensor& t, Device device) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), device);
  out.copy_from(t);  // no stream: synchronous, after everything already queued on the device
  return out;
}

Tensor nan_on_device(std::vector<int64_t> shape) {
  return to_device(filled(std::move(shape), std::numeric_limits<float>::quiet_NaN()));
}

Diff compare(const float* got, const float* want, size_t n, double abs, double rel, const double* scale) {
  Diff d;
  d.n = n;
  double diff2 = 0.0, want2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    const double e = std::abs(g - w);
    if (!std::isfinite(g)) ++d.nonfinite;
    const double allowed = abs + rel * (scale ? scale[i] : std::abs(w));
    if (std::isfinite(e) && e > 0.0) {
      const double ratio = allowed > 0.0 ? e / allowed : std::numeric_limits<double>::infinity();
      if (ratio > d.max_ratio) {
        d.max_ratio = ratio;
        d.worst = i;
      }
    }
    if (!(e <= allowed)) {  // negated, so that NaN counts as bad
      if (d.bad++ == 0) {
        d.first_bad = i;
        d.got_first_bad = got[i];
        d.want_first_bad = want[i];
      }
    }
    if (std::isfinite(e) && e > d.max_abs) d.max_abs = e;
    diff2 += (g - w) * (g - w);
    want2 += w * w;
  }
  d.rel_l2 = want2 > 0.0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  return d;
}

std::ostream& operator<<(std::ostream& os, const Diff& d) {
  // fmt prints the shortest representation that reads back exactly: a one-ulp difference stays visible.
  os << fmt::format("n {}, bad {}", d.n, d.bad);
  if (d.bad) os << fmt::format(" (first at {}: got {}, want {})", d.first_bad, d.got_first_bad, d.want_first_bad);
  return os << fmt::format(", non-finite {}, max |diff| {} (worst: index {} at {:.3g} of the tolerance), relative L2 {}",
                           d.nonfinite, d.max_abs, d.worst, d.max_ratio, d.rel_l2);
}

namespace {
// Element i of an array of T at p (any alignment).
template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

// Element i of a buffer of `dtype` as a double (U8/I32/I64 exactly as integers).
double element(const void* p, size_t i, DType dtype) {
  switch (dtype) {
    case DType::F32: return load<float>(p, i);
    case DType::F64: return load<double>(p, i);
    case DType::BF16: return to_float(load<BFloat16>(p, i));
    case DType::I32: return load<int32_t>(p, i);
    case DType::I64: return static_cast<double>(load<int64_t>(p, i));
    case DType::U8: return static_cast<const unsigned char*>(p)[i];
  }
  return 0.0;
}
}  // namespace

std::string bits_differ(std::string_view name, const void* got, const void* want, size_t bytes, DType dtype) {
  if (std::memcmp(got, want, bytes) == 0) return "";
  const size_t size = dtype_size(dtype), n = bytes / size;
  const bool floating = dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16;
  size_t differ = 0, first = 0, worst = 0;
  double worst_err = -1.0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * size, static_cast<const char*>(want) + i * size, size) == 0)
      continue;
    if (differ++ == 0) first = i;
    const double g = element(got, i, dtype), w = element(want, i, dtype);
    const double e = std::isnan(g - w) ? std::numeric_limits<double>::infinity() : std::abs(g - w);
    if (e > worst_err) {
      worst_err = e;
      worst = i;
    }
  }
  std::string out = fmt::format("{}: {} of {} {} elements differ in their bits; first at index {}: got {}, want {}",
                                name, differ, n, dtype_name(dtype), first, element(got, first, dtype),
                                element(want, first, dtype));
  if (floating)
    out += fmt::format("; worst at index {}: got {}, want {} (|diff| {})", worst, element(got, worst, dtype),
                       element(want, worst, dtype), worst_err);
  return out;
}

std::string named_diff(std::string_view name, const Diff& d) {
  if (d.bad == 0) return "";
  std::ostringstream os;
  os << name << ": " << d;
  return os.str();
}

double rel_err(double got, double want) {
  const double e = std::abs(got - want);
  return want != 0.0 ? e / std::abs(want) : e;
}

ScopedPrecision::ScopedPrecision(models::Precision p) {
  models::kernels_for(Device::cpu()).set_precision(p);
  try {
    models::kernels_for(gpu()).set_precision(p);
  } catch (...) {
    models::kernels_for(Device::cpu()).set_precision(models::Precision::F32);
    throw;
  }
}

ScopedPrecision::~ScopedPrecision() {
  models::kernels_for(Device::cpu()).set_precision(models::Precision::F32);
  try {
    models::kernels_for(gpu()).set_precision(models::Precision::F32);
  } catch (...) {  // a destructor must not throw; the next test that cares finds the set in the wrong precision
  }
}

const char* precision_name(models::Precision p) {
  return p == models::Precision::BF16 ? "bf16" : p == models::Precision::F16 ? "fp16" : "fp32";
}

double unit_roundoff(models::Precision p) {
  return p == models::Precision::BF16 ? 0x1p-8 : p == models::Precision::F16 ? 0x1p-11 : 0x1p-24;
}

}  // namespace dpt::gpu_test
