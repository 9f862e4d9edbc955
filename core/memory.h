// core/memory.h: what dptrain's tensors hold, per device, and what the process holds on the host: the figures of
// the memory report (torch.cuda.memory_allocated / max_memory_allocated, and the RSS a job scheduler sees).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace dpt {

// Bytes held by live Storage (every Tensor's memory) on `device`: the host (pageable and pinned) for a CPU
// device, the GPU's own for a CUDA one. `peak` is the most held at once since the start or the last reset.
struct TensorMemory {
  size_t current = 0, peak = 0;
};
TensorMemory tensor_memory(Device device);
// Starts a new peak from the current figure (the peak of one step, one epoch).
void reset_peak_tensor_memory(Device device);

// What this thread allocated on `device` since reset_thread_allocations(device): net bytes (allocated minus
// released by this thread; negative when it frees what other threads allocated) and their peak. The first
// training step's activations are its peak: the loader's threads, allocating batches meanwhile, do not count.
struct ThreadAllocations {
  int64_t net = 0, peak = 0;
  int64_t allocations = 0, releases = 0;  // how many of each (a buffer freed and made again at its size nets 0)
};
void reset_thread_allocations(Device device);
void stop_thread_allocations();  // stops counting (the figures return to 0)
ThreadAllocations thread_allocations();
// Inside its scope this thread's allocations and releases do not count toward thread_allocations(): memory reported
// elsewhere (ZeRO stage 2's gradient buckets, reserved by this thread and released by the communication thread, are
// gradients, not activations). The device figures (tensor_memory) count them as ever.
class ThreadAllocationsPaused {
 public:
  ThreadAllocationsPaused();
  ~ThreadAllocationsPaused();
  ThreadAllocationsPaused(const ThreadAllocationsPaused&) = delete;
  ThreadAllocationsPaused& operator=(const ThreadAllocationsPaused&) = delete;

 private:
  int slot_;
};

// Called by Storage: `bytes` allocated on / released from `device`. An allocation that would take `device`
// past DPT_DEBUG_MEMORY_LIMIT bytes (fault injection for tests, on any device) throws OutOfMemoryError as a
// real failure would.
void note_allocation(Device device, size_t bytes);
void note_release(Device device, size_t bytes);

// The process's resident set and its peak (VmRSS and VmHWM of /proc/self/status), in bytes; 0 when unknown.
struct HostMemory {
  size_t rss = 0, peak_rss = 0;
};
HostMemory host_memory();

// "512 B", "1.5 KiB", "23.4 MiB", "1.21 GiB".
std::string format_bytes(size_t bytes);

}  // namespace dpt
