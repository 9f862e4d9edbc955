// models/kernels/cuda/cuda_kernels.cpp: CudaKernels: the Kernels interface on one GPU. GEMMs go to cuBLAS and
// convolutions to cuDNN (when the build found it: DPT_HAVE_CUDNN), by default in strict FP32 (no TF32), so results
// match the CPU set within float rounding; the other operations launch the kernels of kernels.cu on this set's
// stream. Nothing here synchronises the host except sum_squares, whose result the caller wants on the host.
//
// set_precision(BF16 / F16) switches gemm and the convolutions to 16-bit operands: the float32 inputs are rounded
// (to nearest even) into packed 16-bit scratch on the stream, then cuBLAS / cuDNN multiply them with float32
// accumulation, on tensor cores. gemm writes float32 C (alpha and beta in float32): the CPU set's numerics
// (operands rounded, float32 arithmetic), in another summation order. cuDNN's legacy API wants x, w and y of one
// type (PSEUDO_BFLOAT16 / PSEUDO_HALF: 16-bit tensors, float32 compute), so a convolution's output is also rounded
// to bf16 / fp16 before it is widened into the caller's float32 buffer (for backward weight: rounded, then added
// to dw in float32). That one extra rounding (relative error at most 2^-8 for bf16, 2^-11 for fp16) is what
// torch.autocast does too; the CPU set keeps the convolution's float32 result. gemm_strided_batched is one
// cuBLAS strided batched call, its operands rounded the same way in BF16 / F16 (each matrix packed).
//
// The transformer operations (embedding, LayerNorm, GELU, causal softmax) are kernels.cu's; like the rest they
// reduce in a fixed order without atomics, so a rerun gives the same bits.
#include "models/kernels/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <library_types.h>

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include "core/cuda_check.h"
#include "models/kernels/cuda/launch.h"

#if DPT_HAVE_CUDNN
#include <cudnn.h>
#endif

