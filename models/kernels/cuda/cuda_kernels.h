// models/kernels/cuda/cuda_kernels.h: CudaKernels: the Kernels interface on one GPU (DPT_WITH_CUDA builds only; made by
// kernels_for in models/kernels/factory.cpp). GEMMs go to cuBLAS and convolutions to cuDNN (when the build found it:
// DPT_HAVE_CUDNN), by default in strict FP32 (no TF32), so results match the CPU set within float rounding; the
// other operations launch the CUDA kernels of this folder's .cu files on this set's stream. Nothing here
// synchronises the host except sum_squares, whose result the caller wants on the host.
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
// The CUDA kernels (embedding, LayerNorm, GELU, causal softmax, batch norm, ...) reduce in a fixed order without
// atomics, so a rerun gives the same bits.
//
// One class, its members defined by operation family beside the kernels they launch: gemm.cpp, precision.cpp,
// elementwise.cpp, softmax.cpp, optimizer.cpp, reductions.cpp, conv.cpp, batchnorm.cpp, pool.cpp, embedding.cpp,
// layernorm.cpp, matmul.cpp, attention.cpp; cuda_kernels.cpp holds the stream and handles.
#pragma once

#include <cublas_v2.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "core/cuda.h"
#include "models/kernels/kernels.h"

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

namespace dpt::models {

#if DPT_HAVE_CUDNN
// A convolution's cuDNN descriptors and the algorithm of each direction (conv.cpp), one per shape, precision and
// determinism (set_deterministic).
class ConvPlan;
struct ConvPlanDeleter {
  void operator()(ConvPlan* plan) const;  // conv.cpp, where ConvPlan is complete
};
using ConvKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, Precision, bool>;
#endif

// cuBLASLt's handle, workspace and per-plan descriptors (matmul.cpp).
struct LtState;
struct LtEntry;
struct LtStateDeleter {
  void operator()(LtState* s) const;  // matmul.cpp, where LtState is complete
};
// cuDNN's fused-attention graphs, per shape (attention.cpp).
struct AttentionGraphs;
struct AttentionGraphsDeleter {
  void operator()(AttentionGraphs* g) const;  // attention.cpp
};

// Builds and validates the forward and backward attention graphs of shape s for compute capability `sm` (90: H100)
// without a device, as cuDNN's frontend can: empty when both validate, else the error. The CPU tests run it.
std::string validate_attention_graphs(const AttentionShape& s, int sm);

class CudaKernels final : public Kernels {
 public:
  // Sets device `index` current and makes this set's stream and cuBLAS handle; throws DeviceError when it cannot.
  explicit CudaKernels(int index);
  ~CudaKernels() override;

  Device device() const override { return Device::cuda(index_); }
  StreamHandle stream() const override { return stream_->get(); }
  void set_precision(Precision p) override;
  Precision precision() const override { return precision_; }
  void set_deterministic(bool on) override { deterministic_ = on; }
  bool deterministic() const { return deterministic_; }

