// core/tensor.h: the shared vocabulary for data: DType, Device (core/device.h), Storage (owned bytes on a device) and Tensor
// (a typed, shaped, contiguous window onto a Storage).
//
// Tensors are cheap handles: copying one shares the storage. view() makes a tensor over part of another's
// storage; that is how layers hold their weights inside the model's one flat parameter buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/device.h"

namespace dpt {

// BF16: bfloat16 (core/bfloat16.h), 2 bytes: what a compressed gradient all-reduce carries.
enum class DType : uint8_t { F32, F64, I32, I64, U8, BF16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "float64", "int32", "int64", "uint8", "bfloat16"

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }

// Owned, aligned bytes on one device. CPU memory is 64-byte aligned; `pinned` CPU memory is page-locked
// (cudaMallocHost), so copies from it to a GPU run asynchronously; it needs a CUDA build and device.
class Storage {
 public:
  Storage(size_t bytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  // FSDP's storage resize to 0: release() frees the bytes while every tensor over this storage stays a valid
  // handle (views keep their offsets); nothing may touch the data until reserve() allocates the bytes again
  // (contents undefined). How ZeRO stage 2 holds a gradient bucket only from its first write in backward to its
  // reduce-scatter. Both count in the memory figures (core/memory.h), and reserve() obeys DPT_DEBUG_MEMORY_LIMIT.
  // On a GPU, without a stream, cudaFree synchronises the device, so release() is safe after any enqueued use. With
  // `stream` (a CUDA storage), both are stream-ordered through the device's memory pool (cuda::malloc_device_async):
  // reserve()'s bytes serve work enqueued on `stream` from then on (and work ordered after it), release() hands
  // them back when `stream` gets there: no cudaMalloc, no cudaFree, no synchronisation once the pool holds the
  // sizes. The caller orders every other stream's use of the bytes before the release on `stream` (ZeRO releases
  // after the compute stream has waited on the collective). A storage released or destroyed frees its bytes the way
  // they came: pooled memory with cudaFreeAsync (on `stream`, else on the stream it was reserved on). On the CPU
  // the stream changes nothing. Not thread-safe against another thread touching the same storage.
  void release(StreamHandle stream = nullptr);
  void reserve(StreamHandle stream = nullptr);
  // Whether the bytes held now came from the device's memory pool (reserve with a stream).
  bool pooled() const { return pool_stream_ != nullptr; }
  bool resident() const { return data_ != nullptr; }

 private:
  void allocate(StreamHandle stream);
  void* data_ = nullptr;
  StreamHandle pool_stream_ = nullptr;  // the stream pooled bytes were reserved on (nullptr: cudaMalloc's, or host)
  size_t bytes_ = 0;
  Device device_;
  bool pinned_ = false;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::F32, Device device = Device::cpu());
  // Host memory, page-locked when a CUDA device exists (plain host memory otherwise).
  static Tensor empty_pinned(std::vector<int64_t> shape, DType dtype = DType::F32);

  // A tensor over `shape` elements of this one's storage, starting `elem_offset` elements in.
  Tensor view(size_t elem_offset, std::vector<int64_t> shape) const;
  // The same elements, another shape (numel must match).
  Tensor reshape(std::vector<int64_t> shape) const { return view(0, std::move(shape)); }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool pinned() const { return storage_ && storage_->pinned(); }
  // The storage itself (shared by every view of it), to release() and reserve() its bytes.
  Storage& storage() const {
    DPT_CHECK(storage_ != nullptr, "an undefined tensor has no storage");
    return *storage_;
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const;
  size_t ndim() const { return shape_.size(); }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * dtype_size(dtype_); }

  // nullptr for an undefined tensor or a released storage (Storage::release).
  void* raw() const {
    void* base = storage_ ? storage_->data() : nullptr;
    return base ? static_cast<char*>(base) + byte_offset_ : nullptr;
  }
  template <class T>
  T* data() const {
    DPT_CHECK(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_), dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // On a CUDA tensor both run on `stream`, asynchronously; with no stream they are synchronous (the device
  // is synchronised around them: for set-up and checkpoints, not the step).
  void zero_(StreamHandle stream = nullptr);
  // Same dtype and numel, any devices (host<->device, device<->device, host<->host).
  void copy_from(const Tensor& src, StreamHandle stream = nullptr);
  // A copy on `device` (synchronous); the same tensor when it is already there.
  Tensor to(Device device) const;
  std::string shape_str() const;      // "[64, 784]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t byte_offset_ = 0;
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  DType dtype_ = DType::F32;
};

size_t numel_of(const std::vector<int64_t>& shape);

// A tensor with its name, as checkpoints and optimizer state list them ("layers.0.weight").
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

}  // namespace dpt