#define DPT_CUBLAS_CHECK(expr)                                                                                  \
  do {                                                                                                          \
    const cublasStatus_t dpt_st_ = (expr);                                                                      \
    if (dpt_st_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      throw ::dpt::DeviceError(::dpt::detail::located(                                                          \
          __FILE__, __LINE__,                                                                                   \
          fmt::format("cuBLAS error in {}: {}: {}", #expr, cublasGetStatusName(dpt_st_), cublasGetStatusString(dpt_st_)))); \
  } while (0)

#if DPT_HAVE_CUDNN
// cuDNN's status string, and its last error message (cuDNN 9 says there which check failed, e.g. a bad shape).
#define DPT_CUDNN_CHECK(expr)                                                                                   \
  do {                                                                                                          \
    const cudnnStatus_t dpt_st_ = (expr);                                                                       \
    if (dpt_st_ != CUDNN_STATUS_SUCCESS)                                                                        \
      throw ::dpt::DeviceError(::dpt::detail::located(                                                          \
          __FILE__, __LINE__,                                                                                   \
          fmt::format("cuDNN error in {}: {}{}", #expr, cudnnGetErrorString(dpt_st_),                           \
                      ::dpt::models::cudnn_last_error())));                                                     \
  } while (0)
#endif

namespace dpt::models {

#if DPT_HAVE_CUDNN
// ": " and cuDNN's message about the last failed call, or nothing when it has none.
inline std::string cudnn_last_error() {
  std::array<char, 512> msg{};
  cudnnGetLastErrorString(msg.data(), msg.size());
  return msg[0] ? fmt::format(": {}", msg.data()) : std::string();
}
#endif

namespace {

// FP32 convolutions on the FMA units only: TF32 tensor cores (CUDNN_DEFAULT_MATH lets cuDNN use them on A100
// and newer) would be several times faster but leave the CPU path's results by ~1e-3. Turning this on is the
// switch for TF32 convolutions (the tolerance of the conv tests would then have to follow).
constexpr bool kConvAllowTf32 = false;
// The most workspace one convolution algorithm may ask for; a hungrier one is skipped for the next in cuDNN's
// ranking.
constexpr size_t kConvMaxWorkspaceBytes = size_t{1} << 30;

void check_pool_shape(const PoolShape& ps) {
  PoolShape expect = ps;
  DPT_CHECK(ps.n >= 0 && ps.c >= 0 && ps.kernel > 0 && ps.stride > 0 && ps.pad >= 0 && pool_output_size(expect) &&
                expect.p == ps.p && expect.q == ps.q,
            "pool shape n {} c {} h {} w {} kernel {} stride {} pad {} -> {}x{}", ps.n, ps.c, ps.h, ps.w, ps.kernel,
            ps.stride, ps.pad, ps.p, ps.q);
  DPT_CHECK(ps.h * ps.w <= std::numeric_limits<int32_t>::max(), "max pooling over {}x{}: the argmax is an int32",
            ps.h, ps.w);
}

void check_bn_shape(const BnShape& bs) {
  DPT_CHECK(bs.n >= 0 && bs.c >= 0 && bs.hw >= 1, "batch norm shape n {} c {} hw {}", bs.n, bs.c, bs.hw);
  DPT_CHECK(bs.c <= std::numeric_limits<int>::max(), "batch norm over {} channels: more than a grid holds", bs.c);
}

#if DPT_HAVE_CUDNN
// The precision's name, for messages.
const char* precision_name(Precision p) {
  return p == Precision::BF16 ? "bf16" : p == Precision::F16 ? "fp16" : "fp32";
}

// The cuDNN type of x, w and y under `p` (the convolution itself always computes in float32).
cudnnDataType_t cudnn_type(Precision p) {
  return p == Precision::BF16 ? CUDNN_DATA_BFLOAT16 : p == Precision::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

// The cuDNN descriptors of one (ConvShape, Precision), and the algorithm of each direction, chosen the first time
// that direction runs. cuDNN's heuristics choose (cudnnGet*_v7), not timing (cudnnFind*): the choice then depends
// only on the shape, the precision and the GPU, so two runs, or two ranks, make the same one and get the same
// bits. Only deterministic algorithms qualify. In FP32, none that needs TF32 tensor cores (kConvAllowTf32); in
// BF16 / F16, x, w and y are 16-bit (PSEUDO_BFLOAT16 / PSEUDO_HALF: float32 compute type) and tensor cores are
// welcome (they multiply the 16-bit operands exactly and accumulate in float32).
class ConvPlan {
 public:
  ConvPlan(const ConvShape& cs, Precision precision) : precision_(precision) {
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(cs.n * cs.c * cs.h * cs.w <= kMax && cs.n * cs.k * cs.p * cs.q <= kMax &&
                  cs.k * cs.c * cs.r * cs.s <= kMax,
              "convolution tensors over 2^31 elements (cuDNN's int range)");
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    DPT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    DPT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    DPT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    const cudnnDataType_t type = cudnn_type(precision);
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, type, i(cs.n), i(cs.c), i(cs.h), i(cs.w)));
    DPT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NCHW, type, i(cs.n), i(cs.k), i(cs.p), i(cs.q)));
    DPT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, type, CUDNN_TENSOR_NCHW, i(cs.k), i(cs.c), i(cs.r), i(cs.s)));
    // Cross-correlation (no kernel flip), as PyTorch's Conv2d and the CPU set; float32 arithmetic in every precision.
    DPT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, i(cs.pad), i(cs.pad), i(cs.stride), i(cs.stride), 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    const cudnnMathType_t math = precision != Precision::F32 ? CUDNN_TENSOR_OP_MATH
                                 : kConvAllowTf32            ? CUDNN_DEFAULT_MATH
                                                             : CUDNN_FMA_MATH;
    DPT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, math));
    int n = 0, k = 0, p = 0, q = 0;
    DPT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &n, &k, &p, &q));
    DPT_CHECK(n == cs.n && k == cs.k && p == cs.p && q == cs.q, "cuDNN's output shape {}x{}x{}x{} is not {}x{}x{}x{}",
              n, k, p, q, cs.n, cs.k, cs.p, cs.q);
  }
  ~ConvPlan() {
    if (conv_) (void)cudnnDestroyConvolutionDescriptor(conv_);
    if (w_) (void)cudnnDestroyFilterDescriptor(w_);
    if (y_) (void)cudnnDestroyTensorDescriptor(y_);
    if (x_) (void)cudnnDestroyTensorDescriptor(x_);
  }
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  // The chosen algorithm and its workspace bytes, per direction.
  template <class Algo>
  struct Choice {
    Algo algo{};
    size_t workspace = 0;
  };

  const Choice<cudnnConvolutionFwdAlgo_t>& forward(cudnnHandle_t h) {
    if (!fwd_) {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, static_cast<int>(perf.size()),
                                                             &count, perf.data()));
      fwd_ = choose<cudnnConvolutionFwdAlgo_t>(perf.data(), count, "forward",
                                               [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
        return cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, a, b);
      });
    }
    return *fwd_;
  }
  const Choice<cudnnConvolutionBwdDataAlgo_t>& backward_data(cudnnHandle_t h) {
    if (!bwd_data_) {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, static_cast<int>(perf.size()),
                                                                  &count, perf.data()));
      bwd_data_ = choose<cudnnConvolutionBwdDataAlgo_t>(perf.data(), count, "backward data",
                                                        [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, a, b);
      });
    }
    return *bwd_data_;
  }
  const Choice<cudnnConvolutionBwdFilterAlgo_t>& backward_filter(cudnnHandle_t h) {
    if (!bwd_filter_) {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      int count = 0;
      DPT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, static_cast<int>(perf.size()),
                                                                    &count, perf.data()));
      bwd_filter_ = choose<cudnnConvolutionBwdFilterAlgo_t>(perf.data(), count, "backward filter",
                                                            [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, a, b);
      });
    }
    return *bwd_filter_;
  }

  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t y() const { return y_; }
  cudnnFilterDescriptor_t w() const { return w_; }
  cudnnConvolutionDescriptor_t conv() const { return conv_; }

 private:
  // Whether an algorithm's math type suits this plan's precision: in FP32 no tensor cores (they would mean TF32)
  // unless kConvAllowTf32; in BF16 / F16 tensor cores too, but no conversion of the operands to another type.
  bool math_allowed(cudnnMathType_t m) const {
    if (m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH) return true;
    return m == CUDNN_TENSOR_OP_MATH && (precision_ != Precision::F32 || kConvAllowTf32);
  }

  // The first algorithm in cuDNN's ranking that it supports here, that is deterministic, whose math type suits
  // the precision, and whose workspace (asked again for that algorithm) fits kConvMaxWorkspaceBytes.
  template <class Algo, class Perf, class WorkspaceFn>
  std::unique_ptr<Choice<Algo>> choose(const Perf* perf, int count, const char* what, WorkspaceFn workspace) const {
    for (int i = 0; i < count; ++i) {
      const Perf& pf = perf[i];
      if (pf.status != CUDNN_STATUS_SUCCESS || pf.determinism != CUDNN_DETERMINISTIC) continue;
      if (!math_allowed(pf.mathType)) continue;
      size_t bytes = 0;
      if (workspace(pf.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kConvMaxWorkspaceBytes) continue;
      return std::make_unique<Choice<Algo>>(Choice<Algo>{pf.algo, bytes});
    }
    DPT_THROW(UnsupportedError, "cuDNN offers no deterministic {} {} convolution algorithm for this shape "
              "(with at most {} MiB of workspace)", precision_name(precision_), what, kConvMaxWorkspaceBytes >> 20);
  }

  Precision precision_;

  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  std::unique_ptr<Choice<cudnnConvolutionFwdAlgo_t>> fwd_;
  std::unique_ptr<Choice<cudnnConvolutionBwdDataAlgo_t>> bwd_data_;
  std::unique_ptr<Choice<cudnnConvolutionBwdFilterAlgo_t>> bwd_filter_;
};

using ConvKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Precision>;
ConvKey conv_key(const ConvShape& cs, Precision p) {
  return {cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.s, cs.stride, cs.pad, p};
}
#endif

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
#if DPT_HAVE_CUDNN
    plans_.clear();  // descriptors before the handle
    if (cudnn_) (void)cudnnDestroy(cudnn_);
#endif
    if (handle_) (void)cublasDestroy(handle_);
  }

  Device device() const override { return Device::cuda(index_); }
  StreamHandle stream() const override { return stream_->get(); }

  // Per kernel set (the model sets it before each pass). cuBLAS's math mode follows: pedantic FP32 (no TF32) for
  // F32; for the 16-bit GEMMs the default mode (tensor cores, accumulation in float32 as CUBLAS_COMPUTE_32F asks),
  // since pedantic mode, which prescribes the arithmetic of every phase, may keep them off the tensor cores. A
  // call already queued keeps the mode it was queued with.
  void set_precision(Precision p) override {
    DPT_CHECK(p == Precision::F32 || p == Precision::BF16 || p == Precision::F16, "precision {}",
              static_cast<int>(p));
    if (p == precision_) return;
    DPT_CUBLAS_CHECK(cublasSetMathMode(
        handle_, p == Precision::F32 ? CUBLAS_PEDANTIC_MATH
                                     : static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                 CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    precision_ = p;
  }
  Precision precision() const override { return precision_; }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    DPT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape {}x{}x{}", M, N, K);
    if (M == 0 || N == 0) return;
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
              "gemm dimensions exceed cuBLAS's int range");
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    if (precision_ == Precision::F32 || K == 0) {  // K = 0: C = beta C, nothing to round
      DPT_CUBLAS_CHECK(cublasSgemm(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, B, i(ldb), A, i(lda), &beta, C,
                                   i(ldc)));
      return;
    }
    // op(A) is M x K, stored as (trans_a ? K x M : M x K) with row stride lda; likewise B. Rounded into packed
    // 16-bit copies, whose row strides are then their row lengths.
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const void* a16 = narrowed(A, a_rows, a_cols, lda, 0);
    const void* b16 = narrowed(B, b_rows, b_cols, ldb, 1);
    const cudaDataType_t type = precision_ == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    DPT_CUBLAS_CHECK(cublasGemmEx(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, b16, type, i(b_cols), a16, type,
                                  i(a_cols), &beta, C, CUDA_R_32F, i(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // One cuBLAS call for the whole batch, row-major to column-major as gemm (operands swapped, flags kept). The
  // strides are cuBLAS's own (long long): matrices may be interleaved (the heads within one row of q, k and v:
  // stride hs, row stride 3C), which is fine for the operands and for C as long as no two C matrices overlap.
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    DPT_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "gemm_strided_batched shape {}x{}x{}, batch {}", M, N, K,
              batch);
    DPT_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, "gemm_strided_batched strides {}, {}, {}", stride_a,
              stride_b, stride_c);
    if (M == 0 || N == 0 || batch == 0) return;
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    DPT_CHECK(M <= kMax && N <= kMax && K <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax && batch <= kMax,
              "gemm_strided_batched dimensions exceed cuBLAS's int range");
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto i = [](int64_t v) { return static_cast<int>(v); };
    const auto ll = [](int64_t v) { return static_cast<long long>(v); };
    if (precision_ == Precision::F32 || K == 0) {  // K = 0: C = beta C, nothing to round
      DPT_CUBLAS_CHECK(cublasSgemmStridedBatched(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, B, i(ldb),
                                                 ll(stride_b), A, i(lda), ll(stride_a), &beta, C, i(ldc),
                                                 ll(stride_c), i(batch)));
      return;
    }
    // Each operand matrix (stored a_rows x a_cols, row stride lda, stride_a apart, maybe interleaved with the
    // others) is rounded into a packed 16-bit copy: matrix m at m * a_rows * a_cols, row stride a_cols. Only the
    // elements the GEMMs read are converted.
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const void* a16 = narrowed_batched(A, batch, a_rows, a_cols, lda, stride_a, 0);
    const void* b16 = narrowed_batched(B, batch, b_rows, b_cols, ldb, stride_b, 1);
    const cudaDataType_t type = precision_ == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    DPT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_, op_b, op_a, i(N), i(M), i(K), &alpha, b16, type, i(b_cols),
                                                ll(b_rows * b_cols), a16, type, i(a_cols), ll(a_rows * a_cols), &beta,
                                                C, CUDA_R_32F, i(ldc), ll(stride_c), i(batch), CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT));
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
  void sum_squares_to(const float* x, size_t n, double* out) override {
    DPT_CUDA_CHECK(cuda_launch::sum_squares(x, n, partials_.data<double>(), out, stream()));
  }
  void clip_by_norm(float* x, size_t n, const double* ss, double max_norm) override {
    DPT_CUDA_CHECK(cuda_launch::clip_by_norm(x, n, ss, max_norm, stream()));
  }

  // ---- convolutional networks ---------------------------------------------------------------------------

