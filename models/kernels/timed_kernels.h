// models/kernels/timed_kernels.h: TimedKernels, a Kernels that runs another set's operations and clocks each call:
// CUDA events on the set's stream around every call on a GPU (device time), the host's steady_clock on the CPU
// (whose kernels run before returning). What a step's time goes to, by operation and shape, without a profiler:
// `dpt-model-bench --kernel-steps N` runs N steps on a model switched to it (Model::set_kernels) after its timed
// steps, which run on the plain set. The results are the inner set's, bit for bit: it only adds clock reads.
//
// A row is a call of the set, which may launch several CUDA kernels (a matmul whose epilogue runs as kernels of our
// own) or none. On a GPU each call adds two event records on the stream, a few microseconds of host time each; while
// the GPU runs behind the host (a step of large kernels) they should cost it little, which the window will tell.
// Work that is not a call of the set (zeroing the gradients, the first forward's bf16 copy of the parameters,
// copies) and any idle GPU time add up in between_ms(): between calls, and, with begin_step(), from the step's start
// to its first call and from its last call to collect().
//
// Each call also counts its work (Work): the products' arithmetic and the bytes its operands must move at least.
// Against a device's peaks, a row's floor (floor_ms) is the least time its calls could take: the gap between a row's
// time and its floor says which operations sit far from the roofline, library calls (cuBLASLt, cuDNN) included,
// where ncu's section sees only our own kernels.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/kernels/kernels.h"

namespace dpt::cuda {
class Event;
}

namespace dpt::models {

// A call's work, the least it must do: `flops`, the products' arithmetic (a multiply-add 2 FLOPs; a causal
// attention's masked half and its backward's recomputation not counted; elementwise arithmetic not counted), and
// `bytes`, its operands in their dtypes each read once and its outputs each written once (an accumulated output read
// and written). `tensor`: the products run in bf16 or fp16 (their peak is the tensor cores'), else float32.
struct Work {
  double flops = 0, bytes = 0;
  bool tensor = false;
};
// The work of matmul_bf16 (aux: the BiasGelu pre-activation written) and of a causal attention's forward or backward
// (backward twice the forward's products: dQ, dK, dV and dP).
Work matmul_work(const MatmulShape& s, bool aux);
Work attention_work(const AttentionShape& s, bool backward);

class TimedKernels final : public Kernels {
 public:
  // Clocks `inner`'s calls; `inner` must outlive this.
  explicit TimedKernels(Kernels& inner);
  ~TimedKernels() override;
  TimedKernels(const TimedKernels&) = delete;
  TimedKernels& operator=(const TimedKernels&) = delete;

  // One operation and shape's totals over the collected steps.
  struct Row {
    std::string op;     // the Kernels method: "matmul_bf16"
    std::string shape;  // its sizes and variant: "M 16384 N 2304 K 768, bias, bf16"
    int64_t calls = 0;
    double ms = 0;
    double flops = 0, bytes = 0;  // Work summed over the calls
    bool tensor = false;
  };
  // The least time a row's calls could take on a device with these peaks (FLOP/s of its products' kind: the bf16
  // tensor-core peak for a `tensor` row; bytes/s of its memory): the larger of flops / peak and bytes / bandwidth.
  // Negative when not known: a peak of 0 that the row needs (the CPU; a float32 product's peak is not in the table).
  static double floor_ms(const Row& r, double tensor_peak_flops, double peak_bytes_per_s);
  // Marks the start of a step, before anything of it is enqueued (zeroing the gradients): its span then runs from
  // here to collect(). Without it, from the step's first call to its last.
  void begin_step();
  // Reads the clocks of the calls made since the last collect() (on a GPU: waits for the stream) and adds them
  // to the totals; call it after each step (a step's calls must fit the events kept: they grow as needed).
  void collect();
  // The totals, most time first.
  std::vector<Row> rows() const;
  // Each collected step's span (begin_step() to collect(), else its first call's start to its last call's end),
  // summed over them.
  double total_ms() const { return total_ms_; }
  // The part of total_ms() outside the calls: another kernel, a copy, or the GPU idle.
  double between_ms() const { return between_ms_; }
  size_t collections() const { return collections_; }
  // Forgets the totals (not the calls not yet collected).
  void reset();