  // gemm.cpp
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override;
  // elementwise.cpp
  void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) override;
  void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) override;
  void relu_backward(const float* y, const float* dy, float* dx, size_t n) override;
  void relu(const float* x, float* y, size_t n) override;
  void add(const float* a, const float* b, float* y, size_t n, bool relu) override;
  void scale(float* x, size_t n, float alpha) override;
  void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                       float eps) override;
  void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                        float* dgamma, int64_t rows, int64_t C) override;
  void swiglu_forward(const float* gate, const float* up, float* y, size_t n) override;
  void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup,
                       size_t n) override;
  void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
            int64_t head_dim, int64_t stride, bool inverse) override;
  void rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows, int64_t C,
                            float eps) override;
  void add_rmsnorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma, BFloat16* y,
                                float* rstd, int64_t rows, int64_t C, float eps) override;
  using Kernels::rmsnorm_backward_bf16;
  void rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd, BFloat16* dx,
                             float* dgamma, int64_t rows, int64_t C, const BFloat16* residual,
                             bool accumulate) override;
  void swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) override;
  void swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate, BFloat16* dup,
                            size_t n) override;
  void rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
                 int64_t head_dim, int64_t stride, bool inverse) override;
  void gelu_forward(const float* x, float* y, size_t n) override;
  void gelu_backward(const float* x, const float* dy, float* dx, size_t n) override;
  // softmax.cpp
  void count_targets(const int32_t* labels, int64_t n, double* out) override;
  void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                    double* stats) override;
  void causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) override;
  void causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) override;
  // optimizer.cpp
  void sgd_update(float* param, const float* grad, float* buf, size_t n, const SgdParams& p) override;
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) override;
  // reductions.cpp
  double sum_squares(const float* x, size_t n) override;
  void sum_squares_to(const float* x, size_t n, double* out) override;
  void clip_by_norm(float* x, size_t n, const double* ss, double max_norm) override;
  // conv.cpp
  void conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) override;
  void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) override;
  void conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) override;
  void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                       const ConvShape& cs) override;
  // batchnorm.cpp
  void bn_stats(const float* x, const BnShape& bs, double* sums) override;
  void bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums, const BnShape& bs,
                        float eps, float momentum, float* running_mean, float* running_var, float* save_mean,
                        float* save_invstd, float* y) override;
  void bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                       const float* running_var, const BnShape& bs, float eps, float* y) override;
  void bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                          const BnShape& bs, double* sums, float* dgamma, float* dbeta) override;
  void bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                        const float* save_invstd, const double* sums, const BnShape& bs, float* dx) override;
  // pool.cpp
  void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) override;
  void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) override;
  void avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) override;
  void avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) override;
  // embedding.cpp
  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows, int64_t T,
                         int64_t C, int64_t vocab) override;
  void embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows, int64_t T,
                          int64_t C, int64_t vocab) override;
  void split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) override;
  // layernorm.cpp
  void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t C, float eps) override;
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C) override;
  // The transformer fast path. matmul.cpp (cuBLASLt)
  void matmul_bf16(const MatmulShape& s, const MatmulOperands& o) override;
  // Whether matmul_bf16 asks cuBLASLt for its epilogues (the default) or always runs the plain product and then
  // matmul.cu's epilogue kernels (the fallback for shapes cuBLASLt has no epilogue algorithm for; the [gpu] tests
  // run both ways).
  void set_lt_epilogues(bool on) { lt_epilogues_ = on; }
  // Whether a weight gradient's bias gradient comes from cuBLASLt's BGRADB epilogue (the default) or from the plain
  // product (which cuBLASLt may split along K) and then matmul.cu's deterministic column sums, as llm.c computes it.
  // For the GPU window's A/B: DPT_TUNE_BGRAD=separate in the environment starts with false; the [gpu] tests run both.
  void set_lt_bgrad_fused(bool on) { lt_bgrad_fused_ = on; }
  // train.autotune_bf16_grads: the tuning sweep may switch a float32 weight gradient's product to torch.autocast's
  // way (its autocast twin into bf16 scratch, then widened: compare_bf16) where that is faster; false (the default)
  // also returns every plan switched so to its own product (the `apart` choices stay).
  void set_autotune_bf16_grads(bool on) override;
  // For the [gpu] tests: the plans made from now on split the heuristic's first algorithm along K into `splits`
  // parts where cuBLASLt accepts that (their library_choices line says "split-k N forced", or "refused"); 0 or 1:
  // the heuristic's as it is. The sweep's split-K variants (train.autotune may adopt one) are such algorithms.
  void set_lt_splitk(int splits);
  // How many algorithms the cuBLASLt sweep splits along K (the plan's own and the heuristic's next proposals; 3 by
  // default, 0: no split-K variants). The [gpu] sweep case takes 1, to stay short under compute-sanitizer.
  void set_lt_split_bases(size_t n) { lt_split_bases_ = n; }
  // The [gpu] attention sweep case's: the sweep also builds the plan each graph runs, in the graph of cuDNN's
  // proposals, as a candidate of its own, so that a margin adopting anything switches every graph to a plan index
  // (execute_plan_at_index, the path a real adoption takes) even where cuDNN proposes no other plan.
  void set_attention_sweep_self(bool on) { attention_sweep_self_ = on; }
  // One line per cuBLASLt plan made so far: its shape, and the algorithm cuBLASLt's heuristic chose (tile, split-K,
  // stages, waves), or what ran instead. For the benchmark's report: where a GEMM's time may go.
  std::vector<std::string> library_choices() const override;
  // Every cuBLASLt plan with an algorithm: its heuristic's first `candidates` algorithms timed on scratch operands of
  // the plan's layouts (the epilogue's bias and aux vectors scratch too: no buffer of a model is touched); each
  // bias-gradient plan also against its gradient apart (its plain twin, swept with the rest, then matmul.cu's column
  // sums: compare_apart); then every cuDNN attention graph: up to `candidates` of the plans cuDNN proposes for it, on
  // scratch likewise; then every convolution plan's directions (sweep_conv_plans: cuDNN has at most 8 algorithms a
  // direction, all timed).
  std::vector<std::string> sweep_library_choices(int candidates, int reps,
                                                 std::optional<double> adopt_margin) override;
  // Its part for the cuBLASLt plans alone, public for the [gpu] tests of the product plans: a test counting lines
  // would otherwise count the attention and convolution lines of the cases run before it in the same process.
  std::vector<std::string> sweep_lt_only(int candidates, int reps, std::optional<double> adopt_margin);
  // Its part for the attention graphs built so far (attention.cpp): each timed with up to `candidates` of the plans
  // cuDNN proposes on scratch operands, a line each ("cuDNN attention sweep ..."); with `margin`, the fastest
  // replaces the plan it runs where tune_adopts says so twice. Public for the [gpu] tests; `only` (theirs): the graphs
  // of these shapes alone (empty: every graph), since building a graph's plans may compile kernels.
  std::vector<std::string> sweep_attention_plans(int candidates, int reps, std::optional<double> margin,
                                                 std::span<const AttentionShape> only = {});
  // Its part for the convolution plans made so far (conv.cpp): each direction a plan has run timed against every
  // other algorithm of cuDNN's ranking the plan may run, on scratch operands, a line each ("cuDNN convolution sweep
  // ..."); with `margin`, the fastest replaces the one it runs where tune_adopts says so twice. `only` (the [gpu]
  // tests'): the plans of these shapes in the current precision and determinism alone (empty: every plan).
  std::vector<std::string> sweep_conv_plans(int reps, std::optional<double> margin,
                                            std::span<const ConvShape> only = {});
  // attention.cpp (cuDNN's fused flash attention through its frontend; DPT_HAVE_CUDNN_FRONTEND)
  void attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) override;
  void attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout, const float* stats,
                          BFloat16* dqkv, const AttentionShape& s) override;
  // softmax.cpp
  void classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld, float dscale,
                       double* stats) override;
  // optimizer.cpp
  void adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                   const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges, const double* grad_ss,
                   double max_norm) override;
  void adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                          const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                          const double* grad_ss, double max_norm) override;
  // layernorm.cpp, elementwise.cpp
  void add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                  const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows, int64_t C,
                                  float eps) override;
  void layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y, float* mean,
                              float* rstd, int64_t rows, int64_t C, float eps) override;
  using Kernels::layernorm_backward_bf16;
  void layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                               const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                               int64_t C, const BFloat16* residual, bool accumulate) override;
  void add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) override;
  void gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) override;

 private:
  static void check_row_shape(int64_t rows, int64_t cols, const char* op);
  // layernorm.cpp
  float* ln_partials(int64_t rows, int64_t C);
  // batchnorm.cpp
  double* bn_partials(const BnShape& bs);
  float* bn_coef(const BnShape& bs);
  // precision.cpp
  void* narrow_scratch(int slot, size_t count);
  const void* narrowed_batched(const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                               int64_t stride, int slot);
  const void* narrowed(const float* src, int64_t rows, int64_t cols, int64_t ld, int slot);
  // attention.cpp
  AttentionGraphs& attention_graphs();
  std::vector<std::string> attention_choices() const;  // the plan cuDNN chose per graph built, for library_choices
  // matmul.cpp: the cuBLASLt plans' part, into `out`; false when a sticky CUDA error stopped it.
  bool sweep_lt_plans(int candidates, int reps, std::optional<double> adopt_margin, std::vector<std::string>& out);
  // matmul.cpp
  LtState& lt();
  // `weight_grad`: a weight gradient's product (float32 D), which train.autotune_bf16_grads may run via bf16.
  void matmul_bf16_plain(const MatmulShape& s, const MatmulOperands& o, bool weight_grad = false);
  void matmul_unfused(const MatmulShape& s, const MatmulOperands& o);
  void matmul_via_bf16(const MatmulShape& s, const MatmulOperands& o, LtEntry& e);
  void bias_grad_columns(const MatmulShape& s, const MatmulOperands& o);