#if DPT_HAVE_CUDNN
  // In BF16 / F16 the inputs go through conv_in (rounded into 16-bit scratch), the output through conv_out (16-bit
  // scratch) and conv_finish (widened into the caller's float32 buffer); in F32 cuDNN reads and writes the caller's
  // buffers directly. alpha and beta are float32 in every precision (float32 compute type).
  void conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) override {
    check_conv_shape(cs);
    if (cs.n == 0) return;
    ConvPlan& plan = plan_for(cs);
    const auto& ch = plan.forward(cudnn());
    void* ws = workspace(ch.workspace);
    const size_t nx = x_count(cs), nw = w_count(cs), ny = y_count(cs);
    const void* xin = conv_in(x, nx, 0);
    const void* win = conv_in(w, nw, 1);
    void* yout = conv_out(y, ny, 2);
    const float alpha = 1.0f, beta = 0.0f;  // beta 0: y is not read (it may hold NaN)
    DPT_CUDNN_CHECK(cudnnConvolutionForward(cudnn(), &alpha, plan.x(), xin, plan.w(), win, plan.conv(), ch.algo, ws,
                                            ch.workspace, &beta, plan.y(), yout));
    conv_finish(yout, y, ny, false);
  }
  void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) override {
    check_conv_shape(cs);
    if (cs.n == 0) return;
    ConvPlan& plan = plan_for(cs);
    const auto& ch = plan.backward_data(cudnn());
    void* ws = workspace(ch.workspace);
    const size_t nx = x_count(cs), nw = w_count(cs), ny = y_count(cs);
    const void* dyin = conv_in(dy, ny, 0);
    const void* win = conv_in(w, nw, 1);
    void* dxout = conv_out(dx, nx, 2);
    const float alpha = 1.0f, beta = 0.0f;  // dx overwritten
    DPT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn(), &alpha, plan.w(), win, plan.y(), dyin, plan.conv(), ch.algo,
                                                 ws, ch.workspace, &beta, plan.x(), dxout));
    conv_finish(dxout, dx, nx, false);
  }
  void conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) override {
    check_conv_shape(cs);
    if (cs.n == 0) return;  // nothing to accumulate
    ConvPlan& plan = plan_for(cs);
    const auto& ch = plan.backward_filter(cudnn());
    void* ws = workspace(ch.workspace);
    const size_t nx = x_count(cs), nw = w_count(cs), ny = y_count(cs);
    const void* xin = conv_in(x, nx, 0);
    const void* dyin = conv_in(dy, ny, 1);
    void* dwout = conv_out(dw, nw, 2);
    // dw accumulates: cuDNN adds into it (beta 1) in F32; in BF16 / F16 cuDNN overwrites the 16-bit scratch and
    // conv_finish adds that into dw in float32 (beta 1 would round dw itself to 16 bits).
    const float alpha = 1.0f, beta = precision_ == Precision::F32 ? 1.0f : 0.0f;
    DPT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn(), &alpha, plan.x(), xin, plan.y(), dyin, plan.conv(),
                                                   ch.algo, ws, ch.workspace, &beta, plan.w(), dwout));
    conv_finish(dwout, dw, nw, true);
  }
