// core/cuda.h: the CUDA runtime as the rest of dptrain sees it: device discovery, streams, events, device
// and pinned host memory, asynchronous copies. No CUDA header is included here, so every layer can use it
// in a CPU-only build, where device_count() is 0 and everything else throws UnsupportedError.
//
// Streams are created non-blocking (they never synchronise implicitly with the legacy default stream):
// every kernel, copy and collective is put on an explicit stream, and one stream waits for another through
// an Event (Event::block), never through a host synchronisation on the hot path.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

// The runtime's own opaque types: cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*.
struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;

namespace dpt {

// A CUDA stream handle (cudaStream_t); nullptr means "no stream": host work, or a blocking fallback.
using StreamHandle = CUstream_st*;

namespace cuda {

// Whether this build has the GPU path (nvcc and NCCL were found at configure time).
bool built();
// Number of usable CUDA devices: 0 in a CPU-only build, without a driver, or without a device. Never throws.
int device_count();
// Why device_count() is 0 ("built without CUDA", "CUDA driver version is insufficient ...", ...); empty
// when devices exist.
std::string unavailable_reason();
// Device `index`'s name and memory, for the start-up log ("NVIDIA H100 80GB HBM3, 79.1 GiB").
std::string device_description(int index);

// Device `index`'s name as the driver gives it ("NVIDIA H100 80GB HBM3").
std::string device_name(int index);
// The dense bf16 tensor-core peak of a device, in FLOP/s, from its name (H100 SXM and H200 989e12, H100 NVL
// 835e12, H100 PCIe 756e12, A100 312e12); 0 for a device not in this table (MFU is then not shown).
double dense_bf16_peak_flops(const std::string& name);
// Device `index`'s peak memory bandwidth in bytes/s, from the driver's memory clock and bus width (2 transfers a
// clock: an H100 SXM's 2619 MHz x 5120 bits gives 3.35e12); 0 when the driver does not report both. On a MIG slice,
// the whole GPU's.
double memory_bandwidth_bytes_per_s(int index);

void set_device(int index);
int current_device();
void device_synchronize();
// Waits for everything enqueued on `stream`; on a null stream, for the whole device.
void stream_synchronize(StreamHandle stream);

// An owned, non-blocking stream on the current device.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle get() const { return stream_; }
  void synchronize() const;

 private:
  StreamHandle stream_ = nullptr;
};

// An owned event. `timing` events can measure elapsed time; others are cheaper (ordering only).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(StreamHandle stream);
  // Work enqueued on `stream` after this call starts only once the recorded work is done. No host wait.
  void block(StreamHandle stream) const;
  bool query() const;  // the recorded work is done (true if never recorded)
  void synchronize() const;
  // Milliseconds from `start` to this event; both recorded, timing, and complete.
  float elapsed_ms_since(const Event& start) const;

 private:
  CUevent_st* event_ = nullptr;
};

// A CUDA graph: the work one thread enqueues on a stream, captured once (cudaStreamBeginCapture) and then launched
// as one unit, so that the hundreds of kernels of a training step cost one launch. Capture is thread-local: a call
// of the capturing thread that could synchronise or is not stream-ordered (cudaMalloc, cudaFree, a copy to pageable
// host memory, a stream or event synchronisation) fails and invalidates the capture; a checked call throws there,
// naming itself, while an unchecked one (a tensor's release) shows at the next checked call or at the capture's end.
// Other threads (the loader's copies, a watchdog's event queries) are not affected. The captured work reads and
// writes the addresses it saw, and any decision the host made while capturing is fixed in it: everything it
// touches must stay allocated, in place, while the graph is launched (a buffer reallocated by a run outside the
// graph makes the graph write where it no longer should), and what the host decided must hold at every launch.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // Captures what `work` enqueues on `stream` and instantiates it (none of it runs: launch() does). When `work`
  // throws or the capture fails, the stream leaves capture mode, nothing is kept, and the error propagates
  // (DeviceError "capturing ...: CUDA error ..." for the capture's own failure).
  static Graph capture(StreamHandle stream, const std::function<void()>& work);
  void launch(StreamHandle stream) const;
  bool defined() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }  // the graph's top-level nodes: kernels, copies, memsets, events, ...

 private:
  CUgraphExec_st* exec_ = nullptr;
  size_t nodes_ = 0;
};

// Throws OutOfMemoryError naming the device, `bytes` and what the device had free when cudaMalloc fails for
// lack of memory (DeviceError for any other failure).
void* malloc_device(size_t bytes);
void free_device(void* p) noexcept;
// Stream-ordered device memory from the current device's memory pool (cudaMallocFromPoolAsync / cudaFreeAsync):
// the bytes may be used by work enqueued on `stream` after malloc_device_async returns, and by work ordered after
// that (another stream waiting on an event recorded there, as every collective's stream waits on its caller's);
// free_device_async gives them back when `stream` reaches that point. The pool is the device's default one, set up
// on first use to keep what is freed (its release threshold: no limit), so a size that comes back is served from
// the pool: no cudaMalloc, no cudaFree, no device synchronisation. OutOfMemoryError as malloc_device. What ZeRO's
// held buckets (stage 2 gradients, stage 3 parameters) are made of, every step.
void* malloc_device_async(size_t bytes, StreamHandle stream);
void free_device_async(void* p, StreamHandle stream) noexcept;
// The current device's pool: bytes it holds from the device (cached included) and bytes handed out now.
struct PoolInfo {
  size_t reserved = 0, used = 0;
};
PoolInfo pool_info();
// Page-locked host memory: the source of truly asynchronous host-to-device copies.
void* malloc_pinned(size_t bytes);
void free_pinned(void* p) noexcept;
// cudaMemcpyAsync with the direction inferred from the pointers (unified addressing). On a null stream
// the copy is synchronous: the device is synchronised before and after.
void memcpy(void* dst, const void* src, size_t bytes, StreamHandle stream);
void memset_zero(void* dst, size_t bytes, StreamHandle stream);

// Device `index`'s memory as the driver counts it (every process's and context's allocations included).
struct MemInfo {
  size_t free = 0, total = 0;
};
MemInfo mem_info(int index);

}  // namespace cuda
}  // namespace dpt
