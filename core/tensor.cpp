// core/tensor.cpp: DType helpers, Storage allocation, Tensor views.
#include "core/tensor.h"

#include "core/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace dpt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}


Storage::Storage(size_t bytes, Device device, bool pinned) : bytes_(bytes), device_(device), pinned_(pinned) {
  reserve();
}

void Storage::allocate(StreamHandle stream) {
  const size_t bytes = bytes_;
  const bool pinned = pinned_;
  const Device device = device_;
  if (device.is_cuda()) {
    DPT_CHECK(!pinned, "pinned applies to host memory, not {}", device.str());
    if (!cuda::built()) DPT_THROW(UnsupportedError, "device {} is not supported by this build (no CUDA)", device.str());
    cuda::set_device(device.index);
    if (stream) {
      data_ = cuda::malloc_device_async(bytes, stream);
      pool_stream_ = stream;
    } else {
      data_ = cuda::malloc_device(bytes);
    }
    return;
  }
  if (pinned) {
    data_ = cuda::malloc_pinned(bytes);
    return;
  }
  constexpr size_t kAlign = 64;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  data_ = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (!data_) {
    const HostMemory host = host_memory();
    DPT_THROW(OutOfMemoryError, "out of host memory: cannot allocate {} (resident {}, {} held by tensors)",
              format_bytes(bytes), format_bytes(host.rss), format_bytes(tensor_memory(Device::cpu()).current));
  }
}

Storage::~Storage() { release(); }

void Storage::release(StreamHandle stream) {
  if (!data_) return;
  note_release(device_, bytes_);
  if (device_.is_cuda() && pool_stream_)
    cuda::free_device_async(data_, stream ? stream : pool_stream_);
  else if (device_.is_cuda())
    cuda::free_device(data_);
  else if (pinned_)
    cuda::free_pinned(data_);
  else
    std::free(data_);
  data_ = nullptr;
  pool_stream_ = nullptr;
}

void Storage::reserve(StreamHandle stream) {
  if (data_) return;
  note_allocation(device_, bytes_);  // counted first: the fault injection's limit throws before anything is held
  try {
    allocate(device_.is_cuda() ? stream : nullptr);
  } catch (...) {
    note_release(device_, bytes_);
    throw;
  }
}

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    DPT_CHECK_GE(d, 0);
    // A product that wrapped (a config's model.intermediate_size = 2^63 - 1) once made a small buffer for a huge
    // shape, and the process died writing past it (SIGSEGV).
    if (__builtin_mul_overflow(n, static_cast<size_t>(d), &n) || n > static_cast<size_t>(INT64_MAX))
      DPT_THROW(OutOfMemoryError, "cannot allocate a tensor of shape [{}]: more elements than an address space holds",
                fmt::join(shape, ", "));
  }
  return n;
}

namespace {
size_t bytes_of(const std::vector<int64_t>& shape, size_t numel, DType dtype) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(dtype), &bytes) || bytes > static_cast<size_t>(INT64_MAX) / 2)
    DPT_THROW(OutOfMemoryError, "cannot allocate a tensor of shape [{}]: more bytes than an address space holds",
              fmt::join(shape, ", "));
  return bytes;
}
}  // namespace

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = numel_of(shape);
  const size_t bytes = bytes_of(shape, t.numel_, dtype);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(bytes, device);
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::empty_pinned(std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.numel_ = numel_of(shape);
  const size_t bytes = bytes_of(shape, t.numel_, dtype);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(bytes, Device::cpu(), cuda::device_count() > 0);
  return t;
}

Tensor Tensor::view(size_t elem_offset, std::vector<int64_t> shape) const {
  DPT_CHECK(defined(), "view of an undefined tensor");
  Tensor t;
  t.numel_ = numel_of(shape);
  DPT_CHECK_LE(elem_offset + t.numel_, numel_);
  t.storage_ = storage_;
  t.dtype_ = dtype_;
  t.byte_offset_ = byte_offset_ + elem_offset * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

int64_t Tensor::dim(size_t i) const {
  DPT_CHECK_LT(i, shape_.size());
  return shape_[i];
}

void Tensor::zero_(StreamHandle stream) {
  if (numel_ == 0) return;
  if (device().is_cuda())
    cuda::memset_zero(raw(), bytes(), stream);
  else
    std::memset(raw(), 0, bytes());
}

void Tensor::copy_from(const Tensor& src, StreamHandle stream) {
  DPT_CHECK(src.dtype() == dtype_, "copy {} into {}", dtype_name(src.dtype()), dtype_name(dtype_));
  DPT_CHECK_EQ(src.numel(), numel_);
  if (numel_ == 0) return;
  if (device().is_cpu() && src.device().is_cpu())
    std::memmove(raw(), src.raw(), bytes());
  else
    cuda::memcpy(raw(), src.raw(), bytes(), stream);
}

Tensor Tensor::to(Device device) const {
  if (this->device() == device) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

std::string Tensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape_, ", ")); }

}  // namespace dpt
