// models/kernels/kernels.h: the Kernels interface: every numeric operation the layers, the loss and the optimizers
// need, on raw device pointers. One model code path, two kernel sets: the CPU set (cpu/: OpenBLAS, oneDNN) and
// the CUDA set (cuda/: cuBLAS, cuDNN, .cu kernels), each one file per operation family. Layers never branch on
// the device; they call kernels_for(device) (factory.h). The defaults below (the operations a set may leave
// out, and gemm_strided_batched as a loop) are in kernels.cpp.
//
// Matrices are row-major. Counts are element counts, not bytes. Pointers point into memory of the kernel
// set's device. A CUDA kernel set runs everything on its stream(), asynchronously to the host; results
// that come back to the host (sum_squares) synchronise that stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/kernels/kernel_params.h"

namespace dpt::models {

namespace elementwise {
struct AdamWSteps;  // elementwise.h
}

// The pointers of a bf16 matmul (MatmulShape says which are used): A and B bf16; D bf16 or float32.
struct MatmulOperands {
  const BFloat16* a = nullptr;
  const BFloat16* b = nullptr;
  void* d = nullptr;
  const BFloat16* bias = nullptr;  // [N]: Bias, BiasGelu
  BFloat16* aux = nullptr;         // [M, N], row stride N: BiasGelu's pre-activation (null: not kept), DGelu's input
  float* bias_grad = nullptr;      // [M]: BiasGrad's, accumulated or overwritten as D (MatmulShape::accumulate)
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;
  // The stream every kernel of this set runs on (nullptr on the CPU, where kernels run before returning).
  virtual StreamHandle stream() const { return nullptr; }
  // The arithmetic of gemm and the convolutions from now on (the model sets it before each pass, as
  // torch.autocast). A set that cannot compute in `p` throws UnsupportedError saying so.
  virtual void set_precision(Precision p) {
    if (p != Precision::F32) DPT_THROW(UnsupportedError, "the {} kernel set computes in float32 only", device().str());
  }
  virtual Precision precision() const { return Precision::F32; }
  // What the vendor libraries chose for the shapes run so far (a GPU set's cuBLASLt algorithms), a line each, for a
  // benchmark's report; nothing on the CPU.
  virtual std::vector<std::string> library_choices() const { return {}; }
  // For a benchmark's report, after its steps: each library plan made so far run again on scratch operands with each
  // of the first `candidates` algorithms the library's heuristic proposes (`reps` timed calls each, after one untimed),
  // a line each: the chosen algorithm's time against the fastest's (a GPU set's cuBLASLt plans). Whether another
  // algorithm than the heuristic's first would pay. Nothing on the CPU; a plan that fails says so in its line.
  // adopt_margin (train.autotune and dpt-model-bench --lt-tune give kTuneMargin): a plan whose fastest candidate
  // beats the algorithm it runs by that fraction or more, timed twice, runs that candidate from then on (its line
  // says so; a plan whose epilogue pointers are less aligned than the sweep's scratch is not switched). A bias
  // gradient's plan is also timed against that gradient apart (the plain product, then the set's column sums) and
  // switched to whichever way is faster by the margin. Each
  // algorithm gives the same bits on every call, but which one wins may differ between runs. nullopt: report only; a
  // negative margin adopts the fastest candidate even when it is slower by up to that fraction (for tests).
  static constexpr double kTuneMargin = 0.03;
  virtual std::vector<std::string> sweep_library_choices(int candidates, int reps,
                                                         std::optional<double> adopt_margin) {
    return {};
  }
  // train.autotune_bf16_grads: whether a tuning sweep (an adopt_margin) may also switch a weight gradient's product
  // to torch.autocast's way (the product rounded to bf16, then added into the float32 gradient) where that is faster;
  // false also returns every product switched so to its own (a bias-gradient plan the sweep switched apart stays
  // apart, its plain product in float32 again). The bf16 products change the gradients' numerics: the product
  // rounded to bf16, and its split-K parts perhaps added in bf16, as cuBLAS may for torch.autocast. Nothing on the
  // CPU.
  virtual void set_autotune_bf16_grads(bool) {}
  // train.deterministic: whether a GPU set keeps to library algorithms that give the same bits on every run (the
  // default), or may also take faster ones that add in a varying order (cuDNN's attention backward and convolution
  // algorithms that use atomics). The CPU set is deterministic either way.
  virtual void set_deterministic(bool) {}

