// core/bfloat16_convert.cpp: the tensor conversions: CPU loops here, CUDA kernels in bfloat16_convert.cu.
#include "core/bfloat16_convert.h"

#ifdef DPT_WITH_CUDA
#include "core/bfloat16_launch.h"
#include "core/cuda_check.h"
#endif

namespace dpt {
namespace {

void check_pair(const char* op, const Tensor& src, DType src_dtype, const Tensor& dst, DType dst_dtype) {
  DPT_CHECK(src.dtype() == src_dtype && dst.dtype() == dst_dtype, "{}: {} -> {}, expected {} -> {}", op,
            dtype_name(src.dtype()), dtype_name(dst.dtype()), dtype_name(src_dtype), dtype_name(dst_dtype));
  DPT_CHECK(src.numel() == dst.numel(), "{}: {} elements into {}", op, src.numel(), dst.numel());
  DPT_CHECK(src.device() == dst.device(), "{}: from {} to {}", op, src.device().str(), dst.device().str());
}

#ifdef DPT_WITH_CUDA
// Runs `launch` on `stream` (the legacy default stream, the device synchronised around it, without one).
template <class F>
void on_device(const Tensor& t, StreamHandle stream, F&& launch) {
  cuda::set_device(t.device().index);
  if (!stream) cuda::device_synchronize();
  DPT_CUDA_CHECK(launch(reinterpret_cast<cudaStream_t>(stream)));
  if (!stream) cuda::device_synchronize();
}
#endif

}  // namespace

void to_bfloat16(const Tensor& src, Tensor& dst, float divisor, StreamHandle stream) {
  check_pair("to_bfloat16", src, DType::F32, dst, DType::BF16);
  if (src.numel() == 0) return;
  if (src.device().is_cuda()) {
#ifdef DPT_WITH_CUDA
    on_device(src, stream, [&](cudaStream_t s) {
      return cuda_launch::to_bfloat16(src.data<float>(), dst.data<BFloat16>(), src.numel(), divisor, s);
    });
    return;
#else
    DPT_THROW(UnsupportedError, "to_bfloat16 on {}: this build has no CUDA", src.device().str());
#endif
  }
  const float* in = src.data<float>();
  BFloat16* out = dst.data<BFloat16>();
  const size_t n = src.numel();
  if (divisor == 1.0f) {
    for (size_t i = 0; i < n; ++i) out[i] = dpt::to_bfloat16(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = dpt::to_bfloat16(in[i] / divisor);
  }
}

void from_bfloat16(const Tensor& src, Tensor& dst, StreamHandle stream) {
  check_pair("from_bfloat16", src, DType::BF16, dst, DType::F32);
  if (src.numel() == 0) return;
  if (src.device().is_cuda()) {
#ifdef DPT_WITH_CUDA
    on_device(src, stream, [&](cudaStream_t s) {
      return cuda_launch::from_bfloat16(src.data<BFloat16>(), dst.data<float>(), src.numel(), s);
    });
    return;
#else
    DPT_THROW(UnsupportedError, "from_bfloat16 on {}: this build has no CUDA", src.device().str());
#endif
  }
  const BFloat16* in = src.data<BFloat16>();
  float* out = dst.data<float>();
  for (size_t i = 0, n = src.numel(); i < n; ++i) out[i] = to_float(in[i]);
}

}  // namespace dpt
