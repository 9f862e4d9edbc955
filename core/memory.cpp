// core/memory.cpp: the tensor memory counters and the host figures (core/memory.h).
#include "core/memory.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>

#include "core/check.h"

namespace dpt {
namespace {

constexpr int kMaxDevices = 64;  // CUDA devices counted (slot 0 is the host)

struct Counter {
  std::atomic<size_t> current{0}, peak{0};
};
std::array<Counter, kMaxDevices + 1>& counters() {
  static std::array<Counter, kMaxDevices + 1> c;
  return c;
}
int slot_of(Device device) { return device.is_cpu() ? 0 : 1 + device.index; }
Counter& counter(Device device) {
  const int slot = slot_of(device);
  DPT_CHECK(slot >= 0 && slot <= kMaxDevices, "device {}", device.str());
  return counters()[static_cast<size_t>(slot)];
}

size_t debug_limit() {
  static const size_t limit = [] {
    const char* s = std::getenv("DPT_DEBUG_MEMORY_LIMIT");
    return s ? static_cast<size_t>(std::strtoull(s, nullptr, 10)) : size_t{0};
  }();
  return limit;
}

struct ThreadCounter {
  int slot = -1;  // the device watched; -1: none
  int64_t net = 0, peak = 0, allocations = 0, releases = 0;
};
thread_local ThreadCounter thread_counter;

}  // namespace

void reset_thread_allocations(Device device) { thread_counter = {slot_of(device), 0, 0, 0, 0}; }

void stop_thread_allocations() { thread_counter = {}; }

ThreadAllocations thread_allocations() {
  return {thread_counter.net, thread_counter.peak, thread_counter.allocations, thread_counter.releases};
}

ThreadAllocationsPaused::ThreadAllocationsPaused() : slot_(thread_counter.slot) { thread_counter.slot = -1; }
ThreadAllocationsPaused::~ThreadAllocationsPaused() { thread_counter.slot = slot_; }

TensorMemory tensor_memory(Device device) {
  const Counter& c = counter(device);
  return {c.current.load(), c.peak.load()};
}

void reset_peak_tensor_memory(Device device) {
  Counter& c = counter(device);
  c.peak.store(c.current.load());
}

void note_allocation(Device device, size_t bytes) {
  Counter& c = counter(device);
  if (const size_t limit = debug_limit(); limit > 0 && c.current.load() + bytes > limit)
    DPT_THROW(OutOfMemoryError, "out of memory on {}: cannot allocate {} ({} held by tensors; DPT_DEBUG_MEMORY_LIMIT={})",
              device.str(), format_bytes(bytes), format_bytes(c.current.load()), limit);
  if (thread_counter.slot == slot_of(device)) {
    thread_counter.net += static_cast<int64_t>(bytes);
    thread_counter.peak = std::max(thread_counter.peak, thread_counter.net);
    ++thread_counter.allocations;
  }
  const size_t now = c.current.fetch_add(bytes) + bytes;
  size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void note_release(Device device, size_t bytes) {
  if (thread_counter.slot == slot_of(device)) {
    thread_counter.net -= static_cast<int64_t>(bytes);
    ++thread_counter.releases;
  }
  counter(device).current.fetch_sub(bytes);
}

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    size_t kb = 0;
    if (key == "VmRSS:" && in >> kb) m.rss = kb * 1024;
    else if (key == "VmHWM:" && in >> kb) m.peak_rss = kb * 1024;
    in.ignore(1 << 20, '\n');
  }
  return m;
}

std::string format_bytes(size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : v < 100 ? 1 : 0, units[u]);
}

}  // namespace dpt
