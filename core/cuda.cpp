// core/cuda.cpp: devices, streams, events, memory and copies through the CUDA runtime; in a CPU-only build
// (no DPT_WITH_CUDA) the same functions report no device and throw UnsupportedError when used.
#include "core/cuda.h"

#include "core/check.h"
#include "core/memory.h"

#ifdef DPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

#include "core/cuda_check.h"
#endif

namespace dpt::cuda {

#ifdef DPT_WITH_CUDA

namespace {
// cudaGetDeviceCount once: without a driver it fails (cudaErrorNoDevice, cudaErrorInsufficientDriver),
// which here means "no GPU", not an error.
struct Probe {
  int count = 0;
  std::string why;
  Probe() {
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      count = 0;
      why = fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    } else if (count == 0) {
      why = "no CUDA device visible";
    }
  }
};
const Probe& probe() {
  static const Probe p;
  return p;
}
}  // namespace

bool built() { return true; }
int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().why; }

std::string device_description(int index) {
  cudaDeviceProp prop{};
  DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return fmt::format("{}, {:.1f} GiB, compute capability {}.{}", prop.name,
                     static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor);
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  DPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

double memory_bandwidth_bytes_per_s(int index) {
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  return 2.0 * khz * 1e3 * bits / 8.0;
}

void set_device(int index) { DPT_CUDA_CHECK(cudaSetDevice(index)); }
int current_device() {
  int d = 0;
  DPT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}
void device_synchronize() { DPT_CUDA_CHECK(cudaDeviceSynchronize()); }
void stream_synchronize(StreamHandle stream) {
  if (stream)
    DPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  else
    DPT_CUDA_CHECK(cudaDeviceSynchronize());
}

Stream::Stream() { DPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (stream_) (void)cudaStreamDestroy(stream_);
}
void Stream::synchronize() const { DPT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  DPT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}
void Event::record(StreamHandle stream) { DPT_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::block(StreamHandle stream) const { DPT_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
bool Event::query() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  DPT_CUDA_CHECK(e);
  return true;
}
void Event::synchronize() const { DPT_CUDA_CHECK(cudaEventSynchronize(event_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  DPT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

namespace {
cudaMemPool_t device_pool();

// OutOfMemoryError naming the device, the request and what the device had free. The error is not sticky: the
// context stays usable, so the caller can report and unwind.
[[noreturn]] void throw_out_of_memory(size_t bytes, const char* from) {
  (void)cudaGetLastError();
  int index = 0;
  (void)cudaGetDevice(&index);
  size_t free = 0, total = 0;
  (void)cudaMemGetInfo(&free, &total);
  DPT_THROW(OutOfMemoryError, "out of memory on cuda:{}: cannot allocate {}{} ({} free of {})", index,
            format_bytes(bytes), from, format_bytes(free), format_bytes(total));
}
}  // namespace

void* malloc_device(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (e == cudaErrorMemoryAllocation) {
    // The memory pool keeps what ZeRO's buckets gave back (its release threshold: no limit): hand that to the device
    // and try once more before calling it out of memory.
    (void)cudaGetLastError();
    if (cudaDeviceSynchronize() == cudaSuccess && cudaMemPoolTrimTo(device_pool(), 0) == cudaSuccess)
      e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  }
  if (e == cudaErrorMemoryAllocation) throw_out_of_memory(bytes, "");
  DPT_CUDA_CHECK(e);
  return p;
}
void free_device(void* p) noexcept {
  if (p) (void)cudaFree(p);
}

namespace {
// The current device's default memory pool, its release threshold raised once so freed memory stays cached.
cudaMemPool_t device_pool() {
  int index = 0;
  DPT_CUDA_CHECK(cudaGetDevice(&index));
  cudaMemPool_t pool = nullptr;
  DPT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  static std::mutex mu;
  static std::set<int> configured;
  const std::lock_guard<std::mutex> lock(mu);
  if (configured.insert(index).second) {
    uint64_t keep_all = UINT64_MAX;
    DPT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }
  return pool;
}
}  // namespace

void* malloc_device_async(size_t bytes, StreamHandle stream) {
  cudaMemPool_t pool = device_pool();
  void* p = nullptr;
  const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes == 0 ? 256 : bytes, pool, stream);
  if (e == cudaErrorMemoryAllocation) throw_out_of_memory(bytes, " from its memory pool");
  DPT_CUDA_CHECK(e);
  return p;
}

void free_device_async(void* p, StreamHandle stream) noexcept {
  if (p) (void)cudaFreeAsync(p, stream);
}

PoolInfo pool_info() {
  cudaMemPool_t pool = device_pool();
  uint64_t reserved = 0, used = 0;
  DPT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  DPT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  return {static_cast<size_t>(reserved), static_cast<size_t>(used)};
}
void* malloc_pinned(size_t bytes) {
  void* p = nullptr;
  DPT_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 64 : bytes));
  return p;
}
void free_pinned(void* p) noexcept {
  if (p) (void)cudaFreeHost(p);
}

MemInfo mem_info(int index) {
  const int before = current_device();
  if (before != index) set_device(index);
  MemInfo m;
  DPT_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  if (before != index) set_device(before);
  return m;
}

void memcpy(void* dst, const void* src, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  if (stream) {
    DPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    return;
  }
  // No stream: the caller wants the bytes now, and ordered after everything already enqueued anywhere.
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
  DPT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
}

void memset_zero(void* dst, size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  if (stream) {
    DPT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    return;
  }
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
  DPT_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  DPT_CUDA_CHECK(cudaDeviceSynchronize());
}

Graph::~Graph() {
  if (exec_) (void)cudaGraphExecDestroy(exec_);
}
Graph::Graph(Graph&& other) noexcept
    : exec_(std::exchange(other.exec_, nullptr)), nodes_(std::exchange(other.nodes_, 0)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
    nodes_ = std::exchange(other.nodes_, 0);
  }
  return *this;
}

Graph Graph::capture(StreamHandle stream, const std::function<void()>& work) {
  DPT_CHECK(stream != nullptr, "a CUDA graph is captured from an explicit stream");
  DPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  // Ends the capture whatever happened (the stream must not stay in capture mode) and drops what it made.
  const auto end_capture = [&] {
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
  };
  try {
    work();
  } catch (...) {
    (void)end_capture();
    if (graph) (void)cudaGraphDestroy(graph);
    throw;
  }
  const cudaError_t ended = end_capture();
  if (ended != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    DPT_THROW(DeviceError, "capturing a CUDA graph: {}: {} (a call of the captured work invalidated it)",
              cudaGetErrorName(ended), cudaGetErrorString(ended));
  }
  Graph g;
  size_t n = 0;
  const char* failed = "cudaGraphGetNodes";
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &n);
  // Memory the captured work allocates from the pool and does not free is freed before each launch reuses it.
  if (e == cudaSuccess) {
    failed = "cudaGraphInstantiateWithFlags";
    e = cudaGraphInstantiateWithFlags(&g.exec_, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  }
  (void)cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    DPT_THROW(DeviceError, "a captured CUDA graph: {} failed: {}: {}", failed, cudaGetErrorName(e),
              cudaGetErrorString(e));
  }
  g.nodes_ = n;
  DPT_CUDA_CHECK(cudaGraphUpload(g.exec_, stream));  // the first launch then costs what the later ones do
  return g;
}

