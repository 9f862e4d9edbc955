// tests/unit/gpu/test_cuda_tensor.cpp: CUDA tensors and core/cuda: copies host <-> device <-> device with plain
// and pinned host memory, synchronous and on a stream; zero_ on a stream (of a view too); Tensor::to; an Event
// ordering two streams; storage from the device's memory pool (Storage::reserve / release with a stream: ZeRO's
// buckets), reused with no growth of the pool. Every comparison is of bytes, so it is exact.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "core/cuda.h"
#include "gpu_testing.h"
#include "models/kernels/factory.h"

using namespace dpt;
using namespace dpt::gpu_test;

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// A destination filled with 0xFF bytes, so that a copy which did not happen cannot pass for one that did.
Tensor host_dest(const Tensor& like, bool pinned) {
  Tensor t = pinned ? Tensor::empty_pinned(like.shape(), like.dtype()) : Tensor::empty(like.shape(), like.dtype());
  std::memset(t.raw(), 0xFF, t.bytes());
  return t;
}

}  // namespace

TEST_CASE("cuda tensor copies round-trip every byte: plain and pinned host memory, with and without a stream",
          "[gpu][tensor]") {
  const int64_t n = GENERATE(as<int64_t>{}, 0, 1, 7, (1 << 20) + 3);
  const DType dtype = GENERATE(DType::F32, DType::F64, DType::I32, DType::U8);
  CAPTURE(n, dtype_name(dtype));
  std::mt19937 rng(20);
  const Tensor src = random_bytes({n}, dtype, rng);

  SECTION("plain host memory, synchronous copies") {
    Tensor dev = Tensor::empty({n}, dtype, gpu());
    REQUIRE(dev.device() == gpu());
    dev.copy_from(src);
    Tensor back = host_dest(src, false);
    back.copy_from(dev);
    REQUIRE(same_bytes(back, src));
  }
  SECTION("pinned host memory, synchronous copies") {
    Tensor pinned = Tensor::empty_pinned({n}, dtype);
    REQUIRE(pinned.pinned());  // a device exists, so empty_pinned gives page-locked memory
    pinned.copy_from(src);     // host to host
    Tensor dev = Tensor::empty({n}, dtype, gpu());
    dev.copy_from(pinned);
    Tensor back = host_dest(src, true);
    back.copy_from(dev);
    REQUIRE(same_bytes(back, src));
  }
  SECTION("pinned host memory, asynchronous copies on a stream") {
    cuda::Stream stream;
    Tensor pinned = Tensor::empty_pinned({n}, dtype);
    pinned.copy_from(src);
    Tensor dev = Tensor::empty({n}, dtype, gpu());
    Tensor back = host_dest(src, true);
    dev.copy_from(pinned, stream.get());
    back.copy_from(dev, stream.get());
    stream.synchronize();  // both copies were only enqueued: wait before reading `back`
    REQUIRE(same_bytes(back, src));
  }
  SECTION("plain host memory on a stream, through a device-to-device copy") {
    cuda::Stream stream;
    Tensor dev = Tensor::empty({n}, dtype, gpu()), dev2 = Tensor::empty({n}, dtype, gpu());
    Tensor back = host_dest(src, false);
    dev.copy_from(src, stream.get());
    dev2.copy_from(dev, stream.get());
    back.copy_from(dev2, stream.get());
    stream.synchronize();
    REQUIRE(same_bytes(back, src));
  }
}

TEST_CASE("cuda zero_ on a stream zeroes exactly the tensor's elements, also of a view", "[gpu][tensor]") {
  const int64_t n = GENERATE(as<int64_t>{}, 1, 7, (1 << 20) + 3);
  CAPTURE(n);
  std::mt19937 rng(21);
  const int64_t offset = 3, total = n + 10;
  const Tensor src = random_floats({total}, rng, 1.0f, 2.0f);  // no zeros
  Tensor dev = to_device(src);
  cuda::Stream stream;

  SECTION("a view in the middle of a buffer") {
    Tensor view = dev.view(static_cast<size_t>(offset), {n});
    view.zero_(stream.get());
    Tensor back = host_dest(src, true);
    back.copy_from(dev, stream.get());
    stream.synchronize();
    size_t wrong = 0;
    for (int64_t i = 0; i < total; ++i) {
      const float want = i >= offset && i < offset + n ? 0.0f : src.data<float>()[i];
      wrong += back.data<float>()[i] != want;
    }
    REQUIRE(wrong == 0);
  }
  SECTION("a whole tensor, and Tensor::zeros on the device") {
    dev.zero_(stream.get());
    Tensor back = host_dest(src, true);
    back.copy_from(dev, stream.get());
    stream.synchronize();
    REQUIRE(named_diff("zero_ on a stream", compare(back, filled({total}, 0.0f))) == "");
    const Tensor zeros = to_host(Tensor::zeros({total}, DType::F32, gpu()));
    REQUIRE(named_diff("Tensor::zeros", compare(zeros, filled({total}, 0.0f))) == "");
  }
}

