// tests/unit/core/test_memory.cpp: the tensor memory counters behind the memory report (every Storage counted on
// its device while it lives, the peak kept until reset), the host figures, and byte formatting.
#include <catch2/catch.hpp>

#include <cstdint>

#include <thread>

#include "core/memory.h"
#include "core/tensor.h"

using namespace dpt;

TEST_CASE("tensor_memory counts every live tensor's bytes and keeps the peak", "[core][memory]") {
  const Device cpu = Device::cpu();
  const size_t base = tensor_memory(cpu).current;
  reset_peak_tensor_memory(cpu);
  REQUIRE(tensor_memory(cpu).peak == base);
  {
    Tensor a = Tensor::empty({1000}, DType::F32);     // 4000 B
    Tensor b = Tensor::zeros({10, 10}, DType::F64);   // 800 B
    Tensor v = a.view(10, {100});                      // a view holds no memory of its own
    REQUIRE(tensor_memory(cpu).current == base + 4800);
    Tensor c = a;  // shares a's storage
    REQUIRE(tensor_memory(cpu).current == base + 4800);
  }
  REQUIRE(tensor_memory(cpu).current == base);
  REQUIRE(tensor_memory(cpu).peak == base + 4800);
  {
    Tensor small = Tensor::empty({10}, DType::U8);
    REQUIRE(tensor_memory(cpu).peak == base + 4800);  // below the peak: unchanged
  }
  reset_peak_tensor_memory(cpu);
  REQUIRE(tensor_memory(cpu).peak == base);
}

TEST_CASE("host_memory reads the resident set and its peak", "[core][memory]") {
  const HostMemory m = host_memory();
  REQUIRE(m.rss > 0);
  REQUIRE(m.peak_rss >= m.rss);
}

TEST_CASE("format_bytes", "[core][memory]") {
  REQUIRE(format_bytes(0) == "0 B");
  REQUIRE(format_bytes(1023) == "1023 B");
  REQUIRE(format_bytes(1536) == "1.50 KiB");
  REQUIRE(format_bytes(2678824) == "2.55 MiB");
  REQUIRE(format_bytes(size_t{80} << 30) == "80.0 GiB");
  REQUIRE(format_bytes(size_t{300} << 30) == "300 GiB");
}

TEST_CASE("thread_allocations counts this thread's allocations only, and their peak", "[core][memory]") {
  const Device cpu = Device::cpu();
  Tensor elsewhere;
  reset_thread_allocations(cpu);
  std::thread([&] { elsewhere = Tensor::empty({250}, DType::F32); }).join();  // another thread's 1000 B
  REQUIRE(thread_allocations().net == 0);
  REQUIRE(thread_allocations().allocations == 0);
  {
    Tensor a = Tensor::empty({100}, DType::F64);  // 800 B
    Tensor b = Tensor::empty({50}, DType::F32);   // 200 B
    REQUIRE(thread_allocations().net == 1000);
  }
  REQUIRE(thread_allocations().net == 0);
  REQUIRE(thread_allocations().peak == 1000);
  CHECK(thread_allocations().allocations == 2);
  CHECK(thread_allocations().releases == 2);
  elsewhere = Tensor();  // released here: net goes below zero, the peak stays
  REQUIRE(thread_allocations().net == -1000);
  REQUIRE(thread_allocations().peak == 1000);
  CHECK(thread_allocations().releases == 3);
  // A buffer given back and made again at its size nets nothing, and never passes the peak: the counts show it.
  reset_thread_allocations(cpu);
  Tensor again = Tensor::empty({64});
  reset_thread_allocations(cpu);
  again = Tensor();
  again = Tensor::empty({64});
  CHECK(thread_allocations().net == 0);
  CHECK(thread_allocations().peak == 0);
  CHECK(thread_allocations().allocations == 1);
  CHECK(thread_allocations().releases == 1);
  stop_thread_allocations();
  Tensor after = Tensor::empty({10});
  REQUIRE(thread_allocations().net == 0);
  REQUIRE(thread_allocations().peak == 0);
}

TEST_CASE("Storage release and reserve: the bytes go and come back, views stay valid handles", "[core][memory]") {
  const Device cpu = Device::cpu();
  const size_t base = tensor_memory(cpu).current;
  Tensor flat = Tensor::zeros({1000});  // 4000 B
  Tensor view = flat.view(10, {100});
  REQUIRE(flat.storage().resident());
  REQUIRE(tensor_memory(cpu).current == base + 4000);
  flat.storage().release();
  REQUIRE_FALSE(view.storage().resident());  // the same storage
  REQUIRE(view.raw() == nullptr);
  REQUIRE(tensor_memory(cpu).current == base);
  flat.storage().release();  // twice: nothing more
  REQUIRE(tensor_memory(cpu).current == base);
  view.storage().reserve();
  REQUIRE(flat.storage().resident());
  REQUIRE(tensor_memory(cpu).current == base + 4000);
  REQUIRE(static_cast<float*>(view.raw()) == flat.data<float>() + 10);  // the view's offset kept
  view.data<float>()[0] = 3.0f;
  REQUIRE(flat.data<float>()[10] == 3.0f);
  flat.storage().reserve();  // already resident: nothing more
  REQUIRE(tensor_memory(cpu).current == base + 4000);
  flat.storage().release();
  // Destroying a released storage releases nothing twice.
  flat = Tensor();
  view = Tensor();
  REQUIRE(tensor_memory(cpu).current == base);
}

TEST_CASE("Storage release and reserve with a stream: the same bookkeeping, host memory never pooled", "[core][memory]") {
  // On a GPU a stream makes them stream-ordered through the device's pool (tests/unit/gpu/test_cuda_tensor.cpp); the
  // counts of tensor_memory and of this thread's allocations are the same either way, and host storage ignores it.
  const Device cpu = Device::cpu();
  const size_t base = tensor_memory(cpu).current;
  auto* fake_stream = reinterpret_cast<StreamHandle>(uintptr_t{0x1000});  // never dereferenced on the CPU
  Tensor flat = Tensor::zeros({500});  // 2000 B
  flat.storage().release(fake_stream);
  REQUIRE(tensor_memory(cpu).current == base);
  flat.storage().reserve(fake_stream);
  REQUIRE(flat.storage().resident());
  REQUIRE_FALSE(flat.storage().pooled());
  REQUIRE(tensor_memory(cpu).current == base + 2000);
  flat.data<float>()[499] = 1.5f;
  REQUIRE(flat.data<float>()[499] == 1.5f);
  flat.storage().release(fake_stream);
  flat.storage().release();  // released already: nothing
  REQUIRE(tensor_memory(cpu).current == base);
}

TEST_CASE("ThreadAllocationsPaused: what the scope allocates or releases is not this thread's", "[core][memory]") {
  reset_thread_allocations(Device::cpu());
  Tensor a = Tensor::empty({100});  // 400 B counted
  Tensor b;
  {
    const ThreadAllocationsPaused paused;
    b = Tensor::empty({1000});  // not counted
    a.storage().release();      // not counted either
  }
  CHECK(thread_allocations().net == 400);
  CHECK(thread_allocations().peak == 400);
  a.storage().reserve();  // counted again
  CHECK(thread_allocations().net == 800);
  stop_thread_allocations();
}