#else
  void conv2d_forward(const float*, const float*, float*, const ConvShape&) override { no_cudnn(); }
  void conv2d_backward_data(const float*, const float*, float*, const ConvShape&) override { no_cudnn(); }
  void conv2d_backward_weight(const float*, const float*, float*, const ConvShape&) override { no_cudnn(); }
#endif

  void bn_stats(const float* x, const BnShape& bs, double* sums) override {
    check_bn_shape(bs);
    DPT_CUDA_CHECK(cuda_launch::bn_stats(x, bs, bn_partials(bs), sums, stream()));
  }
  // A count of 0 in `sums` (an empty batch on every rank) gives NaN statistics here; the CPU set throws.
  void bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums, const BnShape& bs,
                        float eps, float momentum, float* running_mean, float* running_var, float* save_mean,
                        float* save_invstd, float* y) override {
    check_bn_shape(bs);
    DPT_CUDA_CHECK(cuda_launch::bn_forward_train(x, gamma, beta, sums, bs, eps, momentum, running_mean, running_var,
                                                 save_mean, save_invstd, y, bn_coef(bs), stream()));
  }
  void bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                       const float* running_var, const BnShape& bs, float eps, float* y) override {
    check_bn_shape(bs);
    DPT_CUDA_CHECK(cuda_launch::bn_forward_eval(x, gamma, beta, running_mean, running_var, bs, eps, y, bn_coef(bs),
                                                stream()));
  }
  void bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const BnShape& bs, double* sums, float* dgamma, float* dbeta) override {
    check_bn_shape(bs);
    DPT_CUDA_CHECK(cuda_launch::bn_backward_reduce(dy, x, save_mean, save_invstd, bs, bn_partials(bs), sums, dgamma,
                                                   dbeta, stream()));
  }
  void bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, const double* sums, const BnShape& bs, float* dx) override {
    check_bn_shape(bs);
    DPT_CUDA_CHECK(cuda_launch::bn_backward_data(dy, x, gamma, save_mean, save_invstd, sums, bs, dx, bn_coef(bs),
                                                 stream()));
  }

  void relu(const float* x, float* y, size_t n) override { DPT_CUDA_CHECK(cuda_launch::relu(x, y, n, stream())); }
  void add(const float* a, const float* b, float* y, size_t n, bool relu) override {
    DPT_CUDA_CHECK(cuda_launch::add(a, b, y, n, relu, stream()));
  }
  void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) override {
    check_pool_shape(ps);
    DPT_CUDA_CHECK(cuda_launch::maxpool2d_forward(x, y, argmax, ps, stream()));
  }
  void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) override {
    check_pool_shape(ps);
    DPT_CUDA_CHECK(cuda_launch::maxpool2d_backward(dy, argmax, dx, ps, stream()));
  }
  void avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) override {
    DPT_CHECK(rows >= 0 && hw >= 1, "average pooling of {} rows of {}", rows, hw);
    DPT_CUDA_CHECK(cuda_launch::avgpool_forward(x, y, rows, hw, stream()));
  }
  void avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) override {
    DPT_CHECK(rows >= 0 && hw >= 1, "average pooling of {} rows of {}", rows, hw);
    DPT_CUDA_CHECK(cuda_launch::avgpool_backward(dy, dx, rows, hw, stream()));
  }

  // ---- transformers (GPT) -----------------------------------------------------------------------------------
  // The kernels and their launch shapes are described in launch.h.

  // A token outside [0, vocab) cannot throw here (the tokens are on the device): its row of y becomes NaN.
  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows, int64_t T,
                         int64_t C, int64_t vocab) override {
    DPT_CHECK(rows >= 0 && T >= 1 && C >= 0 && vocab >= 0, "embedding of {} rows, T {}, C {}, vocab {}", rows, T, C,
              vocab);
    DPT_CUDA_CHECK(cuda_launch::embedding_forward(tokens, wte, wpe, y, rows, T, C, vocab, stream()));
  }
  // Deterministic (no atomics) and bit for bit the CPU set's sums. A token outside [0, vocab) adds nothing to
  // dwte (forward has already made its loss NaN).
  void embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows, int64_t T,
                          int64_t C, int64_t vocab) override {
    DPT_CHECK(rows >= 0 && T >= 1 && C >= 0, "embedding backward of {} rows, T {}, C {}", rows, T, C);
    DPT_CHECK(rows <= std::numeric_limits<int>::max(), "embedding backward over {} rows: the sort counts in int", rows);
    if (rows == 0 || C == 0) return;
    size_t bytes = 0;
    DPT_CUDA_CHECK(cuda_launch::embedding_backward_scratch_bytes(rows, bytes));
    if (emb_scratch_.bytes() < bytes) emb_scratch_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
    DPT_CUDA_CHECK(cuda_launch::embedding_backward(tokens, dy, dwte, dwpe, rows, T, C, vocab, emb_scratch_.raw(),
                                                   emb_scratch_.bytes(), stream()));
  }
  void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t C, float eps) override {
    check_row_shape(rows, C, "layernorm");
    DPT_CUDA_CHECK(cuda_launch::layernorm_forward(x, gamma, beta, y, mean, rstd, rows, C, eps, stream()));
  }
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C) override {
    check_row_shape(rows, C, "layernorm backward");
    if (rows == 0) return;  // nothing to accumulate, nothing to write
    const size_t count = cuda_launch::layernorm_partials_count(rows, C);
    if (ln_partials_.numel() < count) ln_partials_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F32, device());
    DPT_CUDA_CHECK(cuda_launch::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C,
                                                   ln_partials_.data<float>(), stream()));
  }
  void split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) override {
    DPT_CHECK(n >= 0 && T >= 1, "token windows: {} of {} + 1", n, T);
    DPT_CUDA_CHECK(cuda_launch::split_token_windows(windows, input, next, n, T, stream()));
  }
  void gelu_forward(const float* x, float* y, size_t n) override {
    DPT_CUDA_CHECK(cuda_launch::gelu_forward(x, y, n, stream()));
  }
  void gelu_backward(const float* x, const float* dy, float* dx, size_t n) override {
    DPT_CUDA_CHECK(cuda_launch::gelu_backward(x, dy, dx, n, stream()));
  }
  void causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) override {
    DPT_CHECK(rows >= 1 && rows <= cols, "causal softmax of {} x {} matrices: need 1 <= rows <= cols", rows, cols);
    DPT_CHECK(count >= 0, "causal softmax of {} matrices", count);
    check_row_shape(count * rows, cols, "causal softmax");
    DPT_CUDA_CHECK(cuda_launch::causal_softmax_forward(s, count, rows, cols, scale, stream()));
  }
  void causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) override {
    DPT_CHECK(count >= 0 && T >= 1, "causal softmax backward of {} matrices of {} x {}", count, T, T);
    check_row_shape(count * T, T, "causal softmax backward");
    DPT_CUDA_CHECK(cuda_launch::causal_softmax_backward(p, dp, count, T, scale, stream()));
  }

 private:
  // Scratch grown on demand and reused (the stream runs in order). Growing frees the old buffer with cudaFree,
  // which waits for the device: only ever at a new, larger shape.
  double* bn_partials(const BnShape& bs) {
    const size_t count = cuda_launch::bn_partials_count(bs);
    if (bn_partials_.numel() < count) bn_partials_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F64, device());
    return bn_partials_.data<double>();
  }
  // The row kernels (one warp per row) launch rows / kRowsPerBlock blocks: bounded by a grid's x.
  static void check_row_shape(int64_t rows, int64_t cols, const char* op) {
    DPT_CHECK(rows >= 0 && cols >= 1, "{} of {} rows of {}", op, rows, cols);
    DPT_CHECK(rows / cuda_launch::kRowsPerBlock < std::numeric_limits<int>::max(),
              "{} of {} rows: more blocks than a grid holds", op, rows);
  }
  float* bn_coef(const BnShape& bs) {
    const size_t count = cuda_launch::bn_coef_count(bs);
    if (bn_coef_.numel() < count) bn_coef_ = Tensor::empty({static_cast<int64_t>(count)}, DType::F32, device());
    return bn_coef_.data<float>();
  }