  Device device() const override { return inner_.device(); }
  StreamHandle stream() const override { return inner_.stream(); }
  void set_precision(Precision p) override { inner_.set_precision(p); }
  Precision precision() const override { return inner_.precision(); }
  std::vector<std::string> library_choices() const override { return inner_.library_choices(); }
  std::vector<std::string> sweep_library_choices(int candidates, int reps,
                                                 std::optional<double> adopt_margin) override {
    return inner_.sweep_library_choices(candidates, reps, adopt_margin);
  }
  void set_autotune_bf16_grads(bool on) override { inner_.set_autotune_bf16_grads(on); }
  void set_deterministic(bool on) override { inner_.set_deterministic(on); }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override;
  void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) override;
  void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) override;
  void relu_backward(const float* y, const float* dy, float* dx, size_t n) override;
  void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                    double* stats) override;
  void count_targets(const int32_t* labels, int64_t n, double* out) override;
  void sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) override;
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) override;
  void scale(float* x, size_t n, float alpha) override;

  void conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) override;
  void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) override;
  void conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) override;
  void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                       const ConvShape& cs) override;
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
  void relu(const float* x, float* y, size_t n) override;
  void add(const float* a, const float* b, float* y, size_t n, bool relu) override;
  void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) override;
  void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) override;
  void avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) override;
  void avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) override;
  double sum_squares(const float* x, size_t n) override;
  void sum_squares_to(const float* x, size_t n, double* out) override;
  void clip_by_norm(float* x, size_t n, const double* ss, double max_norm) override;

  void split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T) override;
  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows, int64_t T,
                         int64_t C, int64_t vocab) override;
  void embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows, int64_t T,
                          int64_t C, int64_t vocab) override;
  void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t C, float eps) override;
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C) override;
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
  void rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                             BFloat16* dx, float* dgamma, int64_t rows, int64_t C, const BFloat16* residual,
                             bool accumulate) override;
  void swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n) override;
  void swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate,
                            BFloat16* dup, size_t n) override;
  void rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
                 int64_t head_dim, int64_t stride, bool inverse) override;
  void gelu_forward(const float* x, float* y, size_t n) override;
  void gelu_backward(const float* x, const float* dy, float* dx, size_t n) override;
  void causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale) override;
  void causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale) override;

  void matmul_bf16(const MatmulShape& s, const MatmulOperands& o) override;
  void attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s) override;
  void attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout, const float* stats,
                          BFloat16* dqkv, const AttentionShape& s) override;
  void classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld, float dscale,
                       double* stats) override;
  void adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                   const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges, const double* grad_ss,
                   double max_norm) override;
  void adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                          const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                          const double* grad_ss, double max_norm) override;
  void layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y, float* mean,
                              float* rstd, int64_t rows, int64_t C, float eps) override;
  using Kernels::layernorm_backward_bf16;
  void layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                               const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                               int64_t C, const BFloat16* residual, bool accumulate) override;
  void add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                  const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows, int64_t C,
                                  float eps) override;
  void add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n) override;
  void gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n) override;

 private:
  struct Call {
    const char* op;
    std::string shape;
    Work work;
    size_t start, end;  // clock marks
  };
  // Runs f() between two clock marks and keeps the call.
  template <class F>
  void timed(const char* op, std::string shape, Work work, F&& f);
  size_t mark();                             // a clock reading now (the stream's position on a GPU)
  double ms_between(size_t a, size_t b) const;  // from mark a to mark b; after collect()'s wait

  Kernels& inner_;
  bool cuda_ = false;
  std::vector<std::unique_ptr<cuda::Event>> events_;            // GPU: marks, reused after each collect()
  std::vector<std::chrono::steady_clock::time_point> times_;  // CPU: marks
  size_t marks_ = 0;
  bool step_begun_ = false;  // begin_step() since the last collect(): mark 0 is the step's start
  std::vector<Call> calls_;  // since the last collect()
  struct Total {
    int64_t calls = 0;
    double ms = 0;
    double flops = 0, bytes = 0;
    bool tensor = false;
  };
  std::map<std::pair<std::string, std::string>, Total> totals_;  // by (op, shape)
  double total_ms_ = 0, between_ms_ = 0;
  size_t collections_ = 0;
};

// A matmul's sizes and variant as TimedKernels names them ("M 16384 N 2304 K 768 A^T, bias, bf16 D").
std::string describe_matmul(const MatmulShape& s);

}  // namespace dpt::models