TEST_CASE("Tensor::to moves between host and cuda, waits for queued kernels, and is the identity in place",
          "[gpu][tensor]") {
  std::mt19937 rng(22);
  const Tensor src = random_floats({5, 129}, rng);
  Tensor dev = src.to(gpu());
  REQUIRE(dev.device() == gpu());
  REQUIRE(dev.shape() == src.shape());
  REQUIRE(dev.dtype() == DType::F32);
  REQUIRE(dev.raw() != src.raw());
  REQUIRE(same_bytes(dev.to(Device::cpu()), src));
  // Already there: the same tensor, no copy.
  REQUIRE(dev.to(gpu()).raw() == dev.raw());
  REQUIRE(src.to(Device::cpu()).raw() == src.raw());
  // to() with no stream waits for the kernels already queued on the kernel set's stream.
  models::kernels_for(gpu()).scale(dev.data<float>(), dev.numel(), 2.0f);
  const Tensor doubled = dev.to(Device::cpu());
  size_t wrong = 0;
  for (size_t i = 0; i < src.numel(); ++i) wrong += doubled.data<float>()[i] != 2.0f * src.data<float>()[i];
  REQUIRE(wrong == 0);
}

// Stream `a` zeroes a large buffer; stream `b` waits on an Event recorded after it (no host wait) and copies the
// buffer back. Without the wait, the copy could overtake the memset and see the ones.
TEST_CASE("cuda Event orders work across streams without a host synchronisation", "[gpu][tensor]") {
  const int64_t n = int64_t{1} << 24;  // 64 MiB
  Tensor dev = to_device(filled({n}, 1.0f));
  cuda::Stream a, b;
  cuda::Event done;
  dev.zero_(a.get());
  done.record(a.get());
  done.block(b.get());
  Tensor back = Tensor::empty_pinned({n});
  back.copy_from(dev, b.get());
  b.synchronize();
  REQUIRE(done.query());  // what b waited for has completed
  REQUIRE(named_diff("zero_ across streams", compare(back, filled({n}, 0.0f))) == "");
}

TEST_CASE("Storage from the memory pool: stream-ordered, reused without growing, freed the way it came",
          "[gpu][tensor][pool]") {
  cuda::set_device(gpu().index);
  cuda::Stream stream;
  std::mt19937 rng(5);
  const Tensor data = random_bytes({1 << 20}, DType::U8, rng);  // 1 MiB
  Tensor dev = Tensor::empty({1 << 20}, DType::U8, gpu());  // cudaMalloc's
  Storage& s = dev.storage();
  REQUIRE_FALSE(s.pooled());
  s.release(stream.get());  // cudaMalloc'd bytes go back with cudaFree, whatever the stream
  REQUIRE_FALSE(s.resident());
  size_t reserved_after_first = 0;
  for (int i = 0; i < 50; ++i) {
    s.reserve(stream.get());
    REQUIRE(s.pooled());
    dev.copy_from(data, stream.get());  // on the stream the bytes were reserved on
    Tensor back = Tensor::empty({1 << 20}, DType::U8);
    back.copy_from(dev, stream.get());
    stream.synchronize();
    REQUIRE(same_bytes(back, data));
    s.release(stream.get());
    if (i == 0) reserved_after_first = cuda::pool_info().reserved;
  }
  stream.synchronize();
  const cuda::PoolInfo info = cuda::pool_info();
  INFO("pool reserved " << info.reserved << " after the first round " << reserved_after_first << ", used " << info.used);
  CHECK(reserved_after_first >= (size_t{1} << 20));
  CHECK(info.reserved == reserved_after_first);  // the same bytes again: nothing new from the device
  // Pooled bytes a storage still holds when it is destroyed go back to the pool too.
  {
    Tensor held = Tensor::empty({4096}, DType::U8, gpu());
    held.storage().release();
    held.storage().reserve(stream.get());
    REQUIRE(held.storage().pooled());
  }
  stream.synchronize();
  CHECK(cuda::pool_info().used <= info.used);
}