#if DPT_HAVE_CUDNN
  // The cuDNN handle, made on first use: loading cuDNN takes a while and a model without convolutions never
  // needs it.
  cudnnHandle_t cudnn() {
    if (!cudnn_) {
      cuda::set_device(index_);
      DPT_CUDNN_CHECK(cudnnCreate(&cudnn_));
      DPT_CUDNN_CHECK(cudnnSetStream(cudnn_, stream()));
    }
    return cudnn_;
  }
  // One plan per shape and precision seen (a run has a handful: each layer's, and the last, smaller batch's).
  ConvPlan& plan_for(const ConvShape& cs) {
    auto [it, added] = plans_.try_emplace(conv_key(cs, precision_));
    if (added) {
      try {
        it->second = std::make_unique<ConvPlan>(cs, precision_);
      } catch (...) {
        plans_.erase(it);
        throw;
      }
    }
    return *it->second;
  }
  // The convolutions' workspace, shared by all of them (the stream serialises them); nullptr for 0 bytes.
  void* workspace(size_t bytes) {
    if (bytes == 0) return nullptr;
    if (workspace_.bytes() < bytes) workspace_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
    return workspace_.raw();
  }
  static size_t x_count(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.c * cs.h * cs.w); }
  static size_t w_count(const ConvShape& cs) { return static_cast<size_t>(cs.k * cs.c * cs.r * cs.s); }
  static size_t y_count(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.k * cs.p * cs.q); }
  // A convolution input as cuDNN reads it in this precision: `p` itself in F32, else its `count` values rounded
  // into 16-bit scratch `slot`.
  const void* conv_in(const float* p, size_t count, int slot) {
    if (precision_ == Precision::F32) return p;
    return narrowed(p, 1, static_cast<int64_t>(count), static_cast<int64_t>(count), slot);
  }
  // Where cuDNN writes a convolution output: `p` itself in F32, else 16-bit scratch `slot` of `count` values.
  void* conv_out(float* p, size_t count, int slot) {
    if (precision_ == Precision::F32) return p;
    return narrow_scratch(slot, count);
  }
  // The 16-bit output widened into `p` (added to it when accumulate); nothing in F32 (cuDNN wrote `p`).
  void conv_finish(const void* out, float* p, size_t count, bool accumulate) {
    if (precision_ == Precision::F32) return;
    DPT_CUDA_CHECK(cuda_launch::widen(out, p, count, precision_, accumulate, stream()));
  }