  // C[M,N] = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T; lda/ldb/ldc are row strides.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;
  // `batch` independent gemms: matrix i of A, B and C starts stride_a, stride_b, stride_c elements after
  // matrix i - 1's (cuBLAS's strided batched GEMM). This base loops over gemm().
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                    const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                    int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                    int64_t batch);
  // y[r, c] = x[r, c] + bias[c]; then max(., 0) when relu. x and y may alias.
  virtual void bias_act(const float* x, const float* bias, float* y, int64_t rows, int64_t cols, bool relu) = 0;
  // db[c] += sum_r dy[r, c]
  virtual void bias_grad_accumulate(const float* dy, float* db, int64_t rows, int64_t cols) = 0;
  // dx = dy * (y > 0); dx may alias dy.
  virtual void relu_backward(const float* y, const float* dy, float* dx, size_t n) = 0;
  // Mean softmax cross-entropy over `rows` examples of `cols` classes. Writes d(mean loss)/d(logits) to
  // dlogits when non-null. Accumulates into stats (2 doubles on the device): stats[0] += the summed (not
  // mean) loss, stats[1] += the number of argmax hits; so a step needs no host synchronisation. A label of
  // kIgnoreLabel (-1: a masked target, a prompt's token in fine-tuning) adds no loss and no hit and gets a zero
  // gradient (the mean still divides by `rows`). Any other label outside [0, cols) throws on the CPU; on the GPU
  // it makes that row's loss NaN.
  virtual void softmax_xent(const float* logits, const int32_t* labels, float* dlogits, int64_t rows, int64_t cols,
                            double* stats) = 0;
  // out[0] += the number of the n labels that are not kIgnoreLabel: the targets a loss counts (on the device, no
  // host synchronisation).
  virtual void count_targets(const int32_t* labels, int64_t n, double* out) = 0;
  // One optimizer update over n parameters.
  virtual void sgd_update(float* param, const float* grad, float* momentum_buf, size_t n, const SgdParams& p) = 0;
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, const AdamWParams& p) = 0;
  // x *= alpha
  virtual void scale(float* x, size_t n, float alpha) = 0;

  // ---- convolutional networks ---------------------------------------------------------------------------
  // Activations are NCHW, contiguous. Every "accumulates" below adds (+=) into its output (the parameter
  // gradients); every other output is overwritten.

  // y[n, k, p, q] = sum_{c, r, s} x[n, c, p*stride - pad + r, q*stride - pad + s] * w[k, c, r, s]
  virtual void conv2d_forward(const float* x, const float* w, float* y, const ConvShape& cs) = 0;
  // dx = d(loss)/dx given dy [n, k, p, q] (overwrites dx [n, c, h, w]).
  virtual void conv2d_backward_data(const float* dy, const float* w, float* dx, const ConvShape& cs) = 0;
  // dw [k, c, r, s] accumulates d(loss)/dw.
  virtual void conv2d_backward_weight(const float* dy, const float* x, float* dw, const ConvShape& cs) = 0;
  // Both backward directions of one convolution, as Conv2d's backward runs them: dw accumulates (backward weight),
  // then dx is overwritten (backward data) unless dx is null. A kernel set may share work between the two (the CUDA
  // set rounds dy into 16-bit scratch once in bf16 / fp16); by default, the two calls in that order.
  virtual void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                               const ConvShape& cs) {
    conv2d_backward_weight(dy, x, dw, cs);
    if (dx) conv2d_backward_data(dy, w, dx, cs);
  }

  // Batch normalisation, split where SyncBatchNorm all-reduces (as PyTorch's batch_norm_stats /
  // batch_norm_elemt / batch_norm_backward_reduce / batch_norm_backward_elemt), so BatchNorm and
  // SyncBatchNorm share every kernel. `sums` are doubles on the device, 2c + 1 of them.
  // Training forward, part 1: sums[ch] = sum of x, sums[c + ch] = sum of x^2 over (n, hw); sums[2c] = n*hw.
  virtual void bn_stats(const float* x, const BnShape& bs, double* sums) = 0;
  // Part 2, from the (possibly all-reduced) sums: mean and biased variance per channel; saves mean and
  // 1/sqrt(var + eps) for backward; y = (x - mean) * invstd * gamma + beta; running statistics move by
  // `momentum` toward the batch's mean and UNBIASED variance (PyTorch's rule).
  virtual void bn_forward_train(const float* x, const float* gamma, const float* beta, const double* sums,
                                const BnShape& bs, float eps, float momentum, float* running_mean,
                                float* running_var, float* save_mean, float* save_invstd, float* y) = 0;
  // Evaluation: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta.
  virtual void bn_forward_eval(const float* x, const float* gamma, const float* beta, const float* running_mean,
                               const float* running_var, const BnShape& bs, float eps, float* y) = 0;
  // Backward, part 1: sums[ch] = sum of dy, sums[c + ch] = sum of dy * (x - mean) * invstd, sums[2c] = n*hw;
  // dgamma accumulates the second, dbeta the first (this rank's own: DDP then averages them).
  virtual void bn_backward_reduce(const float* dy, const float* x, const float* save_mean, const float* save_invstd,
                                  const BnShape& bs, double* sums, float* dgamma, float* dbeta) = 0;
  // Part 2, from the (possibly all-reduced) sums, count = sums[2c]:
  // dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
  virtual void bn_backward_data(const float* dy, const float* x, const float* gamma, const float* save_mean,
                                const float* save_invstd, const double* sums, const BnShape& bs, float* dx) = 0;

  // y = max(x, 0); y may alias x.
  virtual void relu(const float* x, float* y, size_t n) = 0;
  // y = a + b, then max(., 0) when relu; y may alias a or b.
  virtual void add(const float* a, const float* b, float* y, size_t n, bool relu) = 0;
  // Max pooling; argmax[n, c, p, q] keeps the winning input position (h * w index) for backward.
  virtual void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& ps) = 0;
  // dx (overwritten, zero where no window took the maximum) from dy through argmax.
  virtual void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& ps) = 0;
  // Global average pooling (AdaptiveAvgPool2d to 1x1): y[i] = mean of x[i, 0..hw) for i < rows (= n*c).
  virtual void avgpool_forward(const float* x, float* y, int64_t rows, int64_t hw) = 0;
  // dx[i, j] = dy[i] / hw (overwritten).
  virtual void avgpool_backward(const float* dy, float* dx, int64_t rows, int64_t hw) = 0;
  // Sum of squares, accumulated in double; returned to the host (on the GPU: waits for the stream).
  virtual double sum_squares(const float* x, size_t n) = 0;
  // The same sum written to *out (one double on the device), with no host synchronisation.
  virtual void sum_squares_to(const float* x, size_t n, double* out) = 0;
  // Global-norm clipping from a sum of squares on the device (sum_squares_to's): x *= max_norm / (sqrt(*ss) +
  // 1e-6), computed in double, when that is below 1; else x is left as it is. No host synchronisation.
  virtual void clip_by_norm(float* x, size_t n, const double* ss, double max_norm) = 0;

  // ---- transformers (GPT) -------------------------------------------------------------------------------
  // Activations are [rows, C] with rows = B * T (row b * T + t). A kernel set without these throws
  // UnsupportedError naming the operation (both sets here have them).

  // Token windows [n, T + 1] (floats holding token ids, exact below 2^24) to the model's int32 input [n, T] (each
  // window's first T) and the next tokens [n * T] (its last T). A token stored as -(t + 1) (a masked target:
  // elementwise::masked_window_token) is t as an input and kIgnoreLabel as a target.
  virtual void split_token_windows(const float* windows, int32_t* input, int32_t* next, int64_t n, int64_t T);
  // y[r] = wte[tokens[r]] + wpe[r mod T], rows x C; a token outside [0, vocab) throws (CPU). wpe nullptr: no
  // position embedding (Llama's RoPE turns q and k instead), y[r] = wte[tokens[r]].
  virtual void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* y, int64_t rows,
                                 int64_t T, int64_t C, int64_t vocab);
  // dwte[tokens[r]] += dy[r]; dwpe[r mod T] += dy[r] (accumulates, in row order: deterministic). A token
  // outside [0, vocab) throws on the CPU and adds nothing to dwte on the GPU (forward made its loss NaN). dwpe
  // nullptr: no position embedding.
  virtual void embedding_backward(const int32_t* tokens, const float* dy, float* dwte, float* dwpe, int64_t rows,
                                  int64_t T, int64_t C, int64_t vocab);
  // LayerNorm over each row of C values (biased variance, as nn.LayerNorm): y = (x - mean) * rstd * gamma +
  // beta; saves mean and rstd = 1 / sqrt(var + eps) per row for backward.
  virtual void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                 float* rstd, int64_t rows, int64_t C, float eps);
  // dx overwritten; dgamma and dbeta accumulate.
  virtual void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                                  const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C);
  // ---- the Llama family's layers (issue 35) ----
  // RMSNorm over each row of C values (Llama's LlamaRMSNorm): y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps)
  // saved per row for backward. Row sums in double on the CPU.
  virtual void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t rows, int64_t C,
                               float eps);
  // dx = rstd * (dy * gamma - xhat * mean(dy * gamma * xhat)), xhat = x * rstd: overwritten; dgamma += dy * xhat.
  virtual void rmsnorm_backward(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                                float* dgamma, int64_t rows, int64_t C);
  // SwiGLU's product y = silu(gate) * up (y may alias gate or up), and its gradients dgate, dup (each may alias gate
  // or up: both inputs are read before either is written, element by element).
  virtual void swiglu_forward(const float* gate, const float* up, float* y, size_t n);
  virtual void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, float* dup, size_t n);
  // Rotary position embeddings (HF's rotate_half form), in place: in each of `rows` rows (row r at position
  // pos0 + r mod T; rows `stride` floats apart), `heads` heads of head_dim values from x, each pair (i, i + head_dim/2)
  // turned by the angle of its position and i: cos and sin are tables [positions, head_dim / 2] (rope_tables,
  // models/rope.h). inverse: turned back (backward: the gradient rotates by the opposite angle).
  virtual void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0, int64_t heads,
                    int64_t head_dim, int64_t stride, bool inverse);
  // The same three on bf16 activations (x, y, dy, dx, gate, up, dgate, dup; the Llama family's transformer fast path):
  // the float32 kernels' arithmetic on the widened values, each output rounded to bf16 once; gamma, rstd and dgamma
  // float32; rope_bf16 turns each pair in float32 and rounds both values.
  virtual void rmsnorm_forward_bf16(const BFloat16* x, const float* gamma, BFloat16* y, float* rstd, int64_t rows,
                                    int64_t C, float eps);
  // sum = bf16(a + b), then rmsnorm_forward_bf16 of sum: as add_layernorm_forward_bf16 (the default runs the two).
  virtual void add_rmsnorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                        BFloat16* y, float* rstd, int64_t rows, int64_t C, float eps);
  // residual (null: none): as layernorm_backward_bf16's, added to dx before its one rounding; it may alias dx.
  // dgamma accumulates, or with accumulate false is overwritten (layernorm_backward_bf16's).
  virtual void rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                                     BFloat16* dx, float* dgamma, int64_t rows, int64_t C, const BFloat16* residual,
                                     bool accumulate);
  void rmsnorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* rstd,
                             BFloat16* dx, float* dgamma, int64_t rows, int64_t C, const BFloat16* residual) {
    rmsnorm_backward_bf16(dy, x, gamma, rstd, dx, dgamma, rows, C, residual, true);
  }
  virtual void swiglu_forward_bf16(const BFloat16* gate, const BFloat16* up, BFloat16* y, size_t n);
  virtual void swiglu_backward_bf16(const BFloat16* gate, const BFloat16* up, const BFloat16* dy, BFloat16* dgate,
                                    BFloat16* dup, size_t n);
  virtual void rope_bf16(BFloat16* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t pos0,
                         int64_t heads, int64_t head_dim, int64_t stride, bool inverse);
  // GELU with the tanh approximation (GPT-2's, nn.GELU(approximate="tanh")); y may alias x, dx may alias dy.
  virtual void gelu_forward(const float* x, float* y, size_t n);
  virtual void gelu_backward(const float* x, const float* dy, float* dx, size_t n);
  // Causal softmax of `count` rows x cols score matrices (rows <= cols: the last `rows` positions of a
  // sequence of `cols`, as a KV cache's queries; square in training), in place: row i keeps columns
  // j <= i + cols - rows, softmax of scale * s[i, j] over them, and 0 after them.
  virtual void causal_softmax_forward(float* s, int64_t count, int64_t rows, int64_t cols, float scale);
  // From the softmax p and dp = d(loss)/dp, in place in dp: ds = scale * p * (dp - sum_j p * dp) per row, 0
  // above the diagonal.
  virtual void causal_softmax_backward(const float* p, float* dp, int64_t count, int64_t T, float scale);

  // ---- the transformer fast path: bf16 activations, float32 master weights and optimizer state ------------------
  // A kernel set without these throws UnsupportedError naming the operation. The CPU set has them as the
  // reference (plain loops and OpenBLAS on widened operands), the CUDA set through cuBLASLt, cuDNN's fused
  // attention (its frontend's graph API) and kernels of its own. Shapes and epilogues: kernel_params.h.

  // D = op(A) op(B) and the epilogue (MatmulShape, MatmulEpilogue). `o` holds the pointers the epilogue needs:
  // bias [N] (Bias, BiasGelu), aux [M, N] (BiasGelu; may be null), bias_grad [M] (BiasGrad; accumulated as D is).
  virtual void matmul_bf16(const MatmulShape& s, const MatmulOperands& o);
  // Causal self-attention (AttentionShape; grouped-query when s.n_kv_head < s.n_head): out [b, t, n_head, head_size] =
  // softmax(q k^T / sqrt(head_size) over the positions up to each query) v per sequence and query head (with its
  // key/value head), rounded to bf16; stats[b, h, i] = the float32 natural-log logsumexp of query i's scaled scores
  // (what backward needs instead of the [b, n_head, t, t] probabilities, which never exist).
  virtual void attention_forward(const BFloat16* qkv, BFloat16* out, float* stats, const AttentionShape& s);
  // From forward's qkv, out and stats and d(loss)/d(out): dqkv in qkv's layout (overwritten); a key/value head's
  // gradient sums its query heads'.
  virtual void attention_backward(const BFloat16* qkv, const BFloat16* out, const BFloat16* dout, const float* stats,
                                  BFloat16* dqkv, const AttentionShape& s);
  // The fused classifier over bf16 logits [rows, ld] of which the first `vocab` columns are the vocabulary (the rest
  // padding, never read): per row, loss = logsumexp(z) - z[label] in float32; stats[0] += the summed loss and
  // stats[1] += the argmax hits (softmax_xent's). Then, when dscale != 0, the logits are overwritten by their
  // gradient dscale * (softmax(z) - onehot(label)) rounded to bf16, the padding columns by 0: the float32
  // [rows, vocab] tensor never exists. A kIgnoreLabel row adds nothing and its gradient is 0 (softmax_xent's); any
  // other label outside [0, vocab) throws on the CPU and makes the row's loss and gradient NaN on the GPU.
  virtual void classifier_bf16(BFloat16* logits, const int32_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                               float dscale, double* stats);
  // AdamW over n parameters in one pass (one launch on a GPU): each gradient first multiplied by clip_by_norm's
  // factor when grad_ss is non-null and that factor is below 1; weight decay p.weight_decay for the elements in
  // the ranges [decay_edges[2i], decay_edges[2i + 1]) and 0 elsewhere (decay_edges null: every element decays);
  // and, when param16 is non-null, param16 = bf16(param) after the update (the copy the bf16 matmuls read). The
  // same arithmetic as clip_by_norm then adamw_update run by run: the same bits.
  virtual void adamw_fused(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                           const AdamWParams& p, const uint64_t* decay_edges, size_t n_edges, const double* grad_ss,
                           double max_norm);
  // adamw_fused with its per-step constants read from the kernel set's memory when the update runs, not passed by
  // value: `steps` (device memory on a GPU) holds elementwise::adamw_steps(p) for the step, which the host writes there
  // before the work runs (trainer::Optimizer::stage), so that a CUDA graph that captured this call replays the next
  // step's learning rate and bias corrections. The same arithmetic on the same constants: the same bits.
  virtual void adamw_fused_staged(float* param, BFloat16* param16, const float* grad, float* m, float* v, size_t n,
                                  const elementwise::AdamWSteps* steps, const uint64_t* decay_edges, size_t n_edges,
                                  const double* grad_ss, double max_norm);
  // LayerNorm on bf16 activations (x, y, dy, dx): layernorm_forward / layernorm_backward's arithmetic on the widened
  // values, each output rounded once; gamma, beta, mean, rstd and the parameter gradients float32. The backward's
  // `residual` (null: none): the gradient of a residual stream around the norm, added to dx in float32 before its one
  // rounding (dx = bf16(dx + residual), the block's separate add_bf16 fused away); it may alias dx (or dy).
  virtual void layernorm_forward_bf16(const BFloat16* x, const float* gamma, const float* beta, BFloat16* y,
                                      float* mean, float* rstd, int64_t rows, int64_t C, float eps);
  // dgamma and dbeta accumulate (+=) with `accumulate`, else are overwritten: a step's first backward after
  // Model::zero_grad left the gradients as they were (Module::set_fresh_grads). The 11-argument call accumulates.
  virtual void layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                                       const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows,
                                       int64_t C, const BFloat16* residual, bool accumulate);
  void layernorm_backward_bf16(const BFloat16* dy, const BFloat16* x, const float* gamma, const float* mean,
                               const float* rstd, BFloat16* dx, float* dgamma, float* dbeta, int64_t rows, int64_t C,
                               const BFloat16* residual) {
    layernorm_backward_bf16(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, C, residual, true);
  }
  // sum = bf16(a + b) (add_bf16's), then layernorm_forward_bf16 of sum: the residual stream's add and the norm after
  // it, in one pass where a kernel set fuses them (the CUDA set's rows held in registers), the same bits either way.
  // sum may alias a or b. The default runs the two calls.
  virtual void add_layernorm_forward_bf16(const BFloat16* a, const BFloat16* b, BFloat16* sum, const float* gamma,
                                          const float* beta, BFloat16* y, float* mean, float* rstd, int64_t rows,
                                          int64_t C, float eps);
  // y = bf16(a + b): the residual stream. y may alias a or b.
  virtual void add_bf16(const BFloat16* a, const BFloat16* b, BFloat16* y, size_t n);
  // dx = bf16(dy * gelu'(pre)), pre the pre-activation matmul_bf16's BiasGelu kept (aux). dx may alias dy.
  virtual void gelu_backward_bf16(const BFloat16* pre, const BFloat16* dy, BFloat16* dx, size_t n);
};

// The checks both kernel sets run before a fast-path operation: sizes, strides, and which pointers the epilogue
// needs; ConfigError-free DPT_CHECK failures (a caller's bug).
void check_matmul(const MatmulShape& s, const MatmulOperands& o);
void check_attention(const AttentionShape& s);

// Checks a ConvShape before either kernel set uses it: positive sizes, and p, q as conv_output_size gives.
void check_conv_shape(const ConvShape& cs);

}  // namespace dpt::models
