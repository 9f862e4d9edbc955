// tests/unit/gpu/test_cuda_bf16.cpp: the bfloat16 side of dist.grad_dtype = bf16 on a GPU: the CUDA
// float32 <-> bfloat16 conversion kernels give the CPU loops' bits (they share core/bfloat16.h's rounding),
// on a stream and without one; NCCL all-reduces bfloat16 device tensors with Sum (one rank: the identity)
// and refuses Avg; Gloo with two ranks sharing the GPU stages bfloat16 device tensors and sums them.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <future>
#include <iterator>
#include <thread>

#include "comm/gloo_backend.h"
#include "comm/nccl_backend.h"
#include "comm/staging.h"
#include "comm/tcp_store.h"
#include "core/bfloat16_convert.h"
#include "core/check.h"
#include "core/cuda.h"
#include "gloo_threads.h"
#include "gpu_testing.h"

using namespace dpt;
using namespace dpt::comm;
using namespace dpt::gpu_test;
using namespace std::chrono_literals;

namespace {

// Random floats over many binades, with the special values in front.
Tensor awkward_floats(size_t n, std::mt19937& rng) {
  Tensor t = random_floats({static_cast<int64_t>(n)}, rng, -1.0f, 1.0f);
  float* p = t.data<float>();
  for (size_t i = 0; i < n; ++i) p[i] = std::ldexp(p[i], static_cast<int>(i % 41) - 20);
  const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, FLT_MAX, 1e-40f};
  for (size_t i = 0; i < std::size(specials) && i < n; ++i) p[i] = specials[i];
  return t;
}

Tensor bf16_host(size_t n, float value) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)}, DType::BF16);
  for (size_t i = 0; i < n; ++i) t.data<BFloat16>()[i] = to_bfloat16(value);
  return t;
}

}  // namespace

TEST_CASE("cuda to_bfloat16 and from_bfloat16 give the CPU loops' bits", "[gpu][bf16]") {
  std::mt19937 rng(11);
  cuda::Stream stream;
  for (size_t n : {size_t{1}, size_t{7}, size_t{1001}, size_t{1} << 20}) {
    INFO("n = " << n);
    const Tensor x = awkward_floats(n, rng);
    for (float divisor : {1.0f, 3.0f}) {
      Tensor want = Tensor::empty({static_cast<int64_t>(n)}, DType::BF16);
      to_bfloat16(x, want, divisor);
      for (StreamHandle s : {static_cast<StreamHandle>(nullptr), stream.get()}) {
        const Tensor dx = to_device(x);
        Tensor db = Tensor::zeros({static_cast<int64_t>(n)}, DType::BF16, gpu());
        to_bfloat16(dx, db, divisor, s);
        Tensor back = nan_on_device({static_cast<int64_t>(n)});
        from_bfloat16(db, back, s);
        if (s) stream.synchronize();
        const Tensor got = to_host(db);
        const Tensor wide = to_host(back);
        size_t bad = 0, first_bad = n;
        for (size_t i = 0; i < n; ++i) {
          const BFloat16 w = want.data<BFloat16>()[i];
          const bool nan = std::isnan(to_float(w));
          const size_t before = bad;
          bad += nan ? !std::isnan(to_float(got.data<BFloat16>()[i])) : got.data<BFloat16>()[i].bits != w.bits;
          bad += nan ? !std::isnan(wide.data<float>()[i]) : wide.data<float>()[i] != to_float(w);
          if (bad != before && first_bad == n) first_bad = i;
        }
        INFO("to_bfloat16 and back: first bad at index "
             << first_bad << ": bf16 " << (first_bad < n ? to_float(got.data<BFloat16>()[first_bad]) : 0) << " widened "
             << (first_bad < n ? wide.data<float>()[first_bad] : 0) << ", want "
             << (first_bad < n ? to_float(want.data<BFloat16>()[first_bad]) : 0));
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("nccl, one rank: bfloat16 sum on device tensors, avg refused", "[gpu][nccl][bf16]") {
  NcclProcessGroup pg(0, 1, gpu().index, nccl_unique_id(), NcclOptions{.timeout = 60s});
  const Tensor host = bf16_host(1001, 1.0f + 0x1p-7f);
  Tensor d = to_device(host);
  pg.allreduce(d, {.op = ReduceOp::Sum})->wait();
  const Tensor back = to_host(d);
  CHECK(bits_differ("allreduce sum, bf16", back, host) == "");
  CHECK_THROWS_AS(pg.allreduce(d, {.op = ReduceOp::Avg}), UnsupportedError);
}

TEST_CASE("gloo with two ranks sharing the GPU: bfloat16 device tensors staged and summed", "[gpu][gloo][bf16]") {
  run_gloo_ranks_on_gpu(2, [](int r, ProcessGroup& pg) {
    cuda::Stream stream;
    for (size_t n : {size_t{1}, size_t{100003}}) {
      // Each rank: fp32 (1 + 3 2^-8) * 2 / 2 = 1 + 3 2^-8 rounded to bfloat16 (ties to even: 1 + 2^-6), so
      // the sum is 2 + 2^-5, exact: the whole path (divide, round, stage, sum, widen) in one number.
      Tensor f = to_device(filled({static_cast<int64_t>(n)}, 2.0f + 3 * 0x1p-7f));
      Tensor w = Tensor::empty({static_cast<int64_t>(n)}, DType::BF16, gpu());
      to_bfloat16(f, w, 2.0f, stream.get());
      pg.allreduce(w, {.op = ReduceOp::Sum, .stream = stream.get()})->block(stream.get());
      from_bfloat16(w, f, stream.get());
      stream.synchronize();
      const Tensor back = to_host(f);
      for (size_t i = 0; i < n; ++i)
        if (back.data<float>()[i] != 2.0f + 0x1p-5f)
          throw std::runtime_error(fmt::format("n {} element {}: {}", n, i, back.data<float>()[i]));
    }
  });
}