#else
  [[noreturn]] static void no_cudnn() {
    DPT_THROW(UnsupportedError, "convolutions on the GPU need cuDNN 9, which this dptrain was built without "
              "(cudnn.h / libcudnn not found by CMake, or DPT_WITH_CUDNN=OFF)");
  }
#endif

  // 16-bit scratch `slot` (0 to 2: the operands of one gemm or convolution, and a convolution's output) with room
  // for `count` values, grown on demand like the rest (never per call). The stream's order makes reusing a slot
  // from one call to the next safe.
  void* narrow_scratch(int slot, size_t count) {
    Tensor& t = narrow_[static_cast<size_t>(slot)];
    const size_t bytes = count * cuda_launch::kNarrowBytes;
    if (t.bytes() < bytes) t = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device());
    return t.raw();
  }
  // `batch` matrices of rows x cols floats (row stride ld, matrix m at src + m * stride) rounded to this precision,
  // packed one after the other, in scratch `slot`.
  const void* narrowed_batched(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                               int64_t stride, int slot) {
    void* dst = narrow_scratch(slot, static_cast<size_t>(batch * rows * cols));
    DPT_CUDA_CHECK(cuda_launch::narrow_batched(src, batch, rows, cols, ld, stride, dst, precision_, stream()));
    return dst;
  }
  // The rows x cols floats at `src` (row stride ld) rounded to this precision, packed, in scratch `slot`.
  const void* narrowed(const float* src, int64_t rows, int64_t cols, int64_t ld, int slot) {
    void* dst = narrow_scratch(slot, static_cast<size_t>(rows * cols));
    DPT_CUDA_CHECK(cuda_launch::narrow(src, rows, cols, ld, dst, precision_, stream()));
    return dst;
  }

  int index_;
  std::unique_ptr<cuda::Stream> stream_;
  cublasHandle_t handle_ = nullptr;
  Precision precision_ = Precision::F32;
  Tensor partials_, rows_scratch_, bn_partials_, bn_coef_, ln_partials_, emb_scratch_;
  std::array<Tensor, 3> narrow_;
#if DPT_HAVE_CUDNN
  cudnnHandle_t cudnn_ = nullptr;
  std::map<ConvKey, std::unique_ptr<ConvPlan>> plans_;
  Tensor workspace_;
#endif
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(int index) { return std::make_unique<CudaKernels>(index); }

}  // namespace dpt::models