#if DPT_HAVE_CUDNN
  // conv.cpp
  cudnnHandle_t cudnn();
  ConvPlan& plan_for(const ConvShape& cs);
  void* workspace(size_t bytes);
  // A convolution operand as `batch` matrices of rows x cols floats (NCHW: N, C, H*W; KCRS: K, C, R*S); with
  // nhwc_rows > 0 (an NHWC plan's), the 16-bit copies are each matrix transposed (NHWC, KRSC), its rows zero-padded
  // to nhwc_rows.
  const void* conv_in(const float* p, int64_t batch, int64_t rows, int64_t cols, int64_t nhwc_rows, int slot);
  void* conv_out(float* p, size_t count, int slot);
  // One direction on operands already in cuDNN's type and layout (conv_in), the output through conv_out/conv_finish.
  void run_backward_filter(ConvPlan& plan, const void* xin, const void* dyin, float* dw, const ConvShape& cs);
  void run_backward_data(ConvPlan& plan, const void* dyin, const void* win, float* dx, const ConvShape& cs);
  void conv_finish(const void* out, float* p, int64_t batch, int64_t rows, int64_t cols, int64_t nhwc_rows,
                   bool accumulate);
#else
  [[noreturn]] static void no_cudnn();
#endif

  int index_;
  std::unique_ptr<cuda::Stream> stream_;
  cublasHandle_t handle_ = nullptr;
  Precision precision_ = Precision::F32;
  Tensor partials_, rows_scratch_, bn_partials_, bn_coef_, ln_partials_, emb_scratch_;
  std::array<Tensor, 3> narrow_;
  std::unique_ptr<LtState, LtStateDeleter> lt_;
  bool lt_epilogues_ = true;
  bool deterministic_ = true;
  bool lt_bgrad_fused_ = true;
  bool lt_wgrad_bf16_ = false;  // set_autotune_bf16_grads
  size_t lt_split_bases_ = 3;
  bool attention_sweep_self_ = false;
  Tensor lt_bias_scratch_, lt_acc_scratch_, lt_wgrad16_scratch_;
  std::unique_ptr<AttentionGraphs, AttentionGraphsDeleter> attention_;
#if DPT_HAVE_CUDNN
  cudnnHandle_t cudnn_ = nullptr;
  std::map<ConvKey, std::unique_ptr<ConvPlan, ConvPlanDeleter>> plans_;
  Tensor workspace_;
#endif
};

}  // namespace dpt::models
