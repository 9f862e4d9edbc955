// models/kernels/cuda/cuda_kernels.cpp: CudaKernels: the Kernels interface on one GPU. GEMMs go to cuBLAS in
// strict FP32 (no TF32), so results match the CPU set within float rounding; the other operations launch the
// kernels of kernels.cu on this set's stream. Nothing here synchronises the host except sum_squares, whose
// result the caller wants on the host.
#include "models/kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>

#include <limits>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

#define DPT_CUBLAS_CHECK(expr)                                                                                  \
  do {                                                                                                          \
    const cublasStatus_t dpt_st_ = (expr);                                                                      \
    if (dpt_st_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      throw ::dpt::DeviceError(::dpt::detail::located(                                                          \
          __FILE__, __LINE__,                                                                                   \
          fmt::format("cuBLAS error in {}: {}: {}", #expr, cublasGetStatusName(dpt_st_), cublasGetStatusString(dpt_st_)))); \
  } while (0)

namespace dpt::models {
namespace {

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(int index) : index_(index) {
    cuda::set_device(index);
    stream_ = std::make_unique<cuda::Stream>();
    DPT_CUBLAS_CHECK(cublasCreate(&handle_));
    DPT_CUBLAS_CHECK(cublasSetStream(handle_, stream()));
    // FP32 GEMMs in full precision: TF32 would be faster but leaves the CPU path's results by ~1e-3.
    DPT_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));
    partials_ = Tensor::empty({cuda_launch::kSumSquaresBlocks + 1}, DType::F64, device());
  }
  ~CudaKernels() override {
    if (handle_) (void)cublasDestroy(handle_);
  }

  Device device() const override { return Device::cuda(index_); }
  StreamHandle stream() const override { return stream_->get(); }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
    if (M == 0 || N == 0) return;
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
              "gemm dimensions exceed cuBLAS's int range");
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
    DPT_CUBLAS_CHECK(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                 static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C, static_cast<int>(ldc)));
  }

  void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) override {
    DPT_CUDA_CHECK(cuda_launch::bias_act(x, bias, y, rows, cols, relu, stream()));
  }
  void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) override {
    DPT_CUDA_CHECK(cuda_launch::bias_grad_accumulate(dy, db, rows, cols, stream()));
  }
  void relu_backward(const float* y, const float* dy, float* dx, size_t n) override {
    DPT_CUDA_CHECK(cuda_launch::relu_backward(y, dy, dx, n, stream()));
  }
  void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                    double* stats) override {
    DPT_CHECK(cols > 0, "softmax over {} classes", cols);
    // Scratch for the per-row results, grown when a larger batch comes; reused while the stream runs in order.
    if (rows_scratch_.numel() < static_cast<size_t>(2 * rows))
      rows_scratch_ = Tensor::empty({2 * rows}, DType::F32, device());
    float* row_loss = rows_scratch_.data<float>();
    DPT_CUDA_CHECK(cuda_launch::softmax_xent(logits, labels, dlogits, rows, cols, row_loss, row_loss + rows, stats,
                                             stream()));
  }
  void sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) override {
    DPT_CHECK(p.momentum == 0.0f || buf, "SGD with momentum needs a momentum buffer");
    DPT_CUDA_CHECK(cuda_launch::sgd_update(param, grad, buf, n, p, stream()));
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) override {
    DPT_CUDA_CHECK(cuda_launch::adamw_update(param, grad, m, v, n, elementwise::adamw_step(p), stream()));
  }
  void scale(float* x, size_t n, float alpha) override { DPT_CUDA_CHECK(cuda_launch::scale(x, n, alpha, stream())); }
  double sum_squares(const float* x, size_t n) override {
    double* partials = partials_.data<double>();
    double* out = partials + cuda_launch::kSumSquaresBlocks;
    DPT_CUDA_CHECK(cuda_launch::sum_squares(x, n, partials, out, stream()));
    double host = 0;
    DPT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof(double), cudaMemcpyDeviceToHost, stream()));
    stream_->synchronize();
    return host;
  }

 private:
  int index_;
  std::unique_ptr<cuda::Stream> stream_;
  cublasHandle_t handle_ = nullptr;
  Tensor partials_, rows_scratch_;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(int index) { return std::make_unique<CudaKernels>(index); }

}  // namespace dpt::models