void Graph::launch(StreamHandle stream) const {
  DPT_CHECK(exec_ != nullptr, "launching a CUDA graph that was never captured");
  DPT_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda(const char* what) {
  DPT_THROW(UnsupportedError, "{} needs CUDA, and this dptrain was built without it (no nvcc or NCCL at configure time)",
            what);
}
}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this dptrain was built without CUDA"; }
std::string device_description(int) { no_cuda("device_description"); }
std::string device_name(int) { no_cuda("device_name"); }
double memory_bandwidth_bytes_per_s(int) { no_cuda("memory_bandwidth_bytes_per_s"); }
void set_device(int) { no_cuda("set_device"); }
int current_device() { no_cuda("current_device"); }
void device_synchronize() { no_cuda("device_synchronize"); }
void stream_synchronize(StreamHandle) { no_cuda("stream_synchronize"); }
Stream::Stream() { no_cuda("a CUDA stream"); }
Stream::~Stream() = default;
void Stream::synchronize() const { no_cuda("a CUDA stream"); }
Event::Event(bool) { no_cuda("a CUDA event"); }
Event::~Event() = default;
void Event::record(StreamHandle) { no_cuda("a CUDA event"); }
void Event::block(StreamHandle) const { no_cuda("a CUDA event"); }
bool Event::query() const { no_cuda("a CUDA event"); }
void Event::synchronize() const { no_cuda("a CUDA event"); }
float Event::elapsed_ms_since(const Event&) const { no_cuda("a CUDA event"); }
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
Graph Graph::capture(StreamHandle, const std::function<void()>&) { no_cuda("a CUDA graph"); }
void Graph::launch(StreamHandle) const { no_cuda("a CUDA graph"); }
void* malloc_device(size_t) { no_cuda("device memory"); }
void free_device(void*) noexcept {}
void* malloc_device_async(size_t, StreamHandle) { no_cuda("device memory"); }
void free_device_async(void*, StreamHandle) noexcept {}
PoolInfo pool_info() { no_cuda("a device memory pool"); }
void* malloc_pinned(size_t) { no_cuda("pinned memory"); }
void free_pinned(void*) noexcept {}
void memcpy(void*, const void*, size_t, StreamHandle) { no_cuda("a device copy"); }
void memset_zero(void*, size_t, StreamHandle) { no_cuda("a device memset"); }
MemInfo mem_info(int) { no_cuda("device memory information"); }

#endif

// Dense (not sparse) bf16 tensor-core peaks from NVIDIA's data sheets; the first match wins.
double dense_bf16_peak_flops(const std::string& name) {
  struct Peak {
    const char* a;
    const char* b;  // also required in the name, or nullptr
    double tflops;
  };
  static constexpr Peak kPeaks[] = {
      {"H100", "PCIe", 756}, {"H100", "NVL", 835}, {"H100", nullptr, 989}, {"H200", nullptr, 989},
      {"H800", nullptr, 989}, {"A100", nullptr, 312}, {"A800", nullptr, 312},
  };
  for (const Peak& p : kPeaks)
    if (name.find(p.a) != std::string::npos && (!p.b || name.find(p.b) != std::string::npos)) return p.tflops * 1e12;
  return 0.0;
}

}  // namespace dpt::cuda
