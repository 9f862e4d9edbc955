// models/kernels/cuda/cuda_kernels.cpp: CudaKernels's own state: the stream and cuBLAS handle it makes for its
// device, and the checks several operation families share. The operations are in the family files beside this one.
#include "models/kernels/cuda/cuda_kernels.h"

#include <cstdlib>
#include <limits>
#include <string_view>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

namespace dpt::models {

namespace {

// cuBLAS's math mode, for every precision: the default mode, which keeps each compute type's precision (no TF32 for
// float32 GEMMs: that needs CUBLAS_TF32_TENSOR_OP_MATH or a _FAST compute type; TF32 would be faster but leaves the
// CPU path's results by ~1e-3), as PyTorch's handle runs them with torch.backends.cuda.matmul.allow_tf32 = False;
// the 16-bit GEMMs on the tensor cores, accumulating in float32 as CUBLAS_COMPUTE_32F asks, and no GEMM adding its
// split-K parts in a 16-bit output type (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: cublasGemmEx with a
// bf16 D, as cuBLASLt's plans keep them too, reduction_schemes in matmul.cpp). Not the pedantic mode, which
// prescribes the arithmetic of every phase and which cuBLAS's documentation describes as meant for numerical
// studies and debugging rather than speed; until 2026-11-28 float32 GEMMs ran in it.
constexpr auto kCublasMath =
    static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

}  // namespace

CudaKernels::CudaKernels(int index) : index_(index) {
  cuda::set_device(index);
  stream_ = std::make_unique<cuda::Stream>();
  DPT_CUBLAS_CHECK(cublasCreate(&handle_));
  DPT_CUBLAS_CHECK(cublasSetStream(handle_, stream()));
  DPT_CUBLAS_CHECK(cublasSetMathMode(handle_, kCublasMath));
  partials_ = Tensor::empty({cuda_launch::kSumSquaresBlocks + 1}, DType::F64, device());
  if (const char* b = std::getenv("DPT_TUNE_BGRAD"); b && std::string_view(b) == "separate") lt_bgrad_fused_ = false;
}

CudaKernels::~CudaKernels() {
  attention_.reset();  // cuDNN graphs before the cuDNN handle
  lt_.reset();
#if DPT_HAVE_CUDNN
  plans_.clear();  // descriptors before the handle
  if (cudnn_) (void)cudnnDestroy(cudnn_);
#endif
  if (handle_) (void)cublasDestroy(handle_);
}

// The row kernels (one warp per row) launch rows / kRowsPerBlock blocks: bounded by a grid's x.
void CudaKernels::check_row_shape(int64_t rows, int64_t cols, const char* op) {
  DPT_CHECK(rows >= 0 && cols >= 1, "{} of {} rows of {}", op, rows, cols);
  DPT_CHECK(rows / cuda_launch::kRowsPerBlock < std::numeric_limits<int>::max(),
            "{} of {} rows: more blocks than a grid holds", op, rows);
}

}  // namespace dpt::models
